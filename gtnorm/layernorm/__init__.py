"""LayerNorm in Triton: the per-row ``@triton.jit`` helpers (``math``) that the graph-transformer kernels apply to
Q and K, and a standalone LayerNorm (forward + backward) shaped like torch.nn.functional.layer_norm and
torch.nn.LayerNorm (``gtnorm.layer_norm`` / ``gtnorm.LayerNorm``).

Imported on first use (gtnorm/_lazy.py), so ``TRITON_INTERPRET`` may still be set after importing this package.
"""

from typing import TYPE_CHECKING

from gtnorm._lazy import lazy_exports

if TYPE_CHECKING:
    from gtnorm.layernorm.functional import layer_norm
    from gtnorm.layernorm.module import LayerNorm

_EXPORTS = {
    "layer_norm": "gtnorm.layernorm.functional",
    "LayerNorm": "gtnorm.layernorm.module",
}

__all__ = ["LayerNorm", "layer_norm"]
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
