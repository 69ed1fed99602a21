"""RMSNorm forward and backward kernels over a [n_rows, C] view of the input.

The grid is persistent: program p handles row blocks p, p + n_programs, p + 2 * n_programs, ... (config.py
sizes the grid from the row count and the SM count). Each step loads a [BLOCK_M, BLOCK_C] tile, BLOCK_M
whole rows, so that short rows (C = 64) still make wide, coalesced loads. The per-row math is the shared
helpers of gtnorm.rmsnorm.math, so these kernels and the graph-transformer kernels compute the same thing.

Rows are widened to int64 before the multiply by C, because n_rows * C passes 2**31 on large inputs.
"""

import triton
import triton.language as tl

from gtnorm.rmsnorm.math import rms_norm_backward, rms_norm_forward


@triton.jit
def _load_weight(weight_ptr, offs_c, col_mask, HAS_WEIGHT: tl.constexpr):
    """The affine weight as fp32 [1, BLOCK_C], loaded once per program; 1.0 without a weight."""
    if HAS_WEIGHT:
        w = tl.load(weight_ptr + offs_c, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    else:
        w = 1.0
    return w


@triton.jit
def rms_norm_forward_kernel(
    x_ptr,  # [n_rows, C]
    weight_ptr,  # [C] (unused without HAS_WEIGHT)
    y_ptr,  # [n_rows, C]
    rstd_ptr,  # [n_rows] fp32: 1 / rms of each row, so the backward need not recompute it
    n_rows,
    n_cols,
    eps,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    program = tl.program_id(0)
    n_programs = tl.num_programs(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_c = tl.arange(0, BLOCK_C)
    col_mask = offs_c < n_cols
    w = _load_weight(weight_ptr, offs_c, col_mask, HAS_WEIGHT)

    n_row_blocks = tl.cdiv(n_rows, BLOCK_M)
    row_block = program
    # A while loop, not range(): the interpreter of older Triton cannot take program-id loop bounds.
    while row_block < n_row_blocks:
        rows = row_block * BLOCK_M + offs_m
        row_mask = rows < n_rows
        offsets = rows.to(tl.int64)[:, None] * n_cols + offs_c[None, :]
        mask = row_mask[:, None] & col_mask[None, :]
        # other=0: padding lanes must add nothing to the row sums (the helpers' contract).
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        y, rstd = rms_norm_forward(x, w, n_cols, eps, 1)
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(rstd_ptr + rows[:, None], rstd, mask=row_mask[:, None])
        row_block += n_programs


@triton.jit
def rms_norm_backward_kernel(
    grad_y_ptr,  # [n_rows, C]
    x_ptr,  # [n_rows, C]
    weight_ptr,  # [C] (unused without HAS_WEIGHT)
    rstd_ptr,  # [n_rows] fp32 from the forward
    grad_x_ptr,  # [n_rows, C]
    grad_weight_partial_ptr,  # [n_programs, C] fp32: row p is program p's sum over its rows (unused without HAS_WEIGHT)
    n_rows,
    n_cols,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    program = tl.program_id(0)
    n_programs = tl.num_programs(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_c = tl.arange(0, BLOCK_C)
    col_mask = offs_c < n_cols
    w = _load_weight(weight_ptr, offs_c, col_mask, HAS_WEIGHT)
    # Kept 2-D so each step only adds elementwise; the one cross-row reduction happens after the loop.
    grad_w_acc = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)

    n_row_blocks = tl.cdiv(n_rows, BLOCK_M)
    row_block = program
    # A while loop, not range(): the interpreter of older Triton cannot take program-id loop bounds.
    while row_block < n_row_blocks:
        rows = row_block * BLOCK_M + offs_m
        row_mask = rows < n_rows
        offsets = rows.to(tl.int64)[:, None] * n_cols + offs_c[None, :]
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(grad_y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        # Padding rows get rstd 0, so they add nothing to the weight gradient.
        rstd = tl.load(rstd_ptr + rows[:, None], mask=row_mask[:, None], other=0.0)
        dx = rms_norm_backward(x, rstd, w, dy, n_cols, 1)
        tl.store(grad_x_ptr + offsets, dx.to(grad_x_ptr.dtype.element_ty), mask=mask)
        if HAS_WEIGHT:
            grad_w_acc += dy * (x * rstd)
        row_block += n_programs

    if HAS_WEIGHT:
        # Every program writes its row, even one that handled no rows, so the host sum never reads garbage.
        grad_w = tl.sum(grad_w_acc, axis=0)
        tl.store(grad_weight_partial_ptr + program * n_cols + offs_c, grad_w, mask=col_mask)
