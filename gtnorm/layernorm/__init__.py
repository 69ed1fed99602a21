"""LayerNorm: the per-row ``@triton.jit`` helpers (``math``) that the graph-transformer kernels apply to Q and K, and
row kernels (``kernels``, launched by ``rows``) for work torch.compile cannot see: the mapper MLP's parts inside
their op (gtnorm/anemoi/mlp_parts.py), where they replace torch's eager LayerNorm with its fp32 copies (v30).
No public LayerNorm op: against torch.compile'd ``F.layer_norm`` a Triton one did not earn its place
(benchmarks/NOTES.md, v7; the retired benchmarks/layernorm_bench.py is in git's history)."""
