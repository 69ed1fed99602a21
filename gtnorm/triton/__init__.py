"""The graph-transformer attention kernels (forward, backward) with the QK norm (RMSNorm or LayerNorm) fused into
the Q/K loads.

``graph_transformer_attention`` (attention.py) is the public op, ``GraphLayout`` (layout.py) the per-graph index
structure it runs on. Imported on first use (gtnorm/_lazy.py), so ``TRITON_INTERPRET`` may still be set after
importing this package.
"""

from typing import TYPE_CHECKING

from gtnorm._lazy import lazy_exports

if TYPE_CHECKING:
    from gtnorm.triton.attention import graph_transformer_attention
    from gtnorm.triton.layout import GraphLayout

_EXPORTS = {
    "graph_transformer_attention": "gtnorm.triton.attention",
    "GraphLayout": "gtnorm.triton.layout",
}

__all__ = ["GraphLayout", "graph_transformer_attention"]
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
