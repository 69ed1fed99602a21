"""Forward of the graph-transformer attention, RMSNorm of Q and K fused into their loads.

One program per destination node, all heads at once: the node's query row is loaded and normalised once,
then its incoming edges are walked BLOCK_E at a time (gathering BLOCK_E key/value rows per step) with an
online softmax. Scores are kept in the log2 domain (the scale 1/sqrt(C) * log2(e) is folded into q once),
so the exponentials are exp2.
"""

import triton
import triton.language as tl

from gtnorm.triton.tiles import (
    load_incoming_edge_rows,
    load_norm_weight,
    load_row,
    normalize_heads,
    row_tile_offsets,
    store_row,
)


@triton.jit
def graph_attention_forward_kernel(
    query_ptr,  # [N_dst, H, C]
    key_ptr,  # [N_src, H, C]
    value_ptr,  # [N_src, H, C]
    edge_attr_ptr,  # [M, H, C] in the caller's edge order (unused without HAS_EDGE_ATTR)
    q_weight_ptr,  # [C] (unused without HAS_Q_WEIGHT)
    k_weight_ptr,  # [C] (unused without HAS_K_WEIGHT)
    dst_offsets_ptr,  # [N_dst + 1] int32
    csc_src_ptr,  # [M] int32
    csc_edge_id_ptr,  # [M] int32
    out_ptr,  # [N_dst, H, C]
    lse_ptr,  # [N_dst, H] fp32: log2-sum-exp2 of the scores, what the backward needs to rebuild a
    H,
    C,
    score_scale,  # log2(e) / sqrt(C)
    eps,
    HAS_EDGE_ATTR: tl.constexpr,
    QK_NORM: tl.constexpr,
    HAS_Q_WEIGHT: tl.constexpr,
    HAS_K_WEIGHT: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    node = tl.program_id(0)
    row_len = H * C
    # Heads are independent (the norm is per head), so a program may take a group of BLOCK_H of them.
    offsets, mask, offs_h = row_tile_offsets(tl.program_id(1) * BLOCK_H, H, C, BLOCK_H, BLOCK_C)
    offs_e = tl.arange(0, BLOCK_E)

    w_q = load_norm_weight(q_weight_ptr, C, HAS_Q_WEIGHT, BLOCK_C)
    w_k = load_norm_weight(k_weight_ptr, C, HAS_K_WEIGHT, BLOCK_C)
    q = load_row(query_ptr, node, offsets, mask, row_len)
    q, rstd_q = normalize_heads(q, w_q, C, eps, QK_NORM)
    q = q * score_scale

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    start = tl.load(dst_offsets_ptr + node)
    end = tl.load(dst_offsets_ptr + node + 1)
    # A while loop, not range(): the interpreter of older Triton cannot take loaded loop bounds.
    e0 = start
    while e0 < end:
        pos = e0 + offs_e
        edge_mask = pos < end
        k, v, e, edge_id = load_incoming_edge_rows(
            key_ptr, value_ptr, edge_attr_ptr, csc_src_ptr, csc_edge_id_ptr, pos, end, offsets, mask, row_len,
            HAS_EDGE_ATTR,
        )  # fmt: skip
        k, rstd_k = normalize_heads(k, w_k, C, eps, QK_NORM)
        k += e
        v += e
        s = tl.sum(q[None, :, :] * k, axis=2)  # [BLOCK_E, BLOCK_H]
        s = tl.where(edge_mask[:, None], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        p = tl.exp2(s - m_new[None, :])
        rescale = tl.exp2(m - m_new)
        denom = denom * rescale + tl.sum(p, axis=0)
        acc = acc * rescale[:, None] + tl.sum(p[:, :, None] * v, axis=0)
        m = m_new
        e0 += BLOCK_E

    has_edges = denom > 0.0
    # A node without incoming edges gets 0 (acc is 0 and denom is 0).
    out = acc / tl.where(has_edges, denom, 1.0)[:, None]
    store_row(out_ptr, node, offsets, mask, row_len, out)
    lse = tl.where(has_edges, m + tl.log2(tl.where(has_edges, denom, 1.0)), 0.0)
    tl.store(lse_ptr + node.to(tl.int64) * H + offs_h, lse, mask=offs_h < H)
