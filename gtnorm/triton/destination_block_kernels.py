"""The fused edge projection's forward and by-destination walks for blocks of destinations, one head at a time:
the form for graphs whose destinations have few edges (the decoder's 3).

The per-node walks (forward_kernel.py, backward_kernels.py) take one destination per program, so the products of a
node row with the edge weights W (edge_projection.py) run for blocks of nodes in kernels of their own
(node_projection_kernels.py), which read and write every destination row once more: on a 3-edge graph that traffic
is about what the edge features' rows saved (benchmarks/NOTES.md, v10). Here a program takes BLOCK_N consecutive
destination slots and, per head, their [BLOCK_N, C] rows; the products with W are tl.dot on that tile inside the
walk, and the edges are walked in lockstep: step j folds every node's j-th edge (a gather of BLOCK_N key and value
rows), for as many steps as the block's largest degree. No per-node kernel runs before or after:

    forward:          q' W^T (scores), the online softmax, (sum_j p x) W into the output, one store per row;
    by destination:   dO W^T (da), the sums of backward_kernels.py, S W into dq' before the query norm's backward.

What the other kernels read is written as by the per-node walks: lse, <q', W> (the by-destination and
d edge_features passes), a and da per edge, D, <dO, W>, and P, S per destination (edge_weight_grad_kernel.py).
Rows of a block that are past the last slot, and the steps past a node's own degree, are masked: their scores are
-inf, their attention 0.
"""

import triton
import triton.language as tl

from gtnorm.triton.edge_projection import extended_weight_tile
from gtnorm.triton.tiles import (
    NORM_NONE,
    load_norm_param,
    norm_apply,
    norm_stats,
    normalize_heads,
    normalize_heads_backward,
    store_param_grad_partial,
)


@triton.jit
def _destination_block(dst_by_slot_ptr, dst_offsets_ptr, num_slots, BLOCK_N: tl.constexpr):
    """This program's destination slots: their nodes (int64) [BLOCK_N], mask, edge ranges start, end [BLOCK_N] (by
    slot, positions of the by-destination walk), and the block's largest degree."""
    slots = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    slot_mask = slots < num_slots
    nodes = tl.load(dst_by_slot_ptr + slots, mask=slot_mask, other=0).to(tl.int64)
    start = tl.load(dst_offsets_ptr + slots, mask=slot_mask, other=0)
    end = tl.load(dst_offsets_ptr + slots + 1, mask=slot_mask, other=0)
    return nodes, slot_mask, start, end, tl.max(end - start, axis=0)


@triton.jit
def _head_range(H, heads_per_program):
    first = tl.program_id(1) * heads_per_program
    return first, tl.minimum(first + heads_per_program, H)


@triton.jit
def _load_rows(ptr, rows, head, row_mask, H, C, BLOCK_C: tl.constexpr):
    """Head ``head`` of rows ``rows`` [BLOCK_N] (int64) of an [n, H, C] tensor as fp32 [BLOCK_N, BLOCK_C]."""
    offsets = rows[:, None] * (H * C) + head * C + tl.arange(0, BLOCK_C)[None, :]
    return tl.load(ptr + offsets, mask=row_mask, other=0.0).to(tl.float32)


