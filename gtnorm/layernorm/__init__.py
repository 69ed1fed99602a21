"""LayerNorm: the per-row ``@triton.jit`` helpers (``math``) that the graph-transformer kernels apply to Q and K.
No standalone LayerNorm kernel: torch.compile'd ``F.layer_norm`` and Liger already serve that (issue 12)."""
