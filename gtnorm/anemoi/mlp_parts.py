"""A mapper block's destination MLP (LayerNorm, Linear, GELU, Linear) in row parts, as one custom op for compiled
blocks: the memory of one part in the backward, whatever the compiler schedules.

Compiled, the block's graph recomputes checkpointed parts (row_parts.py) in its backward, and inductor schedules
the parts' work together: it fuses the parts' LayerNorm recomputations into shared kernels and places the weight
gradients' GEMMs after every part, feeding one fused sum. At O1280's decoder (1.65M grid rows a chunk, 13 parts of
131,072) every part's two 4096-wide tensors were then alive at once: 25 GiB at the step's peak
(benchmarks/NOTES.md, v30). An op is one node of the graph: its backward, another op, runs the parts one after
another, each recomputed and freed before the next. Eager blocks keep row_parts.py's checkpointed parts, which the
autograd engine already runs part by part.

The op does what Anemoi's modules do under autocast: the LayerNorm's math in fp32 (row_norm.py: gtnorm's row kernel
where Triton runs, writing its output in the GEMMs' dtype once), the Linears and the GELU in the autocast dtype, with
torch's GEMM and GELU kernels. The backward adds the parts' parameter gradients in a fixed order (deterministic).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gtnorm.anemoi.row_norm import RowNorm

_PARAMS = 6  # norm weight and bias, weight1, bias1, weight2, bias2: the op's tensor inputs after x


def fits_mlp_op(norm: nn.Module, mlp: nn.Module) -> bool:
    """Whether ``mlp(norm(x))`` is what the op computes: a torch LayerNorm over the last dimension, then an
    Anemoi MLP of exactly Linear, GELU, Linear and no LayerNorm of its own."""
    layers = getattr(mlp, "mlp", None)
    return (
        type(norm) is nn.LayerNorm
        and len(norm.normalized_shape) == 1
        and getattr(mlp, "layer_norm", None) is None
        and isinstance(layers, nn.Sequential)
        and [type(m) for m in layers] == [nn.Linear, nn.GELU, nn.Linear]
    )


def mlp_in_parts(x: Tensor, norm: nn.LayerNorm, mlp: nn.Module, rows: int) -> Tensor:
    """``mlp(norm(x))`` (fits_mlp_op) through the op, parts of at most ``rows`` rows.

    Shapes: x [N, C] -> [N, C_out].
    """
    first, gelu, second = mlp.mlp
    autocast_dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else None
    return torch.ops.gtnorm.mlp_in_parts(
        x, norm.weight, norm.bias, first.weight, first.bias, second.weight, second.bias,
        rows, norm.eps, gelu.approximate, autocast_dtype,
    )  # fmt: skip


@dataclass(frozen=True)
class _Weights:
    """The op's parameters in the dtypes its norm and GEMMs use (cast once a call, as autocast's cache does)."""

    norm: RowNorm
    weight1: Tensor  # [C_hidden, C]
    bias1: Tensor | None  # [C_hidden]
    weight2: Tensor  # [C_out, C_hidden]
    bias2: Tensor | None  # [C_out]
    approximate: str
    dtype: torch.dtype  # the GEMMs' and the GELU's

    @classmethod
    def of(cls, x, norm_weight, norm_bias, weight1, bias1, weight2, bias2, eps, approximate, autocast_dtype):
        norm = RowNorm.of(x, norm_weight, norm_bias, eps, autocast_dtype)
        dtype = norm.dtype

        def cast(t):
            return None if t is None else t.to(dtype)

        return cls(norm, weight1.to(dtype), cast(bias1), weight2.to(dtype), cast(bias2), approximate, dtype)


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor | None = None) -> Tensor:
    if bias is None:
        return torch.mm(x, weight.t(), out=out)
    return torch.addmm(bias, x, weight.t(), out=out)


def _part_activations(part: Tensor, w: _Weights) -> tuple[Tensor, ...]:
    """One part's forward up to the GELU: (the norm's input, mean, rstd and output, the first GEMM's output, the
    GELU's), what the second GEMM and the backward read. The backward's recomputation stops here: the second GEMM's
    output is not needed for gradients."""
    normed_in, normed, mean, rstd = w.norm.forward(part)
    hidden = _linear(normed, w.weight1, w.bias1)
    activated = torch.nn.functional.gelu(hidden, approximate=w.approximate)
    return normed_in, mean, rstd, normed, hidden, activated


def _forward(
    x: Tensor,  # [N, C]
    norm_weight: Tensor | None,  # [C]
    norm_bias: Tensor | None,  # [C]
    weight1: Tensor,  # [C_hidden, C]
    bias1: Tensor | None,  # [C_hidden]
    weight2: Tensor,  # [C_out, C_hidden]
    bias2: Tensor | None,  # [C_out]
    rows: int,
    eps: float,
    approximate: str,
    autocast_dtype: torch.dtype | None,  # None: no autocast
) -> Tensor:  # [N, C_out]
    with torch.autocast(x.device.type, enabled=False):  # the dtypes are _Weights'
        w = _Weights.of(x, norm_weight, norm_bias, weight1, bias1, weight2, bias2, eps, approximate, autocast_dtype)
        out = x.new_empty((x.shape[0], weight2.shape[0]), dtype=w.dtype)
        for start in range(0, x.shape[0], rows):
            activated = _part_activations(x[start : start + rows], w)[-1]
            _linear(activated, w.weight2, w.bias2, out=out[start : start + rows])
    return out


def _backward(
    grad_out: Tensor,  # [N, C_out]
    x: Tensor,  # [N, C]
    norm_weight: Tensor | None,  # [C]
    norm_bias: Tensor | None,  # [C]
    weight1: Tensor,  # [C_hidden, C]
    bias1: Tensor | None,  # [C_hidden]
    weight2: Tensor,  # [C_out, C_hidden]
    bias2: Tensor | None,  # [C_out]
    rows: int,
    eps: float,
    approximate: str,
    autocast_dtype: torch.dtype | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dx, d norm weight, d norm bias, d weight1, d bias1, d weight2, d bias2), empty where a parameter is
    absent (an op returns tensors). Each part is recomputed, then its gradients made and its tensors freed."""
    with torch.autocast(x.device.type, enabled=False):
        w = _Weights.of(x, norm_weight, norm_bias, weight1, bias1, weight2, bias2, eps, approximate, autocast_dtype)
        grad_x = torch.empty_like(x)
        sums = [None] * _PARAMS  # the parts' parameter gradients summed (fp32 at least), in the op's order
        accumulate = torch.promote_types(w.dtype, torch.float32)
        for start in range(0, x.shape[0], rows):
            stop = min(start + rows, x.shape[0])
            normed_in, mean, rstd, normed, hidden, activated = _part_activations(x[start:stop], w)
            grad_y = grad_out[start:stop].to(w.dtype)
            part_grads = [None] * _PARAMS
            part_grads[4] = grad_y.t().mm(activated)
            part_grads[5] = grad_y.sum(0, dtype=accumulate) if bias2 is not None else None
            del activated
            grad_hidden = torch.ops.aten.gelu_backward(grad_y.mm(w.weight2), hidden, approximate=w.approximate)
            del hidden
            part_grads[2] = grad_hidden.t().mm(normed)
            part_grads[3] = grad_hidden.sum(0, dtype=accumulate) if bias1 is not None else None
            del normed
            grad_normed = grad_hidden.mm(w.weight1)
            del grad_hidden
            norm_grads = (norm_weight is not None, norm_bias is not None)
            part_grads[0], part_grads[1] = w.norm.backward(
                grad_normed, normed_in, mean, rstd, grad_x[start:stop], norm_grads
            )
            for i, grad in enumerate(part_grads):
                if grad is not None:
                    sums[i] = grad.to(accumulate) if sums[i] is None else sums[i].add_(grad)
        params = (norm_weight, norm_bias, weight1, bias1, weight2, bias2)
        grads = [s.to(p.dtype) if p is not None else x.new_empty(0) for s, p in zip(sums, params, strict=True)]
    return (grad_x, *grads)


