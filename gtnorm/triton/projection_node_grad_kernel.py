"""The fused edge projection's backward per destination node: the edge weights' gradient and e's term of dq, from
per-destination sums of the by-destination pass, in one sweep over blocks of nodes.

With e_ij = x_ij W + b (x extended by a constant 1, W by b as its last row: edge_projection.py) and
de_ij = a_ij dO_i + dS_ij q'_i / sqrt(C), the by-destination pass leaves per destination ([H, D + 1] each)

    P_i = sum_j a_ij x_ij,   S_i = sum_j dS_ij x_ij / sqrt(C)   (backward_kernels.py),

and what is left is, per head:

    dW[d, h, c] = sum_i P_i[h, d] dO_i[h, c] + S_i[h, d] q'_i[h, c]  a product of [D + 1, N_dst] by [N_dst, C];
    dq'_i      += S_i W_h                                            e's term of dq', a [D + 1] x [D + 1, C] product,

the second passed through the query norm's backward (linear in dq', so it adds to the by-destination pass's dq)
with its terms of the norm's weight and bias gradients. Both need the destination's q (normalised) and S, so one
sweep reads them once. Summed per edge, dW would need a [D + 1, H*C] fp32 accumulator per program (far past a
program's registers) or as many partial rows per program (~900 MB on the large graphs); grouped by destination
the reduction over edges has already happened. Each program takes one head and one stretch of destinations, runs
the products on the tensor cores (tl.dot), and writes one [D + 1, C] block of dW partials and one row of norm
partials; there are a few programs per SM (config.py), so the partials stay a few MB, and the host sums them over
the stretches in a fixed order: bitwise reproducible.
"""

import triton
import triton.language as tl

from gtnorm.triton.node_projection_kernels import extended_weight_tile
from gtnorm.triton.tiles import NORM_NONE, load_norm_param, norm_apply, norm_stats, normalize_heads_backward


