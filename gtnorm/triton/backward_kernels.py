"""Backward of the graph-transformer attention in two passes, each aware of the Q/K norm (RMSNorm or LayerNorm).

Notation per head: q' = norm(q) * w_q (+ b_q), k' = norm(k) * w_k (+ b_k), s_ij = <q'_i, k'_j + e_ij> / sqrt(C),
a_ij = softmax_j(s_ij), out_i = sum_j a_ij (v_j + e_ij), dO = dL/dout.

Each pass walks, per program, one contiguous stretch of edges that holds a run of consecutive node slots
(GraphLayout), one edge per step, finishing a node at its last edge and restarting its sums there (zeros once
per node in that branch, not a select at every edge: both passes ~5 % faster, benchmarks/NOTES.md v39): one
loop over the stretch, not one per node, lets Triton's software pipeliner keep the next edges' rows in flight
across node boundaries (sources of the encoders have ~1.6 edges, too few to hide a load's latency on their own).

Pass 1, by destination:
    da_ij = <dO_i, v_j + e_ij>,   D_i = sum_j a_ij da_ij / sum_j a_ij   (= <dO_i, out_i>, from fp32 terms)
    dq'_i = sum_j a_ij (da_ij - D_i) (k'_j + e_ij) / sqrt(C) = (A_i - (D_i - c_i) B_i) / sqrt(C)
        with A_i = sum_j a_ij (da_ij - c_i) (k'_j + e_ij), B_i = sum_j a_ij (k'_j + e_ij) and any shift c_i
        (the first edge's da: the terms then shrink to the spread of da),
    so a single sweep over the edges suffices and no copy of out is needed: nothing cancels in low
    precision, because D is never rebuilt from a rounded output. a_ij and da_ij go to fp32 scratch [M, H]
    (small next to e), D_i to [N_dst, H]. This is the only pass that reads the edge features.
Pass 2, by source:
    dS_ij = a_ij (da_ij - D_i),  dv_j = sum_i a_ij dO_i,  dk'_j = sum_i dS_ij q'_i / sqrt(C),
    de_ij = a_ij dO_i + dS_ij q'_i / sqrt(C)   (written in the caller's edge order).
Each pass finishes a node with the norm's backward of its row (from the raw q or k and its statistics: rstd, and
the mean for LayerNorm) and adds that row's weight and bias gradient terms to an fp32 partial row of its
own ([weight | bias] columns, one row per program); the host sums the partial rows in a fixed order, so the
parameter gradients are bitwise reproducible.
The query's statistics are reduced once per destination, by pass 1, which leaves them in fp32 scratch [N_dst, 2, H]
(mean, rstd) for pass 2 and the edge projection's kernels: pass 2 gathers q at every edge, and reducing each
gathered row over C again cost that pass more than its loads (LayerNorm: two reductions per row). Where pass 2
writes no de (no edge rows), it leaves q's affine out of its per-edge sums: dk' = w_q * sum_i dS_ij rstd_i
(q_i - mean_i) / sqrt(C) + b_q sum_i dS_ij / sqrt(C).

With EDGE_PROJ (e = x W + b from raw attributes x, edge_projection.py) neither pass reads or writes an [H, C] row
per edge. Pass 1 takes e's terms of the scores and of da from the edge's D attributes and the node's q' and dO
projected onto W ([H, D + 1] per node, node_projection_kernels.py), and leaves per destination
P = sum_j a x and S = sum_j dS x / sqrt(C): S W is e's term of dq' (added with the norm's backward for blocks of
nodes, node_projection_kernels.py), and P and S give dW and db (edge_weight_grad_kernel.py) and, with a and da,
d edge_features (edge_features_grad_kernel.py). Pass 2 is then the one without edge features.
"""

import triton
import triton.language as tl

from gtnorm.triton.edge_projection import feature_tile_offsets, features_dot, load_edge_features
from gtnorm.triton.tiles import (
    NORM_LAYER,
    NORM_NONE,
    load_norm_param,
    load_norm_stats,
    load_row,
    norm_apply,
    norm_stats,
    normalize_heads,
    normalize_heads_backward,
    program_edge_run,
    row_tile_offsets,
    store_param_grad_partial,
    store_row,
    store_streamed_row,
    walk_position,
)


