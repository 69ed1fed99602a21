"""``layer_norm``: the public functional LayerNorm, its input checks, and the kernels as ``torch.library`` custom
ops (fake impls + autograd), so torch.compile traces through them.

The ops see a [n_rows, C] view of the input (C = prod(normalized_shape)) and flat [C] parameters; the public
function reshapes around them, so autograd of the reshapes is torch's own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from gtnorm._runtime import check_dtype, check_triton_device, device_guard, new_output
from gtnorm.layernorm.config import layer_norm_launch_config
from gtnorm.layernorm.kernels import layer_norm_backward_kernel, layer_norm_forward_kernel
from gtnorm.rmsnorm.functional import _check_inputs as _check_x_and_weight

# torch.nn.LayerNorm's default.
LAYER_NORM_DEFAULT_EPS = 1e-5


@torch.library.custom_op("gtnorm::layer_norm_forward", mutates_args=())
def layer_norm_forward_op(
    x: Tensor,  # [n_rows, C]
    weight: Tensor | None,  # [C]
    bias: Tensor | None,  # [C]
    eps: float,
) -> Tensor:  # [n_rows, C] in x's dtype
    x = x.contiguous()
    n_rows, n_cols = x.shape
    y = new_output(x.shape, x.dtype, x.device)
    if x.numel() == 0:
        return y
    cfg = layer_norm_launch_config(n_rows, n_cols, x.dtype, x.device)
    with device_guard(x.device):
        layer_norm_forward_kernel[(cfg.n_programs,)](
            x, weight.contiguous() if weight is not None else x, bias.contiguous() if bias is not None else x, y,
            n_rows, n_cols, eps,
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            BLOCK_M=cfg.block_m, BLOCK_C=cfg.block_c, num_warps=cfg.num_warps,
        )  # fmt: skip
    return y


@layer_norm_forward_op.register_fake
def _(x, weight, bias, eps):
    return x.new_empty(x.shape)


@torch.library.custom_op("gtnorm::layer_norm_backward", mutates_args=())
def layer_norm_backward_op(
    grad_y: Tensor,  # [n_rows, C]
    x: Tensor,  # [n_rows, C]
    weight: Tensor | None,  # [C]
    bias: Tensor | None,  # [C]: only whether it exists (and its dtype) matters
    eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (dx [n_rows, C] in x's dtype, dw, db [C] in their parameter's dtype; empty fp32 without one)."""
    # grad_y is often not contiguous (e.g. the expanded ones of a .sum().backward()).
    grad_y = grad_y.contiguous()
    x = x.contiguous()
    n_rows, n_cols = x.shape
    device = x.device
    grad_x = new_output(x.shape, x.dtype, device)
    params = [p for p in (weight, bias) if p is not None]
    cfg = layer_norm_launch_config(n_rows, n_cols, x.dtype, device, backward=True)
    n_programs = cfg.n_programs if x.numel() else 0
    partial = new_output((n_programs, len(params) * n_cols), torch.float32, device)
    if n_programs:
        with device_guard(device):
            layer_norm_backward_kernel[(n_programs,)](
                grad_y, x, weight.contiguous() if weight is not None else x, grad_x, partial,
                n_rows, n_cols, partial.shape[1], eps,
                HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                BLOCK_M=cfg.block_m, BLOCK_C=cfg.block_c, num_warps=cfg.num_warps,
            )  # fmt: skip
    # A fixed-order sum of the per-program rows: bitwise reproducible, unlike atomics.
    sums = partial.sum(dim=0)
    grads, column = [], 0
    for param in (weight, bias):
        if param is None:
            grads.append(torch.empty(0, dtype=torch.float32, device=device))
        else:
            grads.append(sums[column : column + n_cols].to(param.dtype, copy=True))  # no aliasing views
            column += n_cols
    return grad_x, grads[0], grads[1]


@layer_norm_backward_op.register_fake
def _(grad_y, x, weight, bias, eps):
    def grad_or_empty(p):
        return p.new_empty(p.shape) if p is not None else x.new_empty((0,), dtype=torch.float32)

    return x.new_empty(x.shape), grad_or_empty(weight), grad_or_empty(bias)


def _setup_context(ctx, inputs, output):
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.eps = eps


def _backward(ctx, grad_y):
    x, weight, bias = ctx.saved_tensors
    grad_x, grad_weight, grad_bias = torch.ops.gtnorm.layer_norm_backward(grad_y, x, weight, bias, ctx.eps)
    return grad_x, grad_weight if weight is not None else None, grad_bias if bias is not None else None, None


layer_norm_forward_op.register_autograd(_backward, setup_context=_setup_context)


def layer_norm(
    x: Tensor,  # [*, *normalized_shape]
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,  # normalized_shape
    bias: Tensor | None = None,  # normalized_shape
    eps: float = LAYER_NORM_DEFAULT_EPS,
) -> Tensor:  # x's shape and dtype
    """LayerNorm over the trailing ``normalized_shape`` dims of x, as ``torch.nn.functional.layer_norm``:
    y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias (biased variance), statistics and math in fp32,
    output in x's dtype.

    x, weight and bias may each be float16, bfloat16 or float32 (as in torch, the parameters need not match x).
    Differentiable in x, weight and bias; the parameter gradients are bitwise reproducible. Runs the Triton
    kernels only: CPU tensors need the Triton interpreter (``gtnorm.LayerNorm`` falls back to torch instead).

    Shapes:
        x: [*, *normalized_shape], e.g. [N, H, C] with ``normalized_shape=C`` (per head, over C).
        weight, bias: ``normalized_shape`` or None.
        returns: x's shape, in x's dtype.
    """
    normalized_shape = _check_x_and_weight(x, normalized_shape, weight)
    if bias is not None:
        if not isinstance(bias, Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        check_dtype("bias", bias)
        if tuple(bias.shape) != normalized_shape:
            raise ValueError(f"bias must have shape normalized_shape {normalized_shape}, got {tuple(bias.shape)}")
        if bias.device != x.device:
            raise ValueError(f"bias is on {bias.device} but x is on {x.device}; they must be on the same device")
    if not eps >= 0.0:
        raise ValueError(f"eps must be non-negative, got {eps}")
    check_triton_device(x.device, "gtnorm.layer_norm")
    n_cols = math.prod(normalized_shape)
    n_rows = math.prod(x.shape[: x.dim() - len(normalized_shape)])
    x_rows = x.contiguous().view(n_rows, n_cols)
    weight_flat = weight.contiguous().view(n_cols) if weight is not None else None
    bias_flat = bias.contiguous().view(n_cols) if bias is not None else None
    y = torch.ops.gtnorm.layer_norm_forward(x_rows, weight_flat, bias_flat, float(eps))
    return y.view(x.shape)
