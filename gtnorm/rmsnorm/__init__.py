"""Standalone RMSNorm in Triton (forward + backward), shaped like torch.nn.functional.rms_norm and
torch.nn.RMSNorm. ``math`` holds the per-row @triton.jit helpers that the graph-transformer kernels share.

``rms_norm`` and ``RMSNorm`` are imported on first use, so that ``TRITON_INTERPRET`` may still be set after
importing this package (the interpreter is chosen when the kernels are first defined).
"""

from importlib import import_module

_EXPORTS = {
    "rms_norm": "gtnorm.rmsnorm.functional",
    "RMSNorm": "gtnorm.rmsnorm.module",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gtnorm.rmsnorm' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