@triton.jit
def _by_destination_step(
    delta, shift, a_sum, acc_a, acc_b, mean_q, rstd_q, grad_w_q, grad_b_q, feature_a, feature_a_da, pos, start, end,
    query_ptr, key_ptr, value_ptr, edge_attr_ptr, edge_features_ptr, query_proj_ptr, grad_out_proj_ptr,
    csc_dst_ptr, csc_src_ptr, csc_edge_id_ptr, grad_out_ptr, lse_ptr, grad_query_ptr, attn_ptr, grad_attn_ptr,
    delta_ptr, query_stats_ptr, feature_sums_ptr, w_q, b_q, w_k, b_k, offsets, mask, offs_h, feature_offsets,
    feature_mask, H, row_len, C, score_scale, sm_scale, eps_q, eps_k, HAS_EDGE_ATTR: tl.constexpr,
    EDGE_PROJ: tl.constexpr, EDGE_DIM: tl.constexpr, HAS_EDGE_BIAS: tl.constexpr, NORM: tl.constexpr,
    HAS_Q_WEIGHT: tl.constexpr, HAS_Q_BIAS: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Folds the edge at by-destination position pos into its node's sums (delta = sum a (da - shift), a_sum,
    A, B; [BLOCK_H] or [BLOCK_H, BLOCK_C]) and stores its a and da; at the node's last edge, writes dq and D.
    mean_q and rstd_q [BLOCK_H, 1] are the node's query statistics, set at its first edge.

    With EDGE_PROJ the edge features enter through the edge's extended attributes x (edge_projection.py) and the
    node's q' and dO projected onto the edge weights ([BLOCK_H, BLOCK_D] rows of query_proj and grad_out_proj);
    feature_a = sum a x and feature_a_da = sum a (da - shift) x [BLOCK_H, BLOCK_D] stand for e in A and B. At the
    node's last edge it writes P = sum_j a x and S = sum_j dS x / sqrt(C), and dq without e's term S W (module
    docstring)."""
    node, first, last = walk_position(csc_dst_ptr, pos, start, end)
    src = tl.load(csc_src_ptr + pos)
    edge_id = tl.load(csc_edge_id_ptr + pos)
    head_mask = offs_h < H
    # The destination's rows are re-read at every edge (cache hits after the first): holding them across
    # edges would need loads inside a branch, which the pipeliner cannot prefetch. The query's rstd is
    # carried instead (with LayerNorm's mean): their reductions over C run once per node, not once per edge.
    q_raw = load_row(query_ptr, node, offsets, mask, row_len)
    q = q_raw
    if NORM != NORM_NONE:
        if first:
            mean_q, rstd_q = norm_stats(q_raw, C, eps_q, NORM)
        q = norm_apply(q_raw, mean_q, rstd_q, w_q[None, :], b_q[None, :], NORM)
    d_out = load_row(grad_out_ptr, node, offsets, mask, row_len)
    lse = tl.load(lse_ptr + node.to(tl.int64) * H + offs_h, mask=head_mask, other=0.0)
    k = normalize_heads(load_row(key_ptr, src, offsets, mask, row_len), w_k, b_k, C, eps_k, NORM)
    v = load_row(value_ptr, src, offsets, mask, row_len)
    if HAS_EDGE_ATTR:
        e = load_row(edge_attr_ptr, edge_id, offsets, mask, row_len)
        k += e
        v += e
    score = tl.sum(q * k, axis=1)  # [BLOCK_H]
    da = tl.sum(d_out * v, axis=1)
    if EDGE_PROJ:
        # Re-read at every edge like the query row (cache hits after the first), for the same reason.
        feature_row = node.to(tl.int64) * (H * (EDGE_DIM + HAS_EDGE_BIAS)) + feature_offsets
        q_proj = tl.load(query_proj_ptr + feature_row, mask=feature_mask, other=0.0)
        d_out_proj = tl.load(grad_out_proj_ptr + feature_row, mask=feature_mask, other=0.0)
        x = load_edge_features(edge_features_ptr, edge_id, EDGE_DIM, HAS_EDGE_BIAS, BLOCK_D)
        score += features_dot(q_proj, x)
        da += features_dot(d_out_proj, x)
    a = tl.exp2(score * score_scale - lse)  # [BLOCK_H]
    # Accumulate a (da - c) with c = the node's first da: A - D B is unchanged in exact arithmetic, but the
    # terms shrink to the spread of da, so equal messages give exactly 0 and large norm weights do not
    # magnify rounding into dq.
    shift = tl.where(first, da, shift)
    a_da = a * (da - shift)
    delta += a_da
    a_sum += a
    acc_a += a_da[:, None] * k
    acc_b += a[:, None] * k
    if EDGE_PROJ:
        feature_a += a[:, None] * x[None, :]
        feature_a_da += a_da[:, None] * x[None, :]
    edge_head = edge_id.to(tl.int64) * H + offs_h
    tl.store(attn_ptr + edge_head, a, mask=head_mask)
    tl.store(grad_attn_ptr + edge_head, da, mask=head_mask)
    if last:
        # D over sum(a) rather than over 1: the same number in exact arithmetic, but it makes dS = a (da - D)
        # sum to exactly what the recomputed a gives, so equal messages still give dS = 0 when the softmax
        # is sharp and a carries the rounding of large scores.
        node_delta = delta / a_sum
        if EDGE_PROJ:
            # de_ij = a_ij dO_i + dS_ij q'_i / sqrt(C), so the edge weights' gradient sum_ij x_ij^T de_ij is
            # sum_i (sum_j a_ij x_ij)^T dO_i + (sum_j dS_ij x_ij)^T q'_i / sqrt(C), with
            # sum_j dS_ij x_ij = sum_j a_ij (da_ij - shift) x_ij - (D_i - shift) sum_j a_ij x_ij.
            # e's term of dq', (sum_j dS_ij x_ij) W / sqrt(C), is that second sum expanded.
            sums_row = feature_sums_ptr + node.to(tl.int64) * (2 * H * (EDGE_DIM + HAS_EDGE_BIAS))
            tl.store(sums_row + feature_offsets, feature_a, mask=feature_mask)
            grad_s_x = (feature_a_da - node_delta[:, None] * feature_a) * sm_scale
            tl.store(sums_row + H * (EDGE_DIM + HAS_EDGE_BIAS) + feature_offsets, grad_s_x, mask=feature_mask)
        grad_q = (acc_a - node_delta[:, None] * acc_b) * sm_scale
        if NORM != NORM_NONE:
            grad_q_norm = grad_q  # dL/dq', [BLOCK_H, BLOCK_C]
            grad_q, q_hat = normalize_heads_backward(q_raw, mean_q, rstd_q, w_q[None, :], grad_q_norm, mask, C, NORM)
            if HAS_Q_WEIGHT:
                grad_w_q += tl.sum(grad_q_norm * q_hat, axis=0)
            if HAS_Q_BIAS:
                grad_b_q += tl.sum(grad_q_norm, axis=0)
        store_row(grad_query_ptr, node, offsets, mask, row_len, grad_q)
        tl.store(delta_ptr + node.to(tl.int64) * H + offs_h, node_delta + shift, mask=head_mask)
        if NORM != NORM_NONE:
            stats_row = query_stats_ptr + node.to(tl.int64) * (2 * H) + offs_h[:, None]
            tl.store(stats_row, mean_q, mask=head_mask[:, None])
            tl.store(stats_row + H, rstd_q, mask=head_mask[:, None])
        # The sums restart here, at the node's last edge (module docstring).
        delta = tl.zeros_like(delta)
        a_sum = tl.zeros_like(a_sum)
        acc_a = tl.zeros_like(acc_a)
        acc_b = tl.zeros_like(acc_b)
        if EDGE_PROJ:
            feature_a = tl.zeros_like(feature_a)
            feature_a_da = tl.zeros_like(feature_a_da)
    return delta, shift, a_sum, acc_a, acc_b, mean_q, rstd_q, grad_w_q, grad_b_q, feature_a, feature_a_da


@triton.jit
def edge_softmax_backward_by_destination_kernel(
    query_ptr,  # [N_dst, H, C]
    key_ptr,  # [N_src, H, C]
    value_ptr,  # [N_src, H, C]
    edge_attr_ptr,  # [M, H, C] caller's edge order (unused without HAS_EDGE_ATTR)
    edge_features_ptr,  # [M, EDGE_DIM] caller's edge order (unused without EDGE_PROJ)
    query_proj_ptr,  # [N_dst, H, EDGE_DIM + HAS_EDGE_BIAS] fp32: <q', W_d> (unused without EDGE_PROJ)
    grad_out_proj_ptr,  # [N_dst, H, EDGE_DIM + HAS_EDGE_BIAS] fp32: <dO, W_d> (unused without EDGE_PROJ)
    q_weight_ptr,  # [C]
    q_bias_ptr,  # [C]
    k_weight_ptr,  # [C]
    k_bias_ptr,  # [C]
    dst_offsets_ptr,  # [N_dst + 1] int32, by slot
    csc_dst_ptr,  # [M] int32
    csc_src_ptr,  # [M] int32
    csc_edge_id_ptr,  # [M] int32
    grad_out_ptr,  # [N_dst, H, C]
    lse_ptr,  # [N_dst, H] fp32 from the forward
    grad_query_ptr,  # [N_dst, H, C] out; rows of nodes without edges are left to the caller
    attn_ptr,  # [M, H] fp32 out: a, by caller's edge id
    grad_attn_ptr,  # [M, H] fp32 out: da = <dO, v + e>, by caller's edge id
    delta_ptr,  # [N_dst, H] fp32 out: D
    query_stats_ptr,  # [N_dst, 2, H] fp32 out: the query norm's mean (0 for RMSNorm) and rstd (unused with NORM_NONE)
    feature_sums_ptr,  # [N_dst, 2, H, EDGE_DIM + HAS_EDGE_BIAS] fp32 out: P, S (unused without EDGE_PROJ)
    q_param_grad_partial_ptr,  # [programs, partial_width] fp32 out: [weight | bias] columns, a row per program
    q_partial_width,  # C for each of the query norm's weight and bias that exists
    num_slots,  # destinations with edges (they hold the first slots)
    nodes_per_program,
    H,
    # A constexpr: the channel masks fold away where C == BLOCK_C (LayerNorm's padding-lane select with them), and the
    # address arithmetic is simpler; 4-10 % faster than with C at run time (benchmarks/NOTES.md, v11).
    C: tl.constexpr,
    score_scale,  # log2(e) / sqrt(C): the forward's log2-domain scores
    sm_scale,  # 1 / sqrt(C)
    eps_q,
    eps_k,
    HAS_EDGE_ATTR: tl.constexpr,
    EDGE_PROJ: tl.constexpr,  # edge features projected from edge_features inside the kernel (edge_projection.py)
    EDGE_DIM: tl.constexpr,  # D, the raw attributes per edge (0 without EDGE_PROJ)
    HAS_EDGE_BIAS: tl.constexpr,
    NORM: tl.constexpr,  # tiles.NORM_NONE / NORM_RMS / NORM_LAYER
    HAS_Q_WEIGHT: tl.constexpr,
    HAS_Q_BIAS: tl.constexpr,
    HAS_K_WEIGHT: tl.constexpr,
    HAS_K_BIAS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_D: tl.constexpr,  # EDGE_DIM + HAS_EDGE_BIAS padded to a power of two (1 without EDGE_PROJ)
    NUM_STAGES: tl.constexpr,
):
    row_len = H * C
    # Heads are independent (the norm is per head), so a program may take a group of BLOCK_H of them.
    offsets, mask, offs_h = row_tile_offsets(tl.program_id(1) * BLOCK_H, H, C, BLOCK_H, BLOCK_C)
    w_q = load_norm_param(q_weight_ptr, C, HAS_Q_WEIGHT, 1.0, BLOCK_C)
    b_q = load_norm_param(q_bias_ptr, C, HAS_Q_BIAS, 0.0, BLOCK_C)
    w_k = load_norm_param(k_weight_ptr, C, HAS_K_WEIGHT, 1.0, BLOCK_C)
    b_k = load_norm_param(k_bias_ptr, C, HAS_K_BIAS, 0.0, BLOCK_C)
    start, end = program_edge_run(dst_offsets_ptr, nodes_per_program, num_slots)
    feature_offsets, feature_mask = feature_tile_offsets(
        tl.program_id(1) * BLOCK_H, H, EDGE_DIM + HAS_EDGE_BIAS, BLOCK_H, BLOCK_D
    )

    feature_a = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    feature_a_da = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    grad_w_q = tl.zeros([BLOCK_C], tl.float32)
    grad_b_q = tl.zeros([BLOCK_C], tl.float32)
    delta = tl.zeros([BLOCK_H], tl.float32)
    shift = tl.zeros([BLOCK_H], tl.float32)
    a_sum = tl.zeros([BLOCK_H], tl.float32)
    acc_a = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    acc_b = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    mean_q = tl.zeros([BLOCK_H, 1], tl.float32)
    rstd_q = tl.full([BLOCK_H, 1], 1.0, tl.float32)
    for pos in tl.range(start, end, num_stages=NUM_STAGES):
        (
            delta, shift, a_sum, acc_a, acc_b, mean_q, rstd_q, grad_w_q, grad_b_q, feature_a, feature_a_da,
        ) = _by_destination_step(
            delta, shift, a_sum, acc_a, acc_b, mean_q, rstd_q, grad_w_q, grad_b_q, feature_a, feature_a_da, pos, start,
            end, query_ptr, key_ptr, value_ptr, edge_attr_ptr, edge_features_ptr, query_proj_ptr,
            grad_out_proj_ptr, csc_dst_ptr, csc_src_ptr, csc_edge_id_ptr, grad_out_ptr, lse_ptr, grad_query_ptr,
            attn_ptr, grad_attn_ptr, delta_ptr, query_stats_ptr, feature_sums_ptr, w_q, b_q, w_k, b_k, offsets, mask,
            offs_h, feature_offsets, feature_mask, H, row_len, C, score_scale, sm_scale, eps_q, eps_k, HAS_EDGE_ATTR,
            EDGE_PROJ, EDGE_DIM, HAS_EDGE_BIAS, NORM, HAS_Q_WEIGHT, HAS_Q_BIAS, BLOCK_D,
        )  # fmt: skip

    if NORM != NORM_NONE:
        store_param_grad_partial(
            q_param_grad_partial_ptr, tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), q_partial_width,
            grad_w_q, grad_b_q, C, HAS_Q_WEIGHT, HAS_Q_BIAS, BLOCK_C,
        )  # fmt: skip


@triton.jit
def _by_source_step(
    grad_v, grad_k, grad_k_bias, grad_w_k, grad_b_k, pos, start, end, query_ptr, key_ptr, csr_src_ptr, csr_dst_ptr,
    csr_edge_id_ptr, grad_out_ptr, attn_ptr, grad_attn_ptr, delta_ptr, query_stats_ptr, grad_key_ptr, grad_value_ptr,
    grad_edge_attr_ptr, w_q, b_q, w_k, offsets, mask, offs_h, H, row_len, C, sm_scale, eps_k,
    HAS_EDGE_ATTR: tl.constexpr, NORM: tl.constexpr, HAS_Q_BIAS: tl.constexpr, HAS_K_WEIGHT: tl.constexpr,
    HAS_K_BIAS: tl.constexpr,
):
    """Adds the edge at by-source position pos to its source's dv and dk' [BLOCK_H, BLOCK_C] and writes its de;
    at the source's last edge, writes its dk and dv. Without edge rows and with a norm, grad_k holds
    sum dS rstd_q (q - mean_q) / sqrt(C) and grad_k_bias [BLOCK_H] sum dS / sqrt(C), q's affine applied at the
    source's last edge (module docstring)."""
    node, first, last = walk_position(csr_src_ptr, pos, start, end)
    dst = tl.load(csr_dst_ptr + pos)
    edge_id = tl.load(csr_edge_id_ptr + pos)
    head_mask = offs_h < H
    edge_head = edge_id.to(tl.int64) * H + offs_h
    a = tl.load(attn_ptr + edge_head, mask=head_mask, other=0.0)
    da = tl.load(grad_attn_ptr + edge_head, mask=head_mask, other=0.0)
    delta = tl.load(delta_ptr + dst.to(tl.int64) * H + offs_h, mask=head_mask, other=0.0)
    d_out = load_row(grad_out_ptr, dst, offsets, mask, row_len)
    q = load_row(query_ptr, dst, offsets, mask, row_len)
    grad_s = a * (da - delta) * sm_scale  # [BLOCK_H], dS / sqrt(C)
    a_d_out = a[:, None] * d_out
    grad_v += a_d_out
    coef = grad_s[:, None]  # [BLOCK_H, 1]: what multiplies q in dk'
    if NORM != NORM_NONE:
        stats_offsets = dst.to(tl.int64) * (2 * H) + offs_h[:, None]  # [BLOCK_H, 1]
        mean_q, rstd_q = load_norm_stats(query_stats_ptr, stats_offsets, head_mask[:, None], H, NORM)
        if HAS_EDGE_ATTR:
            q = norm_apply(q, mean_q, rstd_q, w_q[None, :], b_q[None, :], NORM)
        else:
            if NORM == NORM_LAYER:
                q -= mean_q
            grad_k_bias += grad_s
            coef = coef * rstd_q
    grad_s_q = coef * q
    grad_k += grad_s_q
    if HAS_EDGE_ATTR:
        store_streamed_row(grad_edge_attr_ptr, edge_id, offsets, mask, row_len, a_d_out + grad_s_q)
    if NORM != NORM_NONE:
        # Loaded outside the branch so that the pipeliner prefetches it, masked so that only a node's last edge
        # moves bytes (tl.where: the interpreter cannot AND a block mask with a scalar flag).
        k_raw = load_row(key_ptr, node, offsets, tl.where(last, mask, False), row_len)
    if last:
        grad_key = grad_k
        if NORM != NORM_NONE:
            grad_k_norm = grad_k  # dL/dk'
            if not HAS_EDGE_ATTR:
                grad_k_norm = grad_k * w_q[None, :]
                if HAS_Q_BIAS:
                    grad_k_norm += grad_k_bias[:, None] * b_q[None, :]
            mean_k, rstd_k = norm_stats(k_raw, C, eps_k, NORM)
            grad_key, k_hat = normalize_heads_backward(k_raw, mean_k, rstd_k, w_k[None, :], grad_k_norm, mask, C, NORM)
            if HAS_K_WEIGHT:
                grad_w_k += grad_k_norm * k_hat
            if HAS_K_BIAS:
                grad_b_k += grad_k_norm
        store_streamed_row(grad_key_ptr, node, offsets, mask, row_len, grad_key)
        store_streamed_row(grad_value_ptr, node, offsets, mask, row_len, grad_v)
        # Restarted at the node's last edge (as in the by-destination pass).
        grad_v = tl.zeros_like(grad_v)
        grad_k = tl.zeros_like(grad_k)
        grad_k_bias = tl.zeros_like(grad_k_bias)
    return grad_v, grad_k, grad_k_bias, grad_w_k, grad_b_k


