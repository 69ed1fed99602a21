"""Backward of the graph-transformer attention in two passes, each RMSNorm-aware.

Notation per head: q' = rmsnorm(q) * w_q, k' = rmsnorm(k) * w_k, s_ij = <q'_i, k'_j + e_ij> / sqrt(C),
a_ij = softmax_j(s_ij), out_i = sum_j a_ij (v_j + e_ij), dO = dL/dout.

Pass 1, by destination (one program walks NODES_PER_PROGRAM consecutive destination nodes):
    da_ij = <dO_i, v_j + e_ij>,   D_i = sum_j a_ij da_ij / sum_j a_ij   (= <dO_i, out_i>, from fp32 terms)
    dq'_i = sum_j a_ij (da_ij - D_i) (k'_j + e_ij) / sqrt(C) = (A_i - (D_i - c_i) B_i) / sqrt(C)
        with A_i = sum_j a_ij (da_ij - c_i) (k'_j + e_ij), B_i = sum_j a_ij (k'_j + e_ij) and any shift c_i
        (the first edge's da: the terms then shrink to the spread of da),
    so a single sweep over the edges suffices and no copy of out is needed: nothing cancels in low
    precision, because D is never rebuilt from a rounded output. a_ij and da_ij go to fp32 scratch [M, H]
    (small next to e), D_i to [N_dst, H]. This is the only pass that reads the edge features.
Pass 2, by source (one program walks NODES_PER_PROGRAM consecutive source nodes):
    dS_ij = a_ij (da_ij - D_i),  dv_j = sum_i a_ij dO_i,  dk'_j = sum_i dS_ij q'_i / sqrt(C),
    de_ij = a_ij dO_i + dS_ij q'_i / sqrt(C)   (written in the caller's edge order).
Each pass ends with the RMSNorm backward of its own rows (from the raw q or k and a recomputed rstd) and
adds those rows' weight-gradient terms to an fp32 partial row of its own; the host sums the partial rows
in a fixed order, so the weight gradients are bitwise reproducible.
"""

import triton
import triton.language as tl

from gtnorm.rmsnorm.math import rms_norm_backward
from gtnorm.triton.tiles import (
    gather_rows,
    load_incoming_edge_rows,
    load_norm_weight,
    load_row,
    mask_if_valid,
    normalize_heads,
    row_tile_offsets,
    scatter_rows,
    store_row,
)


@triton.jit
def load_outgoing_edge_rows(
    query_ptr, grad_out_ptr, attn_ptr, grad_attn_ptr, delta_ptr, csr_dst_ptr, csr_edge_id_ptr, pos, end, offsets,
    mask, offs_h, head_mask, H, row_len,
):
    """What the by-source pass needs of the edges at by-source positions pos (< end): the destinations' dO and
    raw q rows [BLOCK_E, BLOCK_H, BLOCK_C], a, da and the destinations' D [BLOCK_E, BLOCK_H], the edge ids."""
    edge_mask = pos < end
    dst = tl.load(csr_dst_ptr + pos, mask=edge_mask, other=0)
    edge_id = tl.load(csr_edge_id_ptr + pos, mask=edge_mask, other=0)
    edge_head = edge_id.to(tl.int64)[:, None] * H + offs_h[None, :]
    edge_head_mask = edge_mask[:, None] & head_mask[None, :]
    a = tl.load(attn_ptr + edge_head, mask=edge_head_mask, other=0.0)
    da = tl.load(grad_attn_ptr + edge_head, mask=edge_head_mask, other=0.0)
    delta = tl.load(delta_ptr + dst.to(tl.int64)[:, None] * H + offs_h[None, :], mask=edge_head_mask, other=0.0)
    d_out = gather_rows(grad_out_ptr, dst, edge_mask, offsets, mask, row_len)
    q = gather_rows(query_ptr, dst, edge_mask, offsets, mask, row_len)
    return d_out, q, a, da, delta, edge_id


