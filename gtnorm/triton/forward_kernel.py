"""Forward of the graph-transformer attention, the norm of Q and K (RMSNorm or LayerNorm) fused into their loads.

One program per destination slot (GraphLayout's visiting order) and group of BLOCK_H heads: the node's query
row is loaded and normalised once, then its incoming edges are walked one per step with an online softmax.
Scores are kept in the log2 domain, so the exponentials are exp2. Unlike the backward passes, the forward
does not flatten its walk across nodes: its per-step work is light, and re-reading (or holding) the query at
every edge of a flattened walk cost more than it saved (benchmarks/NOTES.md, v2 and v3).
"""

import triton
import triton.language as tl

from gtnorm.triton.tiles import (
    load_norm_param,
    load_row,
    normalize_heads,
    row_tile_offsets,
    store_row,
)


@triton.jit
def _online_softmax_step(
    q, m, denom, acc, w_k, b_k, pos, key_ptr, value_ptr, edge_attr_ptr, csc_src_ptr, csc_edge_id_ptr, offsets,
    mask, row_len, C, score_scale, eps_k, HAS_EDGE_ATTR: tl.constexpr, NORM: tl.constexpr,
):
    """Folds the edge at by-destination position pos into the running max m [BLOCK_H], denominator [BLOCK_H]
    and accumulator [BLOCK_H, BLOCK_C] of the online softmax; q is the normalised query [BLOCK_H, BLOCK_C]."""
    src = tl.load(csc_src_ptr + pos)
    k = normalize_heads(load_row(key_ptr, src, offsets, mask, row_len), w_k, b_k, mask, C, eps_k, NORM)
    v = load_row(value_ptr, src, offsets, mask, row_len)
    if HAS_EDGE_ATTR:
        e = load_row(edge_attr_ptr, tl.load(csc_edge_id_ptr + pos), offsets, mask, row_len)
        k += e
        v += e
    s = tl.sum(q * k, axis=1) * score_scale  # [BLOCK_H]
    m_new = tl.maximum(m, s)
    p = tl.exp2(s - m_new)
    rescale = tl.exp2(m - m_new)
    return m_new, denom * rescale + p, acc * rescale[:, None] + p[:, None] * v


@triton.jit
def _attend_node(
    slot, query_ptr, key_ptr, value_ptr, edge_attr_ptr, dst_offsets_ptr, dst_by_slot_ptr, csc_src_ptr,
    csc_edge_id_ptr, out_ptr, lse_ptr, w_q, b_q, w_k, b_k, offsets, mask, offs_h, H, C, score_scale, eps_q, eps_k,
    HAS_EDGE_ATTR: tl.constexpr, NORM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """Output row and lse of the destination in ``slot`` (which has edges)."""
    row_len = H * C
    # The node and its edge range are independent loads: the query row does not wait for the offsets.
    node = tl.load(dst_by_slot_ptr + slot)
    start = tl.load(dst_offsets_ptr + slot)
    end = tl.load(dst_offsets_ptr + slot + 1)
    q = normalize_heads(load_row(query_ptr, node, offsets, mask, row_len), w_q, b_q, mask, C, eps_q, NORM)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    # With NUM_STAGES > 1 the pipeliner issues the loads of the next steps (cp.async into shared memory)
    # while this step computes; that pays on nodes with many edges (config.py).
    for pos in tl.range(start, end, num_stages=NUM_STAGES):
        m, denom, acc = _online_softmax_step(
            q, m, denom, acc, w_k, b_k, pos, key_ptr, value_ptr, edge_attr_ptr, csc_src_ptr, csc_edge_id_ptr,
            offsets, mask, row_len, C, score_scale, eps_k, HAS_EDGE_ATTR, NORM,
        )  # fmt: skip
    store_row(out_ptr, node, offsets, mask, row_len, acc / denom[:, None])
    tl.store(lse_ptr + node.to(tl.int64) * H + offs_h, m + tl.log2(denom), mask=offs_h < H)


@triton.jit
def graph_attention_forward_kernel(
    query_ptr,  # [N_dst, H, C]
    key_ptr,  # [N_src, H, C]
    value_ptr,  # [N_src, H, C]
    edge_attr_ptr,  # [M, H, C] in the caller's edge order (unused without HAS_EDGE_ATTR)
    q_weight_ptr,  # [C] (unused without HAS_Q_WEIGHT)
    q_bias_ptr,  # [C] (unused without HAS_Q_BIAS)
    k_weight_ptr,  # [C] (unused without HAS_K_WEIGHT)
    k_bias_ptr,  # [C] (unused without HAS_K_BIAS)
    dst_offsets_ptr,  # [N_dst + 1] int32, by slot
    dst_by_slot_ptr,  # [N_dst] int32
    csc_src_ptr,  # [M] int32
    csc_edge_id_ptr,  # [M] int32
    out_ptr,  # [N_dst, H, C]; rows of nodes without edges are left to the caller
    lse_ptr,  # [N_dst, H] fp32: log2-sum-exp2 of the scores, what the backward needs to rebuild a
    num_slots,  # destinations with edges (they hold the first slots)
    nodes_per_program,
    H,
    C,
    score_scale,  # log2(e) / sqrt(C)
    eps_q,
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
    # Heads are independent (the norm is per head), so a program may take a group of BLOCK_H of them.
    offsets, mask, offs_h = row_tile_offsets(tl.program_id(1) * BLOCK_H, H, C, BLOCK_H, BLOCK_C)
    w_q = load_norm_param(q_weight_ptr, C, HAS_Q_WEIGHT, 1.0, BLOCK_C)
    b_q = load_norm_param(q_bias_ptr, C, HAS_Q_BIAS, 0.0, BLOCK_C)
    w_k = load_norm_param(k_weight_ptr, C, HAS_K_WEIGHT, 1.0, BLOCK_C)
    b_k = load_norm_param(k_bias_ptr, C, HAS_K_BIAS, 0.0, BLOCK_C)
    if NUM_STAGES > 1:
        # Pipelined kernels walk a run of slots in a loop: even for runs of one slot this form measured 4-7 %
        # faster on the encoders than the plain one (benchmarks/NOTES.md, v3); the unpipelined (low-degree)
        # kernel is faster without it.
        slot = tl.program_id(0) * nodes_per_program
        last_slot = tl.minimum(slot + nodes_per_program, num_slots)
        while slot < last_slot:
            _attend_node(
                slot, query_ptr, key_ptr, value_ptr, edge_attr_ptr, dst_offsets_ptr, dst_by_slot_ptr, csc_src_ptr,
                csc_edge_id_ptr, out_ptr, lse_ptr, w_q, b_q, w_k, b_k, offsets, mask, offs_h, H, C, score_scale,
                eps_q, eps_k, HAS_EDGE_ATTR, NORM, BLOCK_H, BLOCK_C, NUM_STAGES,
            )  # fmt: skip
            slot += 1
    else:
        _attend_node(
            tl.program_id(0), query_ptr, key_ptr, value_ptr, edge_attr_ptr, dst_offsets_ptr, dst_by_slot_ptr,
            csc_src_ptr, csc_edge_id_ptr, out_ptr, lse_ptr, w_q, b_q, w_k, b_k, offsets, mask, offs_h, H, C,
            score_scale, eps_q, eps_k, HAS_EDGE_ATTR, NORM, BLOCK_H, BLOCK_C, NUM_STAGES,
        )  # fmt: skip
