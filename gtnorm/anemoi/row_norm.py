"""The LayerNorm of the row ops on a mapper's destinations (mlp_parts.py, output_head.py), as Anemoi's modules run it
under autocast: the statistics and math in fp32, the output in the dtype of the GEMM that reads it.

Where Triton runs and the input is fp16, bf16 or fp32 it is gtnorm's row kernel (gtnorm/layernorm/rows.py): it reads
the rows and writes the output in the GEMM's dtype once, where torch's under autocast copies the rows to fp32,
writes an fp32 output and casts it (and in the backward casts the gradient to fp32 and the input's gradient back).
Elsewhere (float64, a CPU without the interpreter) it is torch's, and the forward is then bitwise the modules'.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gtnorm._runtime import SUPPORTED_DTYPES, triton_can_run_on

_NORM_DTYPE_UNDER_AUTOCAST = torch.float32  # torch's autocast runs layer_norm in fp32


@dataclass(frozen=True)
class RowNorm:
    """A LayerNorm over the last dimension of [rows, C] parts, with its parameters in the dtype its math uses."""

    weight: Tensor | None  # [C]
    bias: Tensor | None  # [C]
    eps: float
    norm_dtype: torch.dtype  # torch's LayerNorm's; the kernels' math is fp32
    dtype: torch.dtype  # the output's: the GEMM's that reads it
    kernels: bool  # gtnorm/layernorm's kernels (fp32 parameters), else torch's

    @classmethod
    def of(
        cls, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, autocast_dtype: torch.dtype | None
    ) -> RowNorm:
        """The norm of x's rows, its output in autocast's dtype (None: no autocast) or else x's."""
        kernels = x.dtype in SUPPORTED_DTYPES and triton_can_run_on(x.device)
        norm_dtype = _NORM_DTYPE_UNDER_AUTOCAST if autocast_dtype is not None or kernels else x.dtype
        weight, bias = (None if t is None else t.to(norm_dtype) for t in (weight, bias))
        return cls(weight, bias, eps, norm_dtype, autocast_dtype or x.dtype, kernels)

    def forward(self, part: Tensor) -> tuple[Tensor, ...]:  # part [rows, C]
        """(the norm's input as its backward reads it, its output in ``dtype``, mean, rstd)."""
        if self.kernels:
            from gtnorm.layernorm.rows import layer_norm_rows  # defines kernels: not at import (gtnorm/_lazy.py)

            part = part.contiguous()
            return part, *layer_norm_rows(part, self.weight, self.bias, self.eps, self.dtype)
        normed_in = part.to(self.norm_dtype)
        normed, mean, rstd = torch.native_layer_norm(normed_in, [part.shape[1]], self.weight, self.bias, self.eps)
        return normed_in, normed.to(self.dtype), mean, rstd

    def backward(
        self,
        grad_normed: Tensor,  # [rows, C]
        normed_in: Tensor,  # [rows, C], from forward
        mean: Tensor,  # from forward
        rstd: Tensor,  # from forward
        grad_x: Tensor,  # [rows, C]: written
        param_grads: tuple[bool, bool],  # whether the weight's and the bias's gradients are wanted
    ) -> tuple[Tensor | None, Tensor | None]:
        """Writes the rows' input gradient into ``grad_x``; returns the weight's and bias's gradients over these
        rows (None where not wanted)."""
        if self.kernels:
            from gtnorm.layernorm.rows import layer_norm_rows_backward

            sums = layer_norm_rows_backward(grad_normed, normed_in, self.weight, mean, rstd, grad_x, any(param_grads))
            return tuple(s if wanted else None for s, wanted in zip(sums or (None, None), param_grads, strict=True))
        mask = [True, *param_grads]
        grad_part, grad_weight, grad_bias = torch.ops.aten.native_layer_norm_backward(
            grad_normed.to(self.norm_dtype), normed_in, [normed_in.shape[1]], mean, rstd, self.weight, self.bias, mask
        )
        grad_x.copy_(grad_part)
        return grad_weight, grad_bias
