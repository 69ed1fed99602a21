"""The caller's Q/K norm modules as GraphTransformerConv sees them: which ones the kernels can run fused (and
with which parameters), and how the PyG path applies them with torch's own math.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from gtnorm.rmsnorm.module import RMSNorm


@dataclass(frozen=True)
class FusedNorm:
    """A norm module the attention kernels apply themselves, reduced to what they take."""

    kind: str  # "rms" or "layer" (graph_transformer_attention's qk_norm)
    weight: Tensor | None  # [C]
    bias: Tensor | None  # [C], LayerNorm only
    eps: float | None  # None: torch's default for the kind and dtype


def fusable_norm(module: torch.nn.Module, channels: int) -> FusedNorm | str:
    """The module as a FusedNorm, or a sentence saying why the kernels cannot run it.

    Recognised: torch.nn.RMSNorm (gtnorm.RMSNorm is one) and torch.nn.LayerNorm, subclasses included (e.g.
    Anemoi's AutocastLayerNorm, which only casts the output back to the input's dtype), normalising the last
    axis only (normalized_shape == (C,)), with or without affine weight and bias. A subclass is trusted to
    compute its base class's function. A negative eps is a ValueError here, whichever path runs.
    """
    if isinstance(module, torch.nn.LayerNorm):
        kind = "layer"
    elif isinstance(module, torch.nn.RMSNorm):
        kind = "rms"
    else:
        return f"{type(module).__name__} is neither torch.nn.RMSNorm nor torch.nn.LayerNorm (nor a subclass)"
    check_norm_eps(module)
    if tuple(module.normalized_shape) != (channels,):
        return f"its normalized_shape is {tuple(module.normalized_shape)}, not ({channels},) (channels per head)"
    return FusedNorm(kind, module.weight, getattr(module, "bias", None), module.eps)


def check_norm_eps(module: torch.nn.Module) -> None:
    eps = getattr(module, "eps", None)
    if isinstance(module, torch.nn.LayerNorm | torch.nn.RMSNorm) and eps is not None and not eps >= 0.0:
        raise ValueError(f"{type(module).__name__} eps must be non-negative, got {eps}")


def apply_with_torch(module: torch.nn.Module, x: Tensor) -> Tensor:
    """The module applied as its owner wrote it, except gtnorm.RMSNorm, whose forward would run the Triton
    kernels where they can run: torch's own RMSNorm with its parameters instead (the PyG path is the reference).
    """
    check_norm_eps(module)
    # 16-bit inputs with float32 parameters (as under autocast): torch's CUDA LayerNorm refuses the mix outside
    # autocast, so the input is widened first, as the fused kernels compute in float32 too.
    dtype = functools.reduce(torch.promote_types, [p.dtype for p in module.parameters()], x.dtype)
    x = x.to(dtype)
    if isinstance(module, RMSNorm):
        return F.rms_norm(x, module.normalized_shape, module.weight, module.eps)
    return module(x)
