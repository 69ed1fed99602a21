"""Launch glue of the row LayerNorm kernels (kernels.py): plain functions for callers that are themselves one op
(gtnorm/anemoi/mlp_parts.py), so no custom op of their own. Tensors must be on a device the kernels run on
(gtnorm._runtime.triton_can_run_on)."""

from __future__ import annotations

import torch
from torch import Tensor

from gtnorm._runtime import device_guard, new_output
from gtnorm.layernorm.kernels import layer_norm_rows_backward_kernel, layer_norm_rows_forward_kernel
from gtnorm.rmsnorm.config import rms_norm_launch_config

# The LayerNorm kernels keep a row in registers as the RMSNorm ones do, with the same tiles and grid.
row_norm_launch_config = rms_norm_launch_config


def layer_norm_rows(
    x: Tensor,  # [n_rows, C], contiguous
    weight: Tensor | None,  # [C] fp32
    bias: Tensor | None,  # [C] fp32
    eps: float,
    out_dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor]:  # y [n_rows, C] in out_dtype, mean and rstd [n_rows] fp32
    """LayerNorm of each row, statistics and math in fp32."""
    n_rows, n_cols = x.shape
    y = new_output(x.shape, out_dtype, x.device)
    mean, rstd = (new_output((n_rows,), torch.float32, x.device) for _ in range(2))
    if n_rows:
        cfg = row_norm_launch_config(n_rows, n_cols, x.dtype, x.device)
        with device_guard(x.device):
            layer_norm_rows_forward_kernel[(cfg.n_programs,)](
                x, weight if weight is not None else x, bias if bias is not None else x, y, mean, rstd,
                n_rows, n_cols, eps,
                HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                BLOCK_M=cfg.block_m, BLOCK_C=cfg.block_c, num_warps=cfg.num_warps,
            )  # fmt: skip
    return y, mean, rstd


def layer_norm_rows_backward(
    grad_y: Tensor,  # [n_rows, C], contiguous
    x: Tensor,  # [n_rows, C], contiguous
    weight: Tensor | None,  # [C] fp32
    mean: Tensor,  # [n_rows] fp32 from layer_norm_rows
    rstd: Tensor,  # [n_rows] fp32 from layer_norm_rows
    grad_x: Tensor,  # [n_rows, C], contiguous: written
    param_grads: bool,
) -> tuple[Tensor, Tensor] | None:  # (d weight, d bias) [C] fp32 each, summed in a fixed order; None unless asked
    """Writes dx into ``grad_x``; returns the parameters' gradients over these rows where ``param_grads``."""
    n_rows, n_cols = x.shape
    cfg = row_norm_launch_config(n_rows, n_cols, x.dtype, x.device, backward=True)
    partial = new_output((cfg.n_programs if param_grads else 0, 2, n_cols), torch.float32, x.device)
    if n_rows:
        with device_guard(x.device):
            layer_norm_rows_backward_kernel[(cfg.n_programs,)](
                grad_y, x, weight if weight is not None else x, mean, rstd, grad_x, partial if param_grads else x,
                n_rows, n_cols,
                HAS_WEIGHT=weight is not None, PARAM_GRADS=param_grads,
                BLOCK_M=cfg.block_m, BLOCK_C=cfg.block_c, num_warps=cfg.num_warps,
            )  # fmt: skip
    if not param_grads:
        return None
    # Two sums, not two views of one: callers hand them out as separate tensors (an op's outputs may not alias).
    return tuple(partial[:, i].sum(dim=0) if n_rows else partial.new_zeros(n_cols) for i in range(2))
