"""PyTorch modules: the PyG-compatible GraphTransformerConv (conv.py) and its PyG reference (reference.py).

Imported on first use (gtnorm/_lazy.py), so ``TRITON_INTERPRET`` may still be set after importing this package.
"""

from typing import TYPE_CHECKING

from gtnorm._lazy import lazy_exports

if TYPE_CHECKING:
    from gtnorm.nn.conv import GraphTransformerConv
    from gtnorm.nn.reference import reference_graph_transformer_attention

_EXPORTS = {
    "GraphTransformerConv": "gtnorm.nn.conv",
    "reference_graph_transformer_attention": "gtnorm.nn.reference",
}

__all__ = ["GraphTransformerConv", "reference_graph_transformer_attention"]
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
