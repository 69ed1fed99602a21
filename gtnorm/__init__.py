"""gtnorm: graph-transformer attention with RMSNorm on Q and K fused into the Triton kernels.

Submodules are imported on first use, so that ``TRITON_INTERPRET`` may still be set after ``import gtnorm``
(the interpreter is chosen when the kernels are first defined).
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "rms_norm": "gtnorm.rmsnorm.functional",
    "RMSNorm": "gtnorm.rmsnorm.module",
    "GraphLayout": "gtnorm.triton.layout",
    "graph_transformer_attention": "gtnorm.triton.attention",
    "GraphTransformerConv": "gtnorm.nn.conv",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gtnorm' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