@triton.jit
def edge_softmax_backward_by_source_kernel(
    query_ptr,  # [N_dst, H, C]
    key_ptr,  # [N_src, H, C]
    q_weight_ptr,  # [C]
    q_bias_ptr,  # [C]
    k_weight_ptr,  # [C]
    src_offsets_ptr,  # [N_src + 1] int32, by slot
    csr_src_ptr,  # [M] int32
    csr_dst_ptr,  # [M] int32
    csr_edge_id_ptr,  # [M] int32
    grad_out_ptr,  # [N_dst, H, C]
    attn_ptr,  # [M, H] fp32: a, by caller's edge id
    grad_attn_ptr,  # [M, H] fp32: da, by caller's edge id
    delta_ptr,  # [N_dst, H] fp32: D
    query_stats_ptr,  # [N_dst, 2, H] fp32: the query norm's mean and rstd, from pass 1 (unused with NORM_NONE)
    grad_key_ptr,  # [N_src, H, C] out; rows of nodes without edges are left to the caller
    grad_value_ptr,  # [N_src, H, C] out, likewise
    grad_edge_attr_ptr,  # [M, H, C] caller's edge order (unused without HAS_EDGE_ATTR)
    k_param_grad_partial_ptr,  # [programs, partial_width] fp32 out: [weight | bias] columns, a row per program
    k_partial_width,  # C for each of the key norm's weight and bias that exists
    num_slots,  # sources with edges (they hold the first slots)
    nodes_per_program,
    H,
    C: tl.constexpr,  # a constexpr, as in the by-destination kernel
    sm_scale,  # 1 / sqrt(C)
    eps_k,
    HAS_EDGE_ATTR: tl.constexpr,
    NORM: tl.constexpr,  # tiles.NORM_NONE / NORM_RMS / NORM_LAYER
    HAS_Q_WEIGHT: tl.constexpr,
    HAS_Q_BIAS: tl.constexpr,
    HAS_K_WEIGHT: tl.constexpr,
    HAS_K_BIAS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    row_len = H * C
    offsets, mask, offs_h = row_tile_offsets(tl.program_id(1) * BLOCK_H, H, C, BLOCK_H, BLOCK_C)
    w_q = load_norm_param(q_weight_ptr, C, HAS_Q_WEIGHT, 1.0, BLOCK_C)
    b_q = load_norm_param(q_bias_ptr, C, HAS_Q_BIAS, 0.0, BLOCK_C)
    w_k = load_norm_param(k_weight_ptr, C, HAS_K_WEIGHT, 1.0, BLOCK_C)
    start, end = program_edge_run(src_offsets_ptr, nodes_per_program, num_slots)

    # Per head and channel: summed over the heads once per program, not at every source (sources of the encoders
    # have 1.6 edges), which measured 1 % faster there and took 26 fewer registers (NOTES v5).
    grad_w_k = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    grad_b_k = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    grad_v = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    grad_k = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    grad_k_bias = tl.zeros([BLOCK_H], tl.float32)
    for pos in tl.range(start, end, num_stages=NUM_STAGES):
        grad_v, grad_k, grad_k_bias, grad_w_k, grad_b_k = _by_source_step(
            grad_v, grad_k, grad_k_bias, grad_w_k, grad_b_k, pos, start, end, query_ptr, key_ptr, csr_src_ptr,
            csr_dst_ptr, csr_edge_id_ptr, grad_out_ptr, attn_ptr, grad_attn_ptr, delta_ptr, query_stats_ptr,
            grad_key_ptr, grad_value_ptr, grad_edge_attr_ptr, w_q, b_q, w_k, offsets, mask, offs_h, H, row_len, C,
            sm_scale, eps_k, HAS_EDGE_ATTR, NORM, HAS_Q_BIAS, HAS_K_WEIGHT, HAS_K_BIAS,
        )  # fmt: skip

    if NORM != NORM_NONE:
        store_param_grad_partial(
            k_param_grad_partial_ptr, tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), k_partial_width,
            tl.sum(grad_w_k, axis=0), tl.sum(grad_b_k, axis=0), C, HAS_K_WEIGHT, HAS_K_BIAS, BLOCK_C,
        )  # fmt: skip