@triton.jit
def projection_node_grad_kernel(
    feature_sums_ptr,  # [N_dst, 2, H, D1] fp32: P then S (module docstring); rows of nodes without edges are 0
    query_ptr,  # [N_dst, H, C]
    grad_out_ptr,  # [N_dst, H, C]
    edge_weight_ptr,  # [D, H * C], strides (w_stride_d, w_stride_hc)
    edge_bias_ptr,  # [H * C] (unused without HAS_EDGE_BIAS)
    w_stride_d,
    w_stride_hc,
    q_weight_ptr,  # [C] (unused without HAS_Q_WEIGHT)
    q_bias_ptr,  # [C] (unused without HAS_Q_BIAS)
    grad_query_ptr,  # [N_dst, H, C]: the by-destination pass's dq, e's term added in place
    weight_partial_ptr,  # [programs along N_dst, D1, H * C] fp32 out
    q_partial_ptr,  # [rows, q_partial_width] fp32 out: a row per program after first_q_partial_row (with a norm)
    q_partial_width,
    first_q_partial_row,
    num_nodes,
    nodes_per_program,  # a multiple of BLOCK_N
    H,
    C,
    eps_q,
    D: tl.constexpr,
    HAS_EDGE_BIAS: tl.constexpr,
    NORM: tl.constexpr,  # tiles.NORM_NONE / NORM_RMS / NORM_LAYER
    HAS_Q_WEIGHT: tl.constexpr,
    HAS_Q_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,  # D1 padded to a power of two, at least 16 (tl.dot)
    BLOCK_C: tl.constexpr,  # C padded to a power of two, at least 16 (tl.dot)
):
    head = tl.program_id(1)
    d1 = D + HAS_EDGE_BIAS
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = tl.arange(0, BLOCK_C)
    w_q = load_norm_param(q_weight_ptr, C, HAS_Q_WEIGHT, 1.0, BLOCK_C)
    b_q = load_norm_param(q_bias_ptr, C, HAS_Q_BIAS, 0.0, BLOCK_C)
    weights = extended_weight_tile(
        edge_weight_ptr, edge_bias_ptr, w_stride_d, w_stride_hc, head, C, D, HAS_EDGE_BIAS, BLOCK_D, BLOCK_C
    )  # [BLOCK_D, BLOCK_C]
    first = tl.program_id(0) * nodes_per_program
    end = tl.minimum(first + nodes_per_program, num_nodes)
    grad_weight = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
    grad_w_q = tl.zeros([BLOCK_C], tl.float32)
    grad_b_q = tl.zeros([BLOCK_C], tl.float32)
    for row in tl.range(first, end, BLOCK_N):
        nodes = (row + offs_n).to(tl.int64)
        node_mask = nodes < end
        sums_mask = node_mask[:, None] & (offs_d[None, :] < d1)
        sums_ptr = feature_sums_ptr + nodes[:, None] * (2 * H * d1) + head * d1 + offs_d[None, :]
        attn_sum = tl.load(sums_ptr, mask=sums_mask, other=0.0)  # [BLOCK_N, BLOCK_D]: P
        grad_s_sum = tl.load(sums_ptr + H * d1, mask=sums_mask, other=0.0)  # S
        row_mask = node_mask[:, None] & (offs_c[None, :] < C)
        row_offsets = nodes[:, None] * (H * C) + head * C + offs_c[None, :]
        d_out = tl.load(grad_out_ptr + row_offsets, mask=row_mask, other=0.0).to(tl.float32)  # [BLOCK_N, BLOCK_C]
        q_raw = tl.load(query_ptr + row_offsets, mask=row_mask, other=0.0).to(tl.float32)
        grad_q = tl.load(grad_query_ptr + row_offsets, mask=row_mask, other=0.0).to(tl.float32)
        # tf32x3: fp32 accuracy (three tf32 products) at tensor-core speed; plain tf32 would round dW to ~1e-3.
        grad_q_norm = tl.dot(grad_s_sum, weights, input_precision="tf32x3")  # S W: e's term of dq'
        if NORM != NORM_NONE:
            mean, rstd = norm_stats(q_raw, row_mask, C, eps_q, NORM)
            q = norm_apply(q_raw, mean, rstd, w_q[None, :], b_q[None, :], row_mask, NORM)
            grad_q_term, q_hat = normalize_heads_backward(
                q_raw, mean, rstd, w_q[None, :], grad_q_norm, row_mask, C, NORM
            )  # fmt: skip
            grad_w_q += tl.sum(grad_q_norm * q_hat, axis=0)
            grad_b_q += tl.sum(grad_q_norm, axis=0)
        else:
            q = q_raw
            grad_q_term = grad_q_norm
        grad_q += grad_q_term
        tl.store(grad_query_ptr + row_offsets, grad_q.to(grad_query_ptr.dtype.element_ty), mask=row_mask)
        grad_weight += tl.dot(tl.trans(attn_sum), d_out, input_precision="tf32x3")
        grad_weight += tl.dot(tl.trans(grad_s_sum), q, input_precision="tf32x3")
    out_ptr = weight_partial_ptr + tl.program_id(0).to(tl.int64) * (d1 * H * C) + offs_d[:, None] * (H * C) + head * C
    tl.store(out_ptr + offs_c[None, :], grad_weight, mask=(offs_d[:, None] < d1) & (offs_c[None, :] < C))
    if NORM != NORM_NONE:
        partial_row = first_q_partial_row + tl.program_id(0) * tl.num_programs(1) + head
        row_ptr = q_partial_ptr + partial_row.to(tl.int64) * q_partial_width
        if HAS_Q_WEIGHT:
            tl.store(row_ptr + offs_c, grad_w_q, mask=offs_c < C)
        if HAS_Q_BIAS:
            tl.store(row_ptr + (q_partial_width - C) + offs_c, grad_b_q, mask=offs_c < C)