# Schemas written out: inferred from the annotations, they would depend on what each torch version can read there.
_INPUTS = "Tensor x, Tensor? norm_weight, Tensor? norm_bias, Tensor weight1, Tensor? bias1, Tensor weight2, " + (
    "Tensor? bias2"
)
_SETTINGS = "int rows, float eps, str approximate, ScalarType? autocast_dtype"
mlp_in_parts_op = torch.library.custom_op(
    "gtnorm::mlp_in_parts", _forward, mutates_args=(), schema=f"({_INPUTS}, {_SETTINGS}) -> Tensor"
)
mlp_in_parts_backward_op = torch.library.custom_op(
    "gtnorm::mlp_in_parts_backward",
    _backward,
    mutates_args=(),
    schema=f"(Tensor grad_out, {_INPUTS}, {_SETTINGS}) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
)


@mlp_in_parts_op.register_fake
def _(x, norm_weight, norm_bias, weight1, bias1, weight2, bias2, rows, eps, approximate, autocast_dtype):
    return x.new_empty((x.shape[0], weight2.shape[0]), dtype=autocast_dtype or x.dtype)


@mlp_in_parts_backward_op.register_fake
def _(grad_out, x, *params_and_settings):
    params = params_and_settings[:_PARAMS]
    return (torch.empty_like(x), *(p.new_empty(p.shape) if p is not None else x.new_empty(0) for p in params))


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[: 1 + _PARAMS])
    ctx.settings = inputs[1 + _PARAMS :]  # rows, eps, approximate, autocast_dtype


def _mlp_in_parts_grads(ctx, grad_out):
    x, *params = ctx.saved_tensors
    grads = torch.ops.gtnorm.mlp_in_parts_backward(grad_out, x, *params, *ctx.settings)
    params_grads = [g if p is not None else None for g, p in zip(grads[1:], params, strict=True)]
    return grads[0], *params_grads, None, None, None, None


mlp_in_parts_op.register_autograd(_mlp_in_parts_grads, setup_context=_setup_context)