@triton.jit
def _store_rows(ptr, rows, head, row_mask, H, C, value, BLOCK_C: tl.constexpr):
    offsets = rows[:, None] * (H * C) + head * C + tl.arange(0, BLOCK_C)[None, :]
    tl.store(ptr + offsets, value.to(ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _block_edge_step(
    step, start, end, slot_mask, key_ptr, value_ptr, edge_features_ptr, csc_src_ptr, csc_edge_id_ptr, w_k, b_k, head,
    H, C, eps_k, EDGE_DIM: tl.constexpr, HAS_EDGE_BIAS: tl.constexpr, NORM: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Every node's edge number ``step``: (valid [BLOCK_N], edge ids (int64), k' and v [BLOCK_N, BLOCK_C] of head
    ``head``, extended attributes x [BLOCK_N, BLOCK_D]); 0 rows where the node has fewer edges."""
    pos = start + step
    valid = slot_mask & (pos < end)
    src = tl.load(csc_src_ptr + pos, mask=valid, other=0).to(tl.int64)
    edge_id = tl.load(csc_edge_id_ptr + pos, mask=valid, other=0).to(tl.int64)
    row_mask = valid[:, None] & (tl.arange(0, BLOCK_C)[None, :] < C)
    key = normalize_heads(_load_rows(key_ptr, src, head, row_mask, H, C, BLOCK_C), w_k, b_k, C, eps_k, NORM)
    value = _load_rows(value_ptr, src, head, row_mask, H, C, BLOCK_C)
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    features = tl.load(
        edge_features_ptr + edge_id[:, None] * EDGE_DIM + offs_d, mask=valid[:, None] & (offs_d < EDGE_DIM), other=0.0
    ).to(tl.float32)
    if HAS_EDGE_BIAS:  # the constant 1 matching b, W's extended row (edge_projection.py)
        features = tl.where(valid[:, None] & (offs_d == EDGE_DIM), 1.0, features)
    return valid, edge_id, key, value, features


@triton.jit
def forward_destination_block_kernel(
    query_ptr,  # [N_dst, H, C]
    key_ptr,  # [N_src, H, C]
    value_ptr,  # [N_src, H, C]
    edge_features_ptr,  # [M, EDGE_DIM] in the caller's edge order
    edge_weight_ptr,  # [EDGE_DIM, H * C], strides (w_stride_d, w_stride_hc)
    edge_bias_ptr,  # [H * C] (unused without HAS_EDGE_BIAS)
    w_stride_d,
    w_stride_hc,
    q_weight_ptr,  # [C] (unused without HAS_Q_WEIGHT)
    q_bias_ptr,  # [C] (unused without HAS_Q_BIAS)
    k_weight_ptr,  # [C] (unused without HAS_K_WEIGHT)
    dst_offsets_ptr,  # [N_dst + 1] int32, by slot
    dst_by_slot_ptr,  # [N_dst] int32
    csc_src_ptr,  # [M] int32
    csc_edge_id_ptr,  # [M] int32
    out_ptr,  # [N_dst, H, C]; rows of nodes without edges are left to the caller
    lse_ptr,  # [N_dst, H] fp32 out: log2-sum-exp2 of the scores
    query_proj_ptr,  # [N_dst, H, EDGE_DIM + HAS_EDGE_BIAS] fp32 out: <q', W_d>, for the backward
    num_slots,  # destinations with edges (they hold the first slots)
    heads_per_program,
    H,
    C,
    score_scale,  # log2(e) / sqrt(C)
    eps_q,
    eps_k,
    EDGE_DIM: tl.constexpr,
    HAS_EDGE_BIAS: tl.constexpr,
    NORM: tl.constexpr,  # tiles.NORM_NONE / NORM_RMS / NORM_LAYER
    HAS_Q_WEIGHT: tl.constexpr,
    HAS_Q_BIAS: tl.constexpr,
    HAS_K_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,  # destinations per program (>= 16: tl.dot)
    BLOCK_C: tl.constexpr,  # C padded to a power of two, at least 16 (tl.dot)
    BLOCK_D: tl.constexpr,  # EDGE_DIM + HAS_EDGE_BIAS padded to a power of two, at least 16 (tl.dot)
):
    nodes, slot_mask, start, end, degree = _destination_block(dst_by_slot_ptr, dst_offsets_ptr, num_slots, BLOCK_N)
    w_q = load_norm_param(q_weight_ptr, C, HAS_Q_WEIGHT, 1.0, BLOCK_C)[None, :]
    b_q = load_norm_param(q_bias_ptr, C, HAS_Q_BIAS, 0.0, BLOCK_C)[None, :]
    w_k = load_norm_param(k_weight_ptr, C, HAS_K_WEIGHT, 1.0, BLOCK_C)[None, :]
    b_k = tl.zeros_like(w_k)  # the key bias cancels in the softmax (ops._norm_flags)
    row_mask = slot_mask[:, None] & (tl.arange(0, BLOCK_C)[None, :] < C)
    extended_dim = EDGE_DIM + HAS_EDGE_BIAS
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    proj_mask = slot_mask[:, None] & (offs_d < extended_dim)
    first_head, last_head = _head_range(H, heads_per_program)
    for head in range(first_head, last_head):
        query = normalize_heads(_load_rows(query_ptr, nodes, head, row_mask, H, C, BLOCK_C), w_q, b_q, C, eps_q, NORM)
        weight = extended_weight_tile(
            edge_weight_ptr, edge_bias_ptr, w_stride_d, w_stride_hc, head, C, EDGE_DIM, HAS_EDGE_BIAS, BLOCK_D,
            BLOCK_C,
        )  # fmt: skip
        # tf32x3: fp32 accuracy (three tf32 products) at tensor-core speed.
        query_proj = tl.dot(query, tl.trans(weight), input_precision="tf32x3")  # [BLOCK_N, BLOCK_D]
        tl.store(query_proj_ptr + (nodes[:, None] * H + head) * extended_dim + offs_d, query_proj, mask=proj_mask)
        # Padding rows start at 0, not -inf: a row that never has a valid edge would take exp2(-inf - (-inf)).
        running_max = tl.where(slot_mask, float("-inf"), 0.0)
        denom = tl.zeros([BLOCK_N], tl.float32)
        acc = tl.zeros([BLOCK_N, BLOCK_C], tl.float32)
        feature_acc = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        step = degree * 0
        # A while loop: its bound is a loaded value, which the interpreter of older Triton takes only here.
        while step < degree:
            valid, _, key, value, features = _block_edge_step(
                step, start, end, slot_mask, key_ptr, value_ptr, edge_features_ptr, csc_src_ptr, csc_edge_id_ptr,
                w_k, b_k, head, H, C, eps_k, EDGE_DIM, HAS_EDGE_BIAS, NORM, BLOCK_C, BLOCK_D,
            )  # fmt: skip
            score = (tl.sum(query * key, axis=1) + tl.sum(query_proj * features, axis=1)) * score_scale
            new_max = tl.maximum(running_max, tl.where(valid, score, float("-inf")))
            # Steps past a node's degree leave its sums as they are.
            p = tl.where(valid, tl.exp2(score - new_max), 0.0)
            rescale = tl.where(valid, tl.exp2(running_max - new_max), 1.0)
            denom = denom * rescale + p
            acc = acc * rescale[:, None] + p[:, None] * value
            feature_acc = feature_acc * rescale[:, None] + p[:, None] * features
            running_max = new_max
            step += 1
        denom = tl.where(slot_mask, denom, 1.0)
        # sum_j p_ij e_ij = (sum_j p_ij x_ij) W: the output row gets both parts before its one rounding.
        out = (acc + tl.dot(feature_acc, weight, input_precision="tf32x3")) / denom[:, None]
        _store_rows(out_ptr, nodes, head, row_mask, H, C, out, BLOCK_C)
        tl.store(lse_ptr + nodes * H + head, running_max + tl.log2(denom), mask=slot_mask)


@triton.jit
def by_destination_block_kernel(
    query_ptr,  # [N_dst, H, C]
    key_ptr,  # [N_src, H, C]
    value_ptr,  # [N_src, H, C]
    edge_features_ptr,  # [M, EDGE_DIM] in the caller's edge order
    edge_weight_ptr,  # [EDGE_DIM, H * C], strides (w_stride_d, w_stride_hc)
    edge_bias_ptr,  # [H * C] (unused without HAS_EDGE_BIAS)
    w_stride_d,
    w_stride_hc,
    q_weight_ptr,  # [C] (unused without HAS_Q_WEIGHT)
    q_bias_ptr,  # [C] (unused without HAS_Q_BIAS)
    k_weight_ptr,  # [C] (unused without HAS_K_WEIGHT)
    dst_offsets_ptr,  # [N_dst + 1] int32, by slot
    dst_by_slot_ptr,  # [N_dst] int32
    csc_src_ptr,  # [M] int32
    csc_edge_id_ptr,  # [M] int32
    grad_out_ptr,  # [N_dst, H, C]
    lse_ptr,  # [N_dst, H] fp32 from the forward
    query_proj_ptr,  # [N_dst, H, EDGE_DIM + HAS_EDGE_BIAS] fp32 from the forward: <q', W_d>
    grad_query_ptr,  # [N_dst, H, C] out; rows of nodes without edges are left to the caller
    attn_ptr,  # [M, H] fp32 out: a, by caller's edge id
    grad_attn_ptr,  # [M, H] fp32 out: da = <dO, v + e>, by caller's edge id
    delta_ptr,  # [N_dst, H] fp32 out: D
    grad_out_proj_ptr,  # [N_dst, H, EDGE_DIM + HAS_EDGE_BIAS] fp32 out: <dO, W_d> (edge_features_grad_kernel.py)
    feature_sums_ptr,  # [N_dst, 2, H, EDGE_DIM + HAS_EDGE_BIAS] fp32 out: P, S (edge_weight_grad_kernel.py)
    q_param_grad_partial_ptr,  # [programs, partial_width] fp32 out: [weight | bias] columns, a row per program
    q_partial_width,  # C for each of the query norm's weight and bias that exists
    num_slots,  # destinations with edges (they hold the first slots)
    heads_per_program,
    H,
    C,
    score_scale,  # log2(e) / sqrt(C): the forward's log2-domain scores
    sm_scale,  # 1 / sqrt(C)
    eps_q,
    eps_k,
    EDGE_DIM: tl.constexpr,
    HAS_EDGE_BIAS: tl.constexpr,
    NORM: tl.constexpr,  # tiles.NORM_NONE / NORM_RMS / NORM_LAYER
    HAS_Q_WEIGHT: tl.constexpr,
    HAS_Q_BIAS: tl.constexpr,
    HAS_K_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,  # destinations per program (>= 16: tl.dot)
    BLOCK_C: tl.constexpr,  # C padded to a power of two, at least 16 (tl.dot)
    BLOCK_D: tl.constexpr,  # EDGE_DIM + HAS_EDGE_BIAS padded to a power of two, at least 16 (tl.dot)
):
    """The by-destination pass of backward_kernels.py (its docstring has the sums) for a block of destinations, with
    e's terms through the node's projections onto W, and e's term of dq', S W, added before the norm's backward."""
    nodes, slot_mask, start, end, degree = _destination_block(dst_by_slot_ptr, dst_offsets_ptr, num_slots, BLOCK_N)
    w_q = load_norm_param(q_weight_ptr, C, HAS_Q_WEIGHT, 1.0, BLOCK_C)[None, :]
    b_q = load_norm_param(q_bias_ptr, C, HAS_Q_BIAS, 0.0, BLOCK_C)[None, :]
    w_k = load_norm_param(k_weight_ptr, C, HAS_K_WEIGHT, 1.0, BLOCK_C)[None, :]
    b_k = tl.zeros_like(w_k)
    row_mask = slot_mask[:, None] & (tl.arange(0, BLOCK_C)[None, :] < C)
    extended_dim = EDGE_DIM + HAS_EDGE_BIAS
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    proj_mask = slot_mask[:, None] & (offs_d < extended_dim)
    grad_w_q = tl.zeros([BLOCK_C], tl.float32)
    grad_b_q = tl.zeros([BLOCK_C], tl.float32)
    first_head, last_head = _head_range(H, heads_per_program)
    for head in range(first_head, last_head):
        query_raw = _load_rows(query_ptr, nodes, head, row_mask, H, C, BLOCK_C)
        query = query_raw
        if NORM != NORM_NONE:
            mean_q, rstd_q = norm_stats(query_raw, C, eps_q, NORM)
            query = norm_apply(query_raw, mean_q, rstd_q, w_q, b_q, NORM)
        grad_out = _load_rows(grad_out_ptr, nodes, head, row_mask, H, C, BLOCK_C)
        node_head = nodes * H + head
        lse = tl.load(lse_ptr + node_head, mask=slot_mask, other=0.0)
        weight = extended_weight_tile(
            edge_weight_ptr, edge_bias_ptr, w_stride_d, w_stride_hc, head, C, EDGE_DIM, HAS_EDGE_BIAS, BLOCK_D,
            BLOCK_C,
        )  # fmt: skip
        proj_offsets = node_head[:, None] * extended_dim + offs_d
        query_proj = tl.load(query_proj_ptr + proj_offsets, mask=proj_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        grad_out_proj = tl.dot(grad_out, tl.trans(weight), input_precision="tf32x3")
        tl.store(grad_out_proj_ptr + proj_offsets, grad_out_proj, mask=proj_mask)
        # Sums with the shift c = the node's first da (backward_kernels.py: equal messages give exactly 0).
        delta = tl.zeros([BLOCK_N], tl.float32)
        shift = tl.zeros([BLOCK_N], tl.float32)
        a_sum = tl.zeros([BLOCK_N], tl.float32)
        acc_a = tl.zeros([BLOCK_N, BLOCK_C], tl.float32)
        acc_b = tl.zeros([BLOCK_N, BLOCK_C], tl.float32)
        feature_a = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        feature_a_da = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        step = degree * 0
        while step < degree:
            valid, edge_id, key, value, features = _block_edge_step(
                step, start, end, slot_mask, key_ptr, value_ptr, edge_features_ptr, csc_src_ptr, csc_edge_id_ptr,
                w_k, b_k, head, H, C, eps_k, EDGE_DIM, HAS_EDGE_BIAS, NORM, BLOCK_C, BLOCK_D,
            )  # fmt: skip
            score = tl.sum(query * key, axis=1) + tl.sum(query_proj * features, axis=1)
            da = tl.sum(grad_out * value, axis=1) + tl.sum(grad_out_proj * features, axis=1)
            a = tl.where(valid, tl.exp2(score * score_scale - lse), 0.0)
            shift = tl.where(step == 0, da, shift)
            a_da = a * (da - shift)
            delta += a_da
            a_sum += a
            acc_a += a_da[:, None] * key
            acc_b += a[:, None] * key
            feature_a += a[:, None] * features
            feature_a_da += a_da[:, None] * features
            edge_head = edge_id * H + head
            tl.store(attn_ptr + edge_head, a, mask=valid)
            tl.store(grad_attn_ptr + edge_head, da, mask=valid)
            step += 1
        node_delta = delta / tl.where(slot_mask, a_sum, 1.0)  # over sum(a): backward_kernels.py says why
        grad_s_x = (feature_a_da - node_delta[:, None] * feature_a) * sm_scale  # S
        sums_offsets = (nodes[:, None] * 2 * H + head) * extended_dim + offs_d
        tl.store(feature_sums_ptr + sums_offsets, feature_a, mask=proj_mask)
        tl.store(feature_sums_ptr + sums_offsets + H * extended_dim, grad_s_x, mask=proj_mask)
        # dL/dq' = (A - D B) / sqrt(C) + S W, e's term expanded here for the whole block.
        grad_q = (acc_a - node_delta[:, None] * acc_b) * sm_scale
        grad_q += tl.dot(grad_s_x, weight, input_precision="tf32x3")
        if NORM != NORM_NONE:
            grad_q_norm = grad_q
            grad_q, q_hat = normalize_heads_backward(query_raw, mean_q, rstd_q, w_q, grad_q_norm, row_mask, C, NORM)
            if HAS_Q_WEIGHT:
                grad_w_q += tl.sum(grad_q_norm * q_hat, axis=0)
            if HAS_Q_BIAS:
                grad_b_q += tl.sum(grad_q_norm, axis=0)
        _store_rows(grad_query_ptr, nodes, head, row_mask, H, C, grad_q, BLOCK_C)
        tl.store(delta_ptr + node_head, node_delta + shift, mask=slot_mask)
    if NORM != NORM_NONE:
        store_param_grad_partial(
            q_param_grad_partial_ptr, tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), q_partial_width,
            grad_w_q, grad_b_q, C, HAS_Q_WEIGHT, HAS_Q_BIAS, BLOCK_C,
        )  # fmt: skip
