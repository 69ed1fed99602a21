"""Standalone RMSNorm in Triton (forward + backward), shaped like torch.nn.functional.rms_norm and
torch.nn.RMSNorm (also exported as ``gtnorm.rms_norm`` / ``gtnorm.RMSNorm``). ``math`` holds the per-row
@triton.jit helpers that the graph-transformer kernels share.

Imported on first use (gtnorm/_lazy.py), so ``TRITON_INTERPRET`` may still be set after importing this package.
"""

from typing import TYPE_CHECKING

from gtnorm._lazy import lazy_exports

if TYPE_CHECKING:
    from gtnorm.rmsnorm.functional import rms_norm
    from gtnorm.rmsnorm.module import RMSNorm

_EXPORTS = {
    "rms_norm": "gtnorm.rmsnorm.functional",
    "RMSNorm": "gtnorm.rmsnorm.module",
}

__all__ = ["RMSNorm", "rms_norm"]
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
