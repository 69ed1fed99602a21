"""Forward of the graph-transformer attention, the norm of Q and K (RMSNorm or LayerNorm) fused into their loads.

One program per destination slot (GraphLayout's visiting order) and group of BLOCK_H heads: the node's query
row is loaded and normalised once, then its incoming edges are walked one per step with an online softmax.
Scores are kept in the log2 domain, so the exponentials are exp2. Unlike the backward passes, the forward
does not flatten its walk across nodes: its per-step work is light, and re-reading (or holding) the query at
every edge of a flattened walk cost more than it saved (benchmarks/NOTES.md, v2 and v3).

With EDGE_PROJ the edge features come from raw attributes (edge_projection.py): each edge adds <q', W> x to its
score (the query's projection onto the edge weights, [H, D + 1] per node, made beforehand by
node_projection_kernels.py), and the online softmax carries the p-weighted sum of the edges' attributes beside the
messages; the node's share of it is stored, and expanded through W into the output afterwards, for blocks of nodes
at once.
"""

import triton
import triton.language as tl

from gtnorm.triton.edge_projection import feature_tile_offsets, features_dot, load_edge_features
from gtnorm.triton.tiles import (
    NORM_NONE,
    load_norm_param,
    load_row,
    normalize_heads,
    normalized_dot,
    row_tile_offsets,
    store_row,
)


