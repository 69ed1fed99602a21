"""``rms_norm``: the public functional RMSNorm, its input checks, and the kernels as ``torch.library`` custom
ops (fake impls + autograd), so torch.compile traces through them.

The ops see a [n_rows, C] view of the input (C = prod(normalized_shape)) and a flat [C] weight; the public
function reshapes around them, so autograd of the reshapes is torch's own.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from gtnorm._runtime import check_dtype, check_triton_device, device_guard, new_output, resolve_eps
from gtnorm.rmsnorm.config import MAX_FUSED_COLS, rms_norm_launch_config
from gtnorm.rmsnorm.kernels import rms_norm_backward_kernel, rms_norm_forward_kernel


@torch.library.custom_op("gtnorm::rms_norm_forward", mutates_args=())
def rms_norm_forward_op(
    x: Tensor,  # [n_rows, C]
    weight: Tensor | None,  # [C]
    eps: float,
) -> tuple[Tensor, Tensor]:
    """Returns (y [n_rows, C] in x's dtype, rstd [n_rows] fp32)."""
    x = x.contiguous()
    n_rows, n_cols = x.shape
    y = new_output(x.shape, x.dtype, x.device)
    rstd = new_output((n_rows,), torch.float32, x.device)
    if x.numel() == 0:
        return y, rstd
    cfg = rms_norm_launch_config(n_rows, n_cols, x.dtype, x.device)
    with device_guard(x.device):
        rms_norm_forward_kernel[(cfg.n_programs,)](
            x, weight.contiguous() if weight is not None else x, y, rstd,
            n_rows, n_cols, eps,
            HAS_WEIGHT=weight is not None,
            BLOCK_M=cfg.block_m, BLOCK_C=cfg.block_c,
            num_warps=cfg.num_warps,
        )  # fmt: skip
    return y, rstd


@rms_norm_forward_op.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape), x.new_empty((x.shape[0],), dtype=torch.float32)


@torch.library.custom_op("gtnorm::rms_norm_backward", mutates_args=())
def rms_norm_backward_op(
    grad_y: Tensor,  # [n_rows, C]
    x: Tensor,  # [n_rows, C]
    weight: Tensor | None,  # [C]
    rstd: Tensor,  # [n_rows] fp32 from the forward
) -> tuple[Tensor, Tensor]:
    """Returns (dx [n_rows, C] in x's dtype, dw [C] in weight's dtype, or an empty fp32 tensor without one)."""
    # grad_y is often not contiguous (e.g. the expanded ones of a .sum().backward()).
    grad_y = grad_y.contiguous()
    x = x.contiguous()
    n_rows, n_cols = x.shape
    device = x.device
    grad_x = new_output(x.shape, x.dtype, device)
    has_weight = weight is not None
    if x.numel() == 0:
        grad_weight = torch.zeros_like(weight) if has_weight else torch.empty(0, dtype=torch.float32, device=device)
        return grad_x, grad_weight
    cfg = rms_norm_launch_config(n_rows, n_cols, x.dtype, device, backward=True)
    grad_weight_partial = new_output((cfg.n_programs if has_weight else 0, n_cols), torch.float32, device)
    with device_guard(device):
        rms_norm_backward_kernel[(cfg.n_programs,)](
            grad_y, x, weight.contiguous() if has_weight else x, rstd.contiguous(),
            grad_x, grad_weight_partial if has_weight else x,
            n_rows, n_cols,
            HAS_WEIGHT=has_weight,
            BLOCK_M=cfg.block_m, BLOCK_C=cfg.block_c,
            num_warps=cfg.num_warps,
        )  # fmt: skip
    if not has_weight:
        return grad_x, torch.empty(0, dtype=torch.float32, device=device)
    # A fixed-order sum of the per-program rows: bitwise reproducible, unlike atomics.
    return grad_x, grad_weight_partial.sum(dim=0).to(weight.dtype)


@rms_norm_backward_op.register_fake
def _(grad_y, x, weight, rstd):
    grad_weight = weight.new_empty(weight.shape) if weight is not None else x.new_empty((0,), dtype=torch.float32)
    return x.new_empty(x.shape), grad_weight


