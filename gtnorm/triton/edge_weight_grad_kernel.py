"""Gradient of the fused edge projection's weight and bias, from per-destination sums of the backward.

With e_ij = x_ij W + b (x extended by a constant 1, W by b as its last row: edge_projection.py) and
de_ij = a_ij dO_i + dS_ij q'_i / sqrt(C), the gradient of the extended weight is

    dW[d, h, c] = sum_i P_i[h, d] dO_i[h, c] + S_i[h, d] q'_i[h, c]
    with P_i = sum_j a_ij x_ij,  S_i = sum_j dS_ij x_ij / sqrt(C)   ([H, D + 1] per destination),

which the by-destination pass leaves per destination (backward_kernels.py). Summed per edge it would need a
[D, H*C] fp32 accumulator per program (11 x 1024 fp32 at Anemoi's sizes: far past a program's registers) or as
many partial rows per program (~900 MB on the large graphs); grouped by destination it is, per head, a product of
[D + 1, N_dst] by [N_dst, C] matrices, which tl.dot runs on the tensor cores. Each program takes one head and one
stretch of destinations and writes one [D + 1, C] partial block; there are at most a few per SM (config.py), so
the partials stay a few MB, and the host sums them over the stretches in a fixed order: bitwise reproducible.
Heads wider than the plan's channel tile take one program per tile of BLOCK_C channels (grid axis 2, CHUNKED). The
query's norm statistics come from the by-destination pass (backward_kernels.py), so a tile of q is normalised
without reading the rest of its row.
"""

import triton
import triton.language as tl

from gtnorm.triton.tiles import NORM_NONE, load_norm_param, load_norm_stats, norm_apply


@triton.jit
def edge_weight_grad_kernel(
    feature_sums_ptr,  # [N_dst, 2, H, D1] fp32: P then S (module docstring); rows of nodes without edges are 0
    query_ptr,  # [N_dst, H, C]
    query_stats_ptr,  # [N_dst, 2, H] fp32: the query norm's mean and rstd (unused with NORM_NONE)
    grad_out_ptr,  # [N_dst, H, C]
    q_weight_ptr,  # [C] (unused without HAS_Q_WEIGHT)
    q_bias_ptr,  # [C] (unused without HAS_Q_BIAS)
    partial_ptr,  # [programs along N_dst, D1, H * C] fp32 out
    num_nodes,
    nodes_per_program,  # a multiple of BLOCK_N
    H,
    C,
    D1: tl.constexpr,  # extended rows of the weight: D, plus 1 with a bias
    NORM: tl.constexpr,  # tiles.NORM_NONE / NORM_RMS / NORM_LAYER
    HAS_Q_WEIGHT: tl.constexpr,
    HAS_Q_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,  # D1 padded to a power of two, at least 16 (tl.dot)
    BLOCK_C: tl.constexpr,  # channels per tile: C padded to a power of two (at least 16), or fewer with CHUNKED
    CHUNKED: tl.constexpr,  # BLOCK_C < C: this program's tile c0 = program_id(2) * BLOCK_C of the head's channels
):
    head = tl.program_id(1)
    c0 = tl.program_id(2) * BLOCK_C
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = c0 + tl.arange(0, BLOCK_C)
    w_q = load_norm_param(q_weight_ptr + c0, C - c0, HAS_Q_WEIGHT, 1.0, BLOCK_C)
    b_q = load_norm_param(q_bias_ptr + c0, C - c0, HAS_Q_BIAS, 0.0, BLOCK_C)
    first = tl.program_id(0) * nodes_per_program
    end = tl.minimum(first + nodes_per_program, num_nodes)
    acc = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
    for row in tl.range(first, end, BLOCK_N):
        nodes = (row + offs_n).to(tl.int64)
        node_mask = nodes < end
        sums_mask = node_mask[:, None] & (offs_d[None, :] < D1)
        sums_ptr = feature_sums_ptr + nodes[:, None] * (2 * H * D1) + head * D1 + offs_d[None, :]
        attn_sum = tl.load(sums_ptr, mask=sums_mask, other=0.0)  # [BLOCK_N, BLOCK_D]: P
        grad_s_sum = tl.load(sums_ptr + H * D1, mask=sums_mask, other=0.0)  # S
        row_mask = node_mask[:, None] & (offs_c[None, :] < C)
        row_offsets = nodes[:, None] * (H * C) + head * C + offs_c[None, :]
        d_out = tl.load(grad_out_ptr + row_offsets, mask=row_mask, other=0.0).to(tl.float32)  # [BLOCK_N, BLOCK_C]
        q = tl.load(query_ptr + row_offsets, mask=row_mask, other=0.0).to(tl.float32)
        if NORM != NORM_NONE:
            stats_offsets = nodes[:, None] * (2 * H) + head  # [BLOCK_N, 1]
            mean, rstd = load_norm_stats(query_stats_ptr, stats_offsets, node_mask[:, None], H, NORM)
            q = norm_apply(q, mean, rstd, w_q, b_q, NORM)
        # tf32x3: fp32 accuracy (three tf32 products) at tensor-core speed; plain tf32 would round dW to ~1e-3.
        acc += tl.dot(tl.trans(attn_sum), d_out, input_precision="tf32x3")
        acc += tl.dot(tl.trans(grad_s_sum), q, input_precision="tf32x3")
    out_ptr = partial_ptr + tl.program_id(0).to(tl.int64) * (D1 * H * C) + offs_d[:, None] * (H * C) + head * C
    tl.store(out_ptr + offs_c[None, :], acc, mask=(offs_d[:, None] < D1) & (offs_c[None, :] < C))
