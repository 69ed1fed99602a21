"""Fixed-order column sums of the weight-gradient partial rows (one fp32 row per backward program).

The backward passes leave one partial row per program, hundreds of thousands of rows on the large graphs;
torch's sum over dim 0 of such a tall, narrow tensor ran at about a third of copy bandwidth (benchmarks/NOTES.md,
v5). Here each program sums a contiguous block of rows with a [BLOCK_R, BLOCK_C] accumulator, in an order fixed
by the launch, so the weight gradients stay bitwise reproducible; torch then sums the few block rows.
"""

import triton
import triton.language as tl


@triton.jit
def column_sum_kernel(
    rows_ptr,  # [n_rows, C] fp32
    sums_ptr,  # [programs, C] fp32 out: the column sums of each program's block of rows
    n_rows,
    C,
    rows_per_program,  # a multiple of BLOCK_R
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    offs_r = tl.arange(0, BLOCK_R)
    offs_c = tl.arange(0, BLOCK_C)
    col_mask = offs_c < C
    first = tl.program_id(0) * rows_per_program
    end = tl.minimum(first + rows_per_program, n_rows)
    acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    row = first
    while row < end:
        rows = row + offs_r
        mask = (rows < end)[:, None] & col_mask[None, :]
        acc += tl.load(rows_ptr + rows.to(tl.int64)[:, None] * C + offs_c[None, :], mask=mask, other=0.0)
        row += BLOCK_R
    tl.store(sums_ptr + tl.program_id(0) * C + offs_c, tl.sum(acc, axis=0), mask=col_mask)
