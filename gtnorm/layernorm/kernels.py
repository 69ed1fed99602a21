"""LayerNorm forward and backward kernels over a [n_rows, C] view of the input.

Tiled like the RMSNorm kernels (gtnorm/rmsnorm/kernels.py, whose launch settings they share): a persistent grid
of programs, each taking [BLOCK_M, BLOCK_C] tiles of BLOCK_M whole rows. The forward writes no statistics: the
backward reads x anyway and recomputes mean and rstd from it, which saves the forward 8 bytes per row of
writes and the caller that memory between the passes. The per-row math is gtnorm.layernorm.math.
"""

import triton
import triton.language as tl

from gtnorm.layernorm.math import (
    layer_norm_affine,
    layer_norm_backward,
    layer_norm_normalized,
    layer_norm_stats_centred,
)


@triton.jit
def _load_param(ptr, offs_c, col_mask, PRESENT: tl.constexpr, DEFAULT: tl.constexpr):
    """A weight or bias as fp32 [1, BLOCK_C], loaded once per program; DEFAULT (1 or 0) without one."""
    if PRESENT:
        p = tl.load(ptr + offs_c, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    else:
        p = DEFAULT
    return p


@triton.jit
def _row_tile(row_block, offs_m, offs_c, col_mask, n_rows, n_cols, BLOCK_M: tl.constexpr):
    """Offsets and mask of tile ``row_block``, and its rows' mask."""
    rows = row_block * BLOCK_M + offs_m
    row_mask = rows < n_rows
    offsets = rows.to(tl.int64)[:, None] * n_cols + offs_c[None, :]
    return offsets, row_mask[:, None] & col_mask[None, :]


@triton.jit
def layer_norm_forward_kernel(
    x_ptr,  # [n_rows, C]
    weight_ptr,  # [C] (unused without HAS_WEIGHT)
    bias_ptr,  # [C] (unused without HAS_BIAS)
    y_ptr,  # [n_rows, C]
    n_rows,
    n_cols,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    offs_m = tl.arange(0, BLOCK_M)
    offs_c = tl.arange(0, BLOCK_C)
    col_mask = offs_c < n_cols
    w = _load_param(weight_ptr, offs_c, col_mask, HAS_WEIGHT, 1.0)
    b = _load_param(bias_ptr, offs_c, col_mask, HAS_BIAS, 0.0)
    for row_block in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
        offsets, mask = _row_tile(row_block, offs_m, offs_c, col_mask, n_rows, n_cols, BLOCK_M)
        # other=0: padding lanes must add nothing to the row sums (the helpers' contract).
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        mean, rstd = layer_norm_stats_centred(x, mask, n_cols, eps, 1)
        y = layer_norm_affine(x, mean, rstd, w, b, mask)
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layer_norm_backward_kernel(
    grad_y_ptr,  # [n_rows, C]
    x_ptr,  # [n_rows, C]
    weight_ptr,  # [C] (unused without HAS_WEIGHT)
    grad_x_ptr,  # [n_rows, C]
    param_grad_partial_ptr,  # [n_programs, partial_width] fp32: program p's [weight | bias] sums over its rows
    n_rows,
    n_cols,
    partial_width,  # C for each of weight and bias that exists
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    program = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_c = tl.arange(0, BLOCK_C)
    col_mask = offs_c < n_cols
    w = _load_param(weight_ptr, offs_c, col_mask, HAS_WEIGHT, 1.0)
    # Kept 2-D so each step only adds elementwise; the one cross-row reduction happens after the loop.
    grad_w_acc = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    grad_b_acc = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    for row_block in tl.range(program, tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
        offsets, mask = _row_tile(row_block, offs_m, offs_c, col_mask, n_rows, n_cols, BLOCK_M)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(grad_y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        mean, rstd = layer_norm_stats_centred(x, mask, n_cols, eps, 1)
        # 0 on padding rows and lanes, so they add nothing to the parameter gradients.
        x_hat = layer_norm_normalized(x, mean, rstd, mask)
        dx = layer_norm_backward(x_hat, rstd, w, dy, mask, n_cols, 1)
        tl.store(grad_x_ptr + offsets, dx.to(grad_x_ptr.dtype.element_ty), mask=mask)
        if HAS_WEIGHT:
            grad_w_acc += dy * x_hat
        if HAS_BIAS:
            grad_b_acc += dy

    # Every program writes its row, even one that handled no rows, so the host sum never reads garbage.
    row_ptr = param_grad_partial_ptr + program.to(tl.int64) * partial_width
    if HAS_WEIGHT:
        tl.store(row_ptr + offs_c, tl.sum(grad_w_acc, axis=0), mask=col_mask)
    if HAS_BIAS:
        tl.store(row_ptr + (partial_width - n_cols) + offs_c, tl.sum(grad_b_acc, axis=0), mask=col_mask)
