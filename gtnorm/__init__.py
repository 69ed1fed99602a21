"""gtnorm: graph-transformer attention with the QK norm (RMSNorm or LayerNorm) fused into the Triton kernels.

Public names are imported from their modules on first use (gtnorm/_lazy.py), so that ``TRITON_INTERPRET`` may
still be set after ``import gtnorm``: Triton picks interpreter or compiled when the kernels are first defined.
"""

from typing import TYPE_CHECKING

from gtnorm._lazy import lazy_exports

__version__ = "0.1.0"

if TYPE_CHECKING:
    from gtnorm.nn.conv import GraphTransformerConv
    from gtnorm.rmsnorm.functional import rms_norm
    from gtnorm.rmsnorm.module import RMSNorm
    from gtnorm.triton.attention import graph_transformer_attention
    from gtnorm.triton.layout import GraphLayout

_EXPORTS = {
    "rms_norm": "gtnorm.rmsnorm.functional",
    "RMSNorm": "gtnorm.rmsnorm.module",
    "GraphLayout": "gtnorm.triton.layout",
    "graph_transformer_attention": "gtnorm.triton.attention",
    "GraphTransformerConv": "gtnorm.nn.conv",
}

__all__ = ["GraphLayout", "GraphTransformerConv", "RMSNorm", "graph_transformer_attention", "rms_norm"]
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