@triton.jit
def _online_softmax_step(
    q, q_key, q_proj, m, denom, acc, feature_acc, w_k, pos, key_ptr, value_ptr, edge_attr_ptr, edge_features_ptr,
    csc_src_ptr, csc_edge_id_ptr, offsets, mask, row_len, C, score_scale, eps_k, HAS_EDGE_ATTR: tl.constexpr,
    EDGE_PROJ: tl.constexpr, EDGE_DIM: tl.constexpr, HAS_EDGE_BIAS: tl.constexpr, NORM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Folds the edge at by-destination position pos into the running max m [BLOCK_H], denominator [BLOCK_H]
    and accumulators of the online softmax: acc [BLOCK_H, BLOCK_C] of the messages, and with EDGE_PROJ
    feature_acc [BLOCK_H, BLOCK_D] of the edges' extended attributes (edge_projection.py). q is the normalised
    query [BLOCK_H, BLOCK_C], q_key = q w_k [BLOCK_H, BLOCK_C] (the key's score is then <k_hat, q_key>:
    tiles.normalized_dot scales a sum per head instead of normalising every element of the gathered key), q_proj
    its projection onto the edge weights [BLOCK_H, BLOCK_D]."""
    src = tl.load(csc_src_ptr + pos)
    # The order is measured (H200, benchmarks/NOTES.md v41): without edge rows the key's score is taken before v is
    # loaded (9 % faster with the projection and LayerNorm); with edge rows the key is normalised first and v + e
    # formed before the score's reduction (the score's sum before v += e, the PTX otherwise the same, ran the
    # RMSNorm walk 24 % slower at the same registers).
    if HAS_EDGE_ATTR:
        # k' + e in one row, one reduction: scaling the key's sum instead costs a second reduction for e's term,
        # which was more than the per-element normalisation it saves (SASS counts, benchmarks/NOTES.md v40).
        k = normalize_heads(load_row(key_ptr, src, offsets, mask, row_len), w_k, 0.0, C, eps_k, NORM)
    else:
        s = normalized_dot(load_row(key_ptr, src, offsets, mask, row_len), q_key, C, eps_k, NORM)  # [BLOCK_H]
    v = load_row(value_ptr, src, offsets, mask, row_len)
    if HAS_EDGE_ATTR:
        e = load_row(edge_attr_ptr, tl.load(csc_edge_id_ptr + pos), offsets, mask, row_len)
        k += e
        v += e
        s = tl.sum(q * k, axis=1)  # [BLOCK_H]
    if EDGE_PROJ:
        x = load_edge_features(edge_features_ptr, tl.load(csc_edge_id_ptr + pos), EDGE_DIM, HAS_EDGE_BIAS, BLOCK_D)
        s += features_dot(q_proj, x)
    s = s * score_scale
    m_new = tl.maximum(m, s)
    p = tl.exp2(s - m_new)
    rescale = tl.exp2(m - m_new)
    if EDGE_PROJ:
        feature_acc = feature_acc * rescale[:, None] + p[:, None] * x[None, :]
    return m_new, denom * rescale + p, acc * rescale[:, None] + p[:, None] * v, feature_acc


@triton.jit
def _attend_node(
    slot, query_ptr, key_ptr, value_ptr, edge_attr_ptr, edge_features_ptr, query_proj_ptr, feature_mean_ptr,
    dst_offsets_ptr, dst_by_slot_ptr, csc_src_ptr, csc_edge_id_ptr, out_ptr, lse_ptr, w_q, b_q, w_k, offsets,
    mask, offs_h, feature_offsets, feature_mask, H, C, score_scale, eps_q, eps_k, HAS_EDGE_ATTR: tl.constexpr,
    EDGE_PROJ: tl.constexpr, EDGE_DIM: tl.constexpr, HAS_EDGE_BIAS: tl.constexpr, NORM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """Output row and lse of the destination in ``slot`` (which has edges); with EDGE_PROJ, its row of
    sum_j p_ij x_ij / sum_j p_ij [BLOCK_H, BLOCK_D] too."""
    row_len = H * C
    # The node and its edge range are independent loads: the query row does not wait for the offsets.
    node = tl.load(dst_by_slot_ptr + slot)
    start = tl.load(dst_offsets_ptr + slot)
    end = tl.load(dst_offsets_ptr + slot + 1)
    q = normalize_heads(load_row(query_ptr, node, offsets, mask, row_len), w_q, b_q, C, eps_q, NORM)
    # The key norm's weight moved onto the query once per node (0 on padding lanes: load_norm_param); its bias
    # is left out, as the softmax cancels it (attention_launch._norm_flags).
    q_key = q
    if NORM != NORM_NONE and not HAS_EDGE_ATTR:
        q_key = q * w_k[None, :]
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    feature_acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    q_proj = feature_acc
    feature_row = node.to(tl.int64) * (H * (EDGE_DIM + HAS_EDGE_BIAS)) + feature_offsets
    if EDGE_PROJ:
        q_proj = tl.load(query_proj_ptr + feature_row, mask=feature_mask, other=0.0)
    # With NUM_STAGES > 1 the pipeliner issues the loads of the next steps (cp.async into shared memory)
    # while this step computes; that pays on nodes with many edges (config.py).
    for pos in tl.range(start, end, num_stages=NUM_STAGES):
        m, denom, acc, feature_acc = _online_softmax_step(
            q, q_key, q_proj, m, denom, acc, feature_acc, w_k, pos, key_ptr, value_ptr, edge_attr_ptr,
            edge_features_ptr, csc_src_ptr, csc_edge_id_ptr, offsets, mask, row_len, C, score_scale, eps_k,
            HAS_EDGE_ATTR, EDGE_PROJ, EDGE_DIM, HAS_EDGE_BIAS, NORM, BLOCK_D,
        )  # fmt: skip
    if EDGE_PROJ:
        # sum_j a_ij e_ij = (sum_j a_ij x_ij) W: node_projection_kernels.py adds it to the output row.
        tl.store(feature_mean_ptr + feature_row, feature_acc / denom[:, None], mask=feature_mask)
    store_row(out_ptr, node, offsets, mask, row_len, acc / denom[:, None])
    tl.store(lse_ptr + node.to(tl.int64) * H + offs_h, m + tl.log2(denom), mask=offs_h < H)


@triton.jit
def graph_attention_forward_kernel(
    query_ptr,  # [N_dst, H, C]
    key_ptr,  # [N_src, H, C]
    value_ptr,  # [N_src, H, C]
    edge_attr_ptr,  # [M, H, C] in the caller's edge order (unused without HAS_EDGE_ATTR)
    edge_features_ptr,  # [M, EDGE_DIM] in the caller's edge order (unused without EDGE_PROJ)
    query_proj_ptr,  # [N_dst, H, EDGE_DIM + HAS_EDGE_BIAS] fp32: <q', W_d> (unused without EDGE_PROJ)
    feature_mean_ptr,  # [N_dst, H, EDGE_DIM + HAS_EDGE_BIAS] fp32 out: sum_j a_ij x_ij (unused without EDGE_PROJ)
    q_weight_ptr,  # [C] (unused without HAS_Q_WEIGHT)
    q_bias_ptr,  # [C] (unused without HAS_Q_BIAS)
    k_weight_ptr,  # [C] (unused without HAS_K_WEIGHT)
    k_bias_ptr,  # [C], never read: the softmax cancels the key bias (attention_launch._norm_flags)
    dst_offsets_ptr,  # [N_dst + 1] int32, by slot
    dst_by_slot_ptr,  # [N_dst] int32
    csc_src_ptr,  # [M] int32
    csc_edge_id_ptr,  # [M] int32
    out_ptr,  # [N_dst, H, C]; rows of nodes without edges are left to the caller
    lse_ptr,  # [N_dst, H] fp32: log2-sum-exp2 of the scores, what the backward needs to rebuild a
    num_slots,  # destinations with edges (they hold the first slots)
    nodes_per_program,
    H,
    # Not a constexpr, unlike in the backward kernels: specialised on C, ptxas issued the value and edge loads only
    # after the key's reductions, and the forward ran 6-10 % slower (benchmarks/NOTES.md, v11).
    C,
    score_scale,  # log2(e) / sqrt(C)
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
    HAS_K_BIAS: tl.constexpr,  # always False, as for the backward kernels
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_D: tl.constexpr,  # EDGE_DIM + HAS_EDGE_BIAS padded to a power of two (1 without EDGE_PROJ)
    NUM_STAGES: tl.constexpr,
):
    # Heads are independent (the norm is per head), so a program may take a group of BLOCK_H of them.
    offsets, mask, offs_h = row_tile_offsets(tl.program_id(1) * BLOCK_H, H, C, BLOCK_H, BLOCK_C)
    feature_offsets, feature_mask = feature_tile_offsets(
        tl.program_id(1) * BLOCK_H, H, EDGE_DIM + HAS_EDGE_BIAS, BLOCK_H, BLOCK_D
    )
    w_q = load_norm_param(q_weight_ptr, C, HAS_Q_WEIGHT, 1.0, BLOCK_C)
    b_q = load_norm_param(q_bias_ptr, C, HAS_Q_BIAS, 0.0, BLOCK_C)
    w_k = load_norm_param(k_weight_ptr, C, HAS_K_WEIGHT, 1.0, BLOCK_C)
    if NUM_STAGES > 1:
        # Pipelined kernels walk a run of slots in a loop: even for runs of one slot this form measured 4-7 %
        # faster on the encoders than the plain one (benchmarks/NOTES.md, v3); the unpipelined (low-degree)
        # kernel is faster without it.
        slot = tl.program_id(0) * nodes_per_program
        last_slot = tl.minimum(slot + nodes_per_program, num_slots)
        while slot < last_slot:
            _attend_node(
                slot, query_ptr, key_ptr, value_ptr, edge_attr_ptr, edge_features_ptr, query_proj_ptr,
                feature_mean_ptr, dst_offsets_ptr, dst_by_slot_ptr, csc_src_ptr, csc_edge_id_ptr, out_ptr, lse_ptr,
                w_q, b_q, w_k, offsets, mask, offs_h, feature_offsets, feature_mask, H, C, score_scale,
                eps_q, eps_k, HAS_EDGE_ATTR, EDGE_PROJ, EDGE_DIM, HAS_EDGE_BIAS, NORM, BLOCK_H, BLOCK_C, BLOCK_D,
                NUM_STAGES,
            )  # fmt: skip
            slot += 1
    else:
        _attend_node(
            tl.program_id(0), query_ptr, key_ptr, value_ptr, edge_attr_ptr, edge_features_ptr, query_proj_ptr,
            feature_mean_ptr, dst_offsets_ptr, dst_by_slot_ptr, csc_src_ptr, csc_edge_id_ptr, out_ptr, lse_ptr, w_q,
            b_q, w_k, offsets, mask, offs_h, feature_offsets, feature_mask, H, C, score_scale, eps_q, eps_k,
            HAS_EDGE_ATTR, EDGE_PROJ, EDGE_DIM, HAS_EDGE_BIAS, NORM, BLOCK_H, BLOCK_C, BLOCK_D, NUM_STAGES,
        )  # fmt: skip