@triton.jit
def edge_softmax_backward_by_destination_kernel(
    query_ptr,  # [N_dst, H, C]
    key_ptr,  # [N_src, H, C]
    value_ptr,  # [N_src, H, C]
    edge_attr_ptr,  # [M, H, C] caller's edge order (unused without HAS_EDGE_ATTR)
    q_weight_ptr,  # [C]
    k_weight_ptr,  # [C]
    dst_offsets_ptr,  # [N_dst + 1] int32
    csc_src_ptr,  # [M] int32
    csc_edge_id_ptr,  # [M] int32
    grad_out_ptr,  # [N_dst, H, C]
    lse_ptr,  # [N_dst, H] fp32 from the forward
    grad_query_ptr,  # [N_dst, H, C]
    attn_ptr,  # [M, H] fp32 out: a, by caller's edge id
    grad_attn_ptr,  # [M, H] fp32 out: da = <dO, v + e>, by caller's edge id
    delta_ptr,  # [N_dst, H] fp32 out: D
    q_weight_grad_partial_ptr,  # [programs, C] fp32 out, a row per program (unused without the weight)
    num_dst,
    H,
    C,
    score_scale,  # log2(e) / sqrt(C): the forward's log2-domain scores
    sm_scale,  # 1 / sqrt(C)
    eps,
    HAS_EDGE_ATTR: tl.constexpr,
    QK_NORM: tl.constexpr,
    HAS_Q_WEIGHT: tl.constexpr,
    HAS_K_WEIGHT: tl.constexpr,
    NODES_PER_PROGRAM: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    row_len = H * C
    # Heads are independent (the norm is per head), so a program may take a group of BLOCK_H of them.
    offsets, mask, offs_h = row_tile_offsets(tl.program_id(1) * BLOCK_H, H, C, BLOCK_H, BLOCK_C)
    offs_e = tl.arange(0, BLOCK_E)
    head_mask = offs_h < H

    w_q = load_norm_weight(q_weight_ptr, C, HAS_Q_WEIGHT, BLOCK_C)
    w_k = load_norm_weight(k_weight_ptr, C, HAS_K_WEIGHT, BLOCK_C)
    grad_w_q = tl.zeros([BLOCK_C], tl.float32)

    for i in range(NODES_PER_PROGRAM):
        node = pid * NODES_PER_PROGRAM + i
        node_valid = node < num_dst
        # Past the last node the program repeats the last node with an empty edge range and writes nothing.
        row_mask = mask_if_valid(mask, node, num_dst)
        head_row_mask = mask_if_valid(head_mask, node, num_dst)
        node = tl.minimum(node, num_dst - 1)

        q_raw = load_row(query_ptr, node, offsets, mask, row_len)
        q, rstd_q = normalize_heads(q_raw, w_q, C, eps, QK_NORM)
        q_scores = q * score_scale
        d_out = load_row(grad_out_ptr, node, offsets, mask, row_len)
        lse = tl.load(lse_ptr + node.to(tl.int64) * H + offs_h, mask=head_mask, other=0.0)

        delta = tl.zeros([BLOCK_H], tl.float32)  # accumulates sum a (da - shift)
        shift = tl.zeros([BLOCK_H], tl.float32)  # da of the node's first edge
        a_sum = tl.zeros([BLOCK_H], tl.float32)
        acc_a = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
        acc_b = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
        start = tl.load(dst_offsets_ptr + node)
        end = tl.where(node_valid, tl.load(dst_offsets_ptr + node + 1), start)
        e0 = start
        k_next, v_next, e_next, id_next = load_incoming_edge_rows(
            key_ptr, value_ptr, edge_attr_ptr, csc_src_ptr, csc_edge_id_ptr, e0 + offs_e, end, offsets, mask,
            row_len, HAS_EDGE_ATTR,
        )  # fmt: skip
        while e0 < end:
            pos = e0 + offs_e
            edge_mask = pos < end
            # This step's rows were requested during the last step; request the next step's now, so their
            # latency overlaps this step's arithmetic (measured: -15 to -25 % time for this pass).
            k, v, e, edge_id = k_next, v_next, e_next, id_next
            k_next, v_next, e_next, id_next = load_incoming_edge_rows(
                key_ptr, value_ptr, edge_attr_ptr, csc_src_ptr, csc_edge_id_ptr, pos + BLOCK_E, end, offsets,
                mask, row_len, HAS_EDGE_ATTR,
            )  # fmt: skip
            k, rstd_k = normalize_heads(k, w_k, C, eps, QK_NORM)
            k += e
            v += e
            s = tl.sum(q_scores[None, :, :] * k, axis=2)  # [BLOCK_E, BLOCK_H]
            a = tl.where(edge_mask[:, None], tl.exp2(s - lse[None, :]), 0.0)
            da = tl.sum(d_out[None, :, :] * v, axis=2)
            # Accumulate a (da - c) with c = the first edge's da: A - D B is unchanged in exact arithmetic, but
            # the terms shrink to the spread of da, so equal messages give exactly 0 and large norm weights do
            # not magnify rounding into dq.
            first = (e0 == start).to(tl.float32)
            shift = first * tl.sum(tl.where(offs_e[:, None] == 0, da, 0.0), axis=0) + (1.0 - first) * shift
            a_da = a * (da - shift[None, :])
            delta += tl.sum(a_da, axis=0)
            a_sum += tl.sum(a, axis=0)
            acc_a += tl.sum(a_da[:, :, None] * k, axis=0)
            acc_b += tl.sum(a[:, :, None] * k, axis=0)
            edge_head = edge_id.to(tl.int64)[:, None] * H + offs_h[None, :]
            edge_head_mask = edge_mask[:, None] & head_mask[None, :]
            tl.store(attn_ptr + edge_head, a, mask=edge_head_mask)
            tl.store(grad_attn_ptr + edge_head, da, mask=edge_head_mask)
            e0 += BLOCK_E

        # D over sum(a) rather than over 1: the same number in exact arithmetic, but it makes dS = a (da - D)
        # sum to exactly what the recomputed a gives, so equal messages still give dS = 0 when the softmax is
        # sharp and a carries the rounding of large scores.
        delta = delta / tl.where(a_sum > 0.0, a_sum, 1.0)
        grad_q = (acc_a - delta[:, None] * acc_b) * sm_scale
        delta += shift
        if QK_NORM:
            if HAS_Q_WEIGHT:
                grad_w_q += tl.sum(grad_q * q_raw * rstd_q, axis=0)
            grad_q = rms_norm_backward(q_raw, rstd_q, w_q[None, :], grad_q, C, 1)
        store_row(grad_query_ptr, node, offsets, row_mask, row_len, grad_q)
        tl.store(delta_ptr + node.to(tl.int64) * H + offs_h, delta, mask=head_row_mask)

    if QK_NORM and HAS_Q_WEIGHT:
        offs_c = tl.arange(0, BLOCK_C)
        partial_row = pid * tl.num_programs(1) + tl.program_id(1)
        tl.store(q_weight_grad_partial_ptr + partial_row.to(tl.int64) * C + offs_c, grad_w_q, mask=offs_c < C)


@triton.jit
def edge_softmax_backward_by_source_kernel(
    query_ptr,  # [N_dst, H, C]
    key_ptr,  # [N_src, H, C]
    q_weight_ptr,  # [C]
    k_weight_ptr,  # [C]
    src_offsets_ptr,  # [N_src + 1] int32
    csr_dst_ptr,  # [M] int32
    csr_edge_id_ptr,  # [M] int32
    grad_out_ptr,  # [N_dst, H, C]
    attn_ptr,  # [M, H] fp32: a, by caller's edge id
    grad_attn_ptr,  # [M, H] fp32: da, by caller's edge id
    delta_ptr,  # [N_dst, H] fp32: D
    grad_key_ptr,  # [N_src, H, C]
    grad_value_ptr,  # [N_src, H, C]
    grad_edge_attr_ptr,  # [M, H, C] caller's edge order (unused without HAS_EDGE_ATTR)
    k_weight_grad_partial_ptr,  # [programs, C] fp32 out, a row per program (unused without the weight)
    num_src,
    H,
    C,
    sm_scale,  # 1 / sqrt(C)
    eps,
    HAS_EDGE_ATTR: tl.constexpr,
    QK_NORM: tl.constexpr,
    HAS_Q_WEIGHT: tl.constexpr,
    HAS_K_WEIGHT: tl.constexpr,
    NODES_PER_PROGRAM: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    row_len = H * C
    # Heads are independent (the norm is per head), so a program may take a group of BLOCK_H of them.
    offsets, mask, offs_h = row_tile_offsets(tl.program_id(1) * BLOCK_H, H, C, BLOCK_H, BLOCK_C)
    offs_e = tl.arange(0, BLOCK_E)
    head_mask = offs_h < H

    w_q = load_norm_weight(q_weight_ptr, C, HAS_Q_WEIGHT, BLOCK_C)
    w_k = load_norm_weight(k_weight_ptr, C, HAS_K_WEIGHT, BLOCK_C)
    grad_w_k = tl.zeros([BLOCK_C], tl.float32)

    for i in range(NODES_PER_PROGRAM):
        node = pid * NODES_PER_PROGRAM + i
        node_valid = node < num_src
        row_mask = mask_if_valid(mask, node, num_src)
        node = tl.minimum(node, num_src - 1)

        grad_v = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
        grad_k = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
        start = tl.load(src_offsets_ptr + node)
        end = tl.where(node_valid, tl.load(src_offsets_ptr + node + 1), start)
        e0 = start
        d_out_next, q_next, a_next, da_next, delta_next, id_next = load_outgoing_edge_rows(
            query_ptr, grad_out_ptr, attn_ptr, grad_attn_ptr, delta_ptr, csr_dst_ptr, csr_edge_id_ptr, e0 + offs_e,
            end, offsets, mask, offs_h, head_mask, H, row_len,
        )  # fmt: skip
        while e0 < end:
            pos = e0 + offs_e
            edge_mask = pos < end
            d_out, q, a, da, delta, edge_id = d_out_next, q_next, a_next, da_next, delta_next, id_next
            d_out_next, q_next, a_next, da_next, delta_next, id_next = load_outgoing_edge_rows(
                query_ptr, grad_out_ptr, attn_ptr, grad_attn_ptr, delta_ptr, csr_dst_ptr, csr_edge_id_ptr,
                pos + BLOCK_E, end, offsets, mask, offs_h, head_mask, H, row_len,
            )  # fmt: skip
            grad_s = a * (da - delta)  # [BLOCK_E, BLOCK_H]
            q, rstd_q = normalize_heads(q, w_q, C, eps, QK_NORM)
            a_d_out = a[:, :, None] * d_out
            grad_s_q = grad_s[:, :, None] * q * sm_scale
            grad_v += tl.sum(a_d_out, axis=0)
            grad_k += tl.sum(grad_s_q, axis=0)
            if HAS_EDGE_ATTR:
                scatter_rows(grad_edge_attr_ptr, edge_id, edge_mask, offsets, mask, row_len, a_d_out + grad_s_q)
            e0 += BLOCK_E

        if QK_NORM:
            k_raw = load_row(key_ptr, node, offsets, mask, row_len)
            _, rstd_k = normalize_heads(k_raw, w_k, C, eps, QK_NORM)
            if HAS_K_WEIGHT:
                grad_w_k += tl.sum(grad_k * k_raw * rstd_k, axis=0)
            grad_k = rms_norm_backward(k_raw, rstd_k, w_k[None, :], grad_k, C, 1)
        store_row(grad_key_ptr, node, offsets, row_mask, row_len, grad_k)
        store_row(grad_value_ptr, node, offsets, row_mask, row_len, grad_v)

    if QK_NORM and HAS_K_WEIGHT:
        offs_c = tl.arange(0, BLOCK_C)
        partial_row = pid * tl.num_programs(1) + tl.program_id(1)
        tl.store(k_weight_grad_partial_ptr + partial_row.to(tl.int64) * C + offs_c, grad_w_k, mask=offs_c < C)
