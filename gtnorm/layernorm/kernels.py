"""LayerNorm forward and backward kernels over a [n_rows, C] view, for work that runs outside torch.compile's
reach: the mapper MLP's row parts inside their op (gtnorm/anemoi/mlp_parts.py), where torch's eager LayerNorm
under autocast copies each part to fp32, writes an fp32 output and casts it again.

Statistics and math in fp32 (as autocast's fp32 LayerNorm), the input and the output in any float dtype each (the
output in the GEMMs' dtype), fp32 parameters. The grid and tiles are the RMSNorm kernels' (gtnorm/rmsnorm/kernels.py,
config.py): persistent programs over blocks of whole rows; the backward's parameter gradients one fp32 row per
program, summed afterwards in a fixed order. The per-row math is gtnorm.layernorm.math's, which the attention
kernels apply to q and k.

Rows are widened to int64 before the multiply by C: n_rows * C passes 2**31 on large inputs.
"""

import triton
import triton.language as tl

from gtnorm.layernorm.math import layer_norm_backward, layer_norm_normalized, layer_norm_stats


@triton.jit
def _load_param(ptr, offs_c, col_mask, HAS: tl.constexpr, DEFAULT: tl.constexpr):
    """A [C] parameter as fp32 [1, BLOCK_C] (0 on padding lanes); DEFAULT where there is none."""
    if HAS:
        p = tl.load(ptr + offs_c, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    else:
        p = DEFAULT
    return p


@triton.jit
def layer_norm_rows_forward_kernel(
    x_ptr,  # [n_rows, C]
    weight_ptr,  # [C] (unused without HAS_WEIGHT)
    bias_ptr,  # [C] (unused without HAS_BIAS)
    y_ptr,  # [n_rows, C], in its own dtype
    mean_ptr,  # [n_rows] fp32
    rstd_ptr,  # [n_rows] fp32
    n_rows,
    n_cols,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    program = tl.program_id(0)
    n_programs = tl.num_programs(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_c = tl.arange(0, BLOCK_C)
    col_mask = offs_c < n_cols
    w = _load_param(weight_ptr, offs_c, col_mask, HAS_WEIGHT, 1.0)
    b = _load_param(bias_ptr, offs_c, col_mask, HAS_BIAS, 0.0)

    n_row_blocks = tl.cdiv(n_rows, BLOCK_M)
    row_block = program
    # A while loop, not range(): the interpreter of older Triton cannot take program-id loop bounds.
    while row_block < n_row_blocks:
        rows = row_block * BLOCK_M + offs_m
        row_mask = rows < n_rows
        offsets = rows.to(tl.int64)[:, None] * n_cols + offs_c[None, :]
        mask = row_mask[:, None] & col_mask[None, :]
        # other=0: padding lanes and rows must add nothing to the statistics (the helpers' contract).
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        mean, rstd = layer_norm_stats(x, n_cols, eps, 1)
        y = layer_norm_normalized(x, mean, rstd, n_cols, 1) * w + b
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(mean_ptr + rows[:, None], mean, mask=row_mask[:, None])
        tl.store(rstd_ptr + rows[:, None], rstd, mask=row_mask[:, None])
        row_block += n_programs


@triton.jit
def layer_norm_rows_backward_kernel(
    grad_y_ptr,  # [n_rows, C]
    x_ptr,  # [n_rows, C]
    weight_ptr,  # [C] (unused without HAS_WEIGHT)
    mean_ptr,  # [n_rows] fp32 from the forward
    rstd_ptr,  # [n_rows] fp32 from the forward
    grad_x_ptr,  # [n_rows, C], in its own dtype
    grad_params_partial_ptr,  # [n_programs, 2, C] fp32: program p's sums of dy * x_hat and of dy over its rows
    n_rows,
    n_cols,
    HAS_WEIGHT: tl.constexpr,
    PARAM_GRADS: tl.constexpr,  # whether to write the partial sums (a weight or a bias takes gradients)
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    program = tl.program_id(0)
    n_programs = tl.num_programs(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_c = tl.arange(0, BLOCK_C)
    col_mask = offs_c < n_cols
    w = _load_param(weight_ptr, offs_c, col_mask, HAS_WEIGHT, 1.0)
    # Kept 2-D so each step only adds elementwise; the one cross-row reduction happens after the loop.
    grad_w_acc = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    grad_b_acc = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)

    n_row_blocks = tl.cdiv(n_rows, BLOCK_M)
    row_block = program
    while row_block < n_row_blocks:
        rows = row_block * BLOCK_M + offs_m
        row_mask = rows < n_rows
        offsets = rows.to(tl.int64)[:, None] * n_cols + offs_c[None, :]
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(grad_y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        # Padding rows get rstd 0: x_hat and dx are 0 there and add nothing to the sums.
        mean = tl.load(mean_ptr + rows[:, None], mask=row_mask[:, None], other=0.0)
        rstd = tl.load(rstd_ptr + rows[:, None], mask=row_mask[:, None], other=0.0)
        x_hat = layer_norm_normalized(x, mean, rstd, n_cols, 1)
        dx = layer_norm_backward(x_hat, rstd, w, dy, mask, n_cols, 1)
        tl.store(grad_x_ptr + offsets, dx.to(grad_x_ptr.dtype.element_ty), mask=mask)
        if PARAM_GRADS:
            grad_w_acc += dy * x_hat
            grad_b_acc += dy
        row_block += n_programs

    if PARAM_GRADS:
        # Every program writes its rows, even one that handled no rows, so the host sum never reads garbage.
        partial = grad_params_partial_ptr + program.to(tl.int64) * 2 * n_cols + offs_c
        tl.store(partial, tl.sum(grad_w_acc, axis=0), mask=col_mask)
        tl.store(partial + n_cols, tl.sum(grad_b_acc, axis=0), mask=col_mask)
