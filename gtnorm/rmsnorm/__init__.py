"""Standalone RMSNorm in Triton (forward + backward), shaped like torch.nn.functional.rms_norm and
torch.nn.RMSNorm (exported as ``gtnorm.rms_norm`` / ``gtnorm.RMSNorm``). ``math`` holds the per-row
@triton.jit helpers that the graph-transformer kernels share.
"""