def _setup_context(ctx, inputs, output):
    x, weight, _eps = inputs
    _y, rstd = output
    ctx.save_for_backward(x, weight, rstd)
    ctx.mark_non_differentiable(rstd)


def _backward(ctx, grad_y, _grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    grad_x, grad_weight = torch.ops.gtnorm.rms_norm_backward(grad_y, x, weight, rstd)
    return grad_x, grad_weight if weight is not None else None, None


rms_norm_forward_op.register_autograd(_backward, setup_context=_setup_context)


def rms_norm(
    x: Tensor,  # [*, *normalized_shape]
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,  # normalized_shape
    eps: float | None = None,
) -> Tensor:  # x's shape and dtype
    """RMSNorm over the trailing ``normalized_shape`` dims of x, as ``torch.nn.functional.rms_norm``:
    y = x / sqrt(mean(x^2) + eps) * weight, statistics and math in fp32, output in x's dtype.

    ``eps=None`` uses float32's epsilon, as torch's kernels do for every input dtype. x may be float16,
    bfloat16 or float32, the weight any of these too (as in torch, it need not match x). Differentiable in x
    and weight. Runs the Triton kernels only: CPU tensors need the Triton interpreter (``gtnorm.RMSNorm``
    falls back to torch instead).

    Shapes:
        x: [*, *normalized_shape], e.g. [N, H, C] with ``normalized_shape=C`` (per head, over C).
        weight: ``normalized_shape`` or None.
        returns: x's shape, in x's dtype.
    """
    normalized_shape = _check_inputs(x, normalized_shape, weight)
    eps = resolve_eps(eps, x.dtype)
    check_triton_device(x.device, "gtnorm.rms_norm")
    n_cols = math.prod(normalized_shape)
    n_rows = math.prod(x.shape[: x.dim() - len(normalized_shape)])
    x_rows = x.contiguous().view(n_rows, n_cols)
    weight_flat = weight.contiguous().view(n_cols) if weight is not None else None
    y, _ = torch.ops.gtnorm.rms_norm_forward(x_rows, weight_flat, eps)
    return y.view(x.shape)


def _check_inputs(x, normalized_shape, weight) -> tuple[int, ...]:
    """Raises before any launch; returns normalized_shape as a tuple."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    check_dtype("x", x)
    if _is_int(normalized_shape):
        normalized_shape = (normalized_shape,)
    if not isinstance(normalized_shape, Sequence) or not all(_is_int(d) for d in normalized_shape):
        raise TypeError(f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}")
    normalized_shape = tuple(normalized_shape)
    if len(normalized_shape) == 0:
        raise ValueError("normalized_shape must have at least one dim, got ()")
    if len(normalized_shape) > x.dim() or tuple(x.shape[x.dim() - len(normalized_shape) :]) != normalized_shape:
        raise ValueError(
            f"normalized_shape {normalized_shape} must equal the trailing dims of x, got x of shape {tuple(x.shape)}"
        )
    if math.prod(normalized_shape) > MAX_FUSED_COLS:
        raise ValueError(
            f"normalized_shape {normalized_shape} spans {math.prod(normalized_shape)} elements; the kernels keep a "
            f"row in registers and support at most {MAX_FUSED_COLS}"
        )
    if weight is not None:
        if not isinstance(weight, Tensor):
            raise TypeError(f"weight must be a torch.Tensor or None, got {type(weight).__name__}")
        check_dtype("weight", weight)
        if tuple(weight.shape) != normalized_shape:
            raise ValueError(f"weight must have shape normalized_shape {normalized_shape}, got {tuple(weight.shape)}")
        if weight.device != x.device:
            raise ValueError(f"weight is on {weight.device} but x is on {x.device}; they must be on the same device")
    return normalized_shape


def _is_int(value) -> bool:
    # SymInt: a size taken from x.shape while torch.compile traces with dynamic shapes.
    return isinstance(value, (numbers.Integral, torch.SymInt)) and not isinstance(value, bool)
