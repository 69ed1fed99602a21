"""The decoder's output head (Anemoi's ``node_data_extractor``: LayerNorm, then Linear to the output variables) as
one op.

It runs on every grid node, eagerly (the ``compile:`` list names blocks, not the mapper): at O800 a decoder chunk
is 647k rows of 1024 channels, run in the forward, again in the chunk's recomputation, and in the backward. Under
autocast torch's LayerNorm copies the rows to fp32, writes an fp32 output that the Linear casts back, and its
backward casts the gradient to fp32 and the input's gradient back: in the O800 step (H200) those copies and
LayerNorms took ~60 ms (benchmarks/NOTES.md, v32). The op's LayerNorm (row_norm.py) reads the rows and writes the
Linear's input once, its backward reads the gradient as it is; its math is the modules' (fp32 statistics, the GEMM
in the autocast dtype). The backward computes the norm again instead of keeping its output (a read and a write of
the rows, against the [rows, C] output Anemoi's modules keep).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from gtnorm.anemoi.row_norm import RowNorm

_PARAMS = 4  # norm weight and bias, weight, bias: the op's tensor inputs after x


def fits_output_head(head: nn.Module) -> bool:
    """Whether ``head`` is what the op computes: a Sequential of a torch LayerNorm over the last dimension and a
    torch Linear."""
    return (
        isinstance(head, nn.Sequential)
        and [type(m) for m in head] == [nn.LayerNorm, nn.Linear]
        and len(head[0].normalized_shape) == 1
    )


def output_head(x: Tensor, head: nn.Sequential) -> Tensor:
    """``head(x)`` (fits_output_head) through the op.

    Shapes: x [N, C] -> [N, C_out].
    """
    norm, linear = head
    autocast_dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else None
    return torch.ops.gtnorm.output_head(x, norm.weight, norm.bias, linear.weight, linear.bias, norm.eps, autocast_dtype)


def _forward(
    x: Tensor,  # [N, C]
    norm_weight: Tensor | None,  # [C]
    norm_bias: Tensor | None,  # [C]
    weight: Tensor,  # [C_out, C]
    bias: Tensor | None,  # [C_out]
    eps: float,
    autocast_dtype: torch.dtype | None,  # None: no autocast
) -> Tensor:  # [N, C_out]
    with torch.autocast(x.device.type, enabled=False):  # the dtypes are RowNorm's
        norm = RowNorm.of(x, norm_weight, norm_bias, eps, autocast_dtype)
        normed = norm.forward(x)[1]
        weight = weight.to(norm.dtype)
        if bias is None:
            return normed.mm(weight.t())
        return torch.addmm(bias.to(norm.dtype), normed, weight.t())


def _backward(
    grad_out: Tensor,  # [N, C_out]
    x: Tensor,  # [N, C]
    norm_weight: Tensor | None,  # [C]
    norm_bias: Tensor | None,  # [C]
    weight: Tensor,  # [C_out, C]
    bias: Tensor | None,  # [C_out]
    eps: float,
    autocast_dtype: torch.dtype | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dx, d norm weight, d norm bias, d weight, d bias), empty where a parameter is absent (an op returns
    tensors)."""
    with torch.autocast(x.device.type, enabled=False):
        norm = RowNorm.of(x, norm_weight, norm_bias, eps, autocast_dtype)
        normed_in, normed, mean, rstd = norm.forward(x)
        grad_y = grad_out.to(norm.dtype)
        grad_weight = grad_y.t().mm(normed)
        del normed
        accumulate = torch.promote_types(norm.dtype, torch.float32)
        grad_bias = grad_y.sum(0, dtype=accumulate) if bias is not None else None
        grad_normed = grad_y.mm(weight.to(norm.dtype))
        grad_x = torch.empty_like(x)
        grad_norm_weight, grad_norm_bias = norm.backward(
            grad_normed, normed_in, mean, rstd, grad_x, (norm_weight is not None, norm_bias is not None)
        )
        params = (norm_weight, norm_bias, weight, bias)
        grads = (grad_norm_weight, grad_norm_bias, grad_weight, grad_bias)
        grads = [g.to(p.dtype) if p is not None else x.new_empty(0) for g, p in zip(grads, params, strict=True)]
    return (grad_x, *grads)


# Schemas written out, as in mlp_parts.py.
_INPUTS = "Tensor x, Tensor? norm_weight, Tensor? norm_bias, Tensor weight, Tensor? bias"
_SETTINGS = "float eps, ScalarType? autocast_dtype"
output_head_op = torch.library.custom_op(
    "gtnorm::output_head", _forward, mutates_args=(), schema=f"({_INPUTS}, {_SETTINGS}) -> Tensor"
)
output_head_backward_op = torch.library.custom_op(
    "gtnorm::output_head_backward",
    _backward,
    mutates_args=(),
    schema=f"(Tensor grad_out, {_INPUTS}, {_SETTINGS}) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
)


@output_head_op.register_fake
def _(x, norm_weight, norm_bias, weight, bias, eps, autocast_dtype):
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=autocast_dtype or x.dtype)


@output_head_backward_op.register_fake
def _(grad_out, x, *params_and_settings):
    params = params_and_settings[:_PARAMS]
    return (torch.empty_like(x), *(p.new_empty(p.shape) if p is not None else x.new_empty(0) for p in params))


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[: 1 + _PARAMS])
    ctx.settings = inputs[1 + _PARAMS :]  # eps, autocast_dtype


def _output_head_grads(ctx, grad_out):
    x, *params = ctx.saved_tensors
    grads = torch.ops.gtnorm.output_head_backward(grad_out, x, *params, *ctx.settings)
    params_grads = [g if p is not None else None for g, p in zip(grads[1:], params, strict=True)]
    return grads[0], *params_grads, None, None


output_head_op.register_autograd(_output_head_grads, setup_context=_setup_context)
