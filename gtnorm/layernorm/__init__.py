"""LayerNorm: the per-row ``@triton.jit`` helpers (``math``) that the graph-transformer kernels apply to Q and K.
No standalone LayerNorm kernel: a Triton one was measured against torch.compile'd ``F.layer_norm`` and did not
earn its place (benchmarks/NOTES.md, v7; the retired benchmarks/layernorm_bench.py is in git's history)."""
