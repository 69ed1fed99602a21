"""The fused edge projection's per-node products with the edge weights, over blocks of nodes on the tensor cores.

Every use of the edge features e_ij = x_ij W + b is linear in them (edge_projection.py), so what a destination
contributes is a product of one of its rows with W's slice of each head, never an edge's:

    projection  [C] x [C, D + 1] -> [D + 1]:  <q'_i, W_d> (forward scores), <dO_i, W_d> (backward);
    expansion   [D + 1] x [D + 1, C] -> [C]:  (sum_j p_ij x_ij) W (forward messages), S_i W (dq').

Inside the edge walks these were per-node sweeps over W's D + 1 rows: ~100 KiB of L1/L2 loads per node at
16 x 64, D = 11, more than all of a 3-edge node's other traffic, and registers that made the by-destination pass
spill (benchmarks/NOTES.md, v9). Here a program takes BLOCK_N whole rows (every head: one contiguous stretch of
memory), loads each head's [C, D + 1] slice of W once for them, and tl.dot does the products; the walks only load
and store [H, D + 1] fp32 rows per node. (One head per program was 3x slower: ~200k programs of 4 KiB each.)

Heads wider than the plan's channel tile (ProjectionLaunch.channel_block: wide heads, or many weight rows) are
walked in tiles of BLOCK_C channels (CHUNKED), so that the tl.dot operands fit in shared memory; a norm's
statistics then take passes of their own over the row (chunked_norm_stats), and in the expansion with a norm the
row reductions of its backward one more, with the norm weight's partials in one row per program and head.

Expanding into a row that another kernel wrote (out, dq) rounds a 16-bit row twice, once per part; float32 rows
are exact to tf32x3's products.
"""

import triton
import triton.language as tl

from gtnorm.triton.tiles import (
    NORM_LAYER,
    NORM_NONE,
    chunked_norm_stats,
    load_norm_param,
    norm_apply,
    norm_stats,
    normalize_heads,
    normalize_heads_backward,
    row_chunk,
    store_param_grad_partial,
)


@triton.jit
def _extended_weight_tile(
    weight_ptr, bias_ptr, w_stride_d, w_stride_hc, head, C, D: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr, c0=0,
):  # fmt: skip
    """W's rows d < D of one head, then b as row D where there is a bias, as fp32 [BLOCK_D, BLOCK_C] (0 on padding):
    the head's channels c0 .. c0 + BLOCK_C."""
    offs_d = tl.arange(0, BLOCK_D)[:, None]
    offs_c = c0 + tl.arange(0, BLOCK_C)[None, :]
    columns = head * C + offs_c
    tile = tl.load(
        weight_ptr + offs_d * w_stride_d + columns * w_stride_hc, mask=(offs_d < D) & (offs_c < C), other=0.0
    ).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + columns + offs_d * 0, mask=(offs_d == D) & (offs_c < C), other=0.0)
        tile += bias.to(tl.float32)
    return tile


@triton.jit
def _node_block(num_nodes, H, C, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's block of nodes: their int64 indices [BLOCK_N], mask, and the [BLOCK_N, BLOCK_C] offsets
    (of head 0) and mask of their rows in an [N, H, C] tensor."""
    nodes = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    node_mask = nodes < num_nodes
    offs_c = tl.arange(0, BLOCK_C)
    row_offsets = nodes[:, None] * (H * C) + offs_c[None, :]
    return nodes, node_mask, row_offsets, node_mask[:, None] & (offs_c[None, :] < C)


@triton.jit
def project_rows_kernel(
    rows_ptr,  # [N, H, C]
    norm_weight_ptr,  # [C] (unused without HAS_NORM_WEIGHT)
    norm_bias_ptr,  # [C] (unused without HAS_NORM_BIAS)
    edge_weight_ptr,  # [D, H * C], strides (w_stride_d, w_stride_hc)
    edge_bias_ptr,  # [H * C] (unused without HAS_EDGE_BIAS)
    w_stride_d,
    w_stride_hc,
    proj_ptr,  # [N, H, D1] fp32 out, D1 = D + HAS_EDGE_BIAS
    num_nodes,
    H,
    C,
    eps,
    D: tl.constexpr,
    HAS_EDGE_BIAS: tl.constexpr,
    NORM: tl.constexpr,  # tiles.NORM_*: the norm the rows get first (NORM_NONE for dO)
    HAS_NORM_WEIGHT: tl.constexpr,
    HAS_NORM_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,  # D1 padded to a power of two, at least 16 (tl.dot)
    BLOCK_C: tl.constexpr,  # channels per tile: C padded to a power of two (at least 16), or fewer with CHUNKED
    CHUNKED: tl.constexpr,  # BLOCK_C < C: each head's row in several tiles (module docstring)
):
    """proj[n, h, d] = <norm(rows[n, h]), W_d,h> for d < D, and <norm(rows[n, h]), b_h> at d = D with a bias."""
    nodes, node_mask, row_offsets, row_mask = _node_block(num_nodes, H, C, BLOCK_N, BLOCK_C)
    d1 = D + HAS_EDGE_BIAS
    offs_d = tl.arange(0, BLOCK_D)
    proj_offsets = nodes[:, None] * (H * d1) + offs_d[None, :]
    proj_mask = node_mask[:, None] & (offs_d[None, :] < d1)
    if not CHUNKED:
        w = load_norm_param(norm_weight_ptr, C, HAS_NORM_WEIGHT, 1.0, BLOCK_C)
        b = load_norm_param(norm_bias_ptr, C, HAS_NORM_BIAS, 0.0, BLOCK_C)
    for head in range(H):
        head_rows = rows_ptr + head * C
        if CHUNKED:
            if NORM != NORM_NONE:
                mean, rstd = chunked_norm_stats(head_rows, row_offsets, node_mask, C, eps, NORM, BLOCK_C)
            proj = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
            for c0 in range(0, C, BLOCK_C):
                rows, _ = row_chunk(head_rows, row_offsets, node_mask, c0, C, BLOCK_C)
                if NORM != NORM_NONE:
                    w = load_norm_param(norm_weight_ptr + c0, C - c0, HAS_NORM_WEIGHT, 1.0, BLOCK_C)
                    b = load_norm_param(norm_bias_ptr + c0, C - c0, HAS_NORM_BIAS, 0.0, BLOCK_C)
                    rows = norm_apply(rows, mean, rstd, w[None, :], b[None, :], NORM)
                weights = _extended_weight_tile(
                    edge_weight_ptr, edge_bias_ptr, w_stride_d, w_stride_hc, head, C, D, HAS_EDGE_BIAS, BLOCK_D,
                    BLOCK_C, c0,
                )  # fmt: skip
                proj += tl.dot(rows, tl.trans(weights), input_precision="tf32x3")
        else:
            rows = tl.load(head_rows + row_offsets, mask=row_mask, other=0.0).to(tl.float32)
            if NORM != NORM_NONE:
                rows = normalize_heads(rows, w[None, :], b[None, :], C, eps, NORM)
            weights = _extended_weight_tile(
                edge_weight_ptr, edge_bias_ptr, w_stride_d, w_stride_hc, head, C, D, HAS_EDGE_BIAS, BLOCK_D, BLOCK_C
            )
            # tf32x3: fp32 accuracy (three tf32 products) at tensor-core speed; plain tf32 would round to ~1e-3.
            proj = tl.dot(rows, tl.trans(weights), input_precision="tf32x3")  # [BLOCK_N, BLOCK_D]
        tl.store(proj_ptr + proj_offsets + head * d1, proj, mask=proj_mask)


@triton.jit
def _add_expanded_chunked(
    sums, edge_weight_ptr, edge_bias_ptr, w_stride_d, w_stride_hc, target_rows, query_rows, q_weight_ptr, partial_row,
    partial_width, row_offsets, node_mask, head, C, eps_q, D: tl.constexpr, HAS_EDGE_BIAS: tl.constexpr,
    NORM: tl.constexpr, HAS_Q_WEIGHT: tl.constexpr, HAS_Q_BIAS: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    """add_expanded_rows_kernel's work for one head, in channel tiles: with a norm, a pass for the statistics, one
    for the row sums of its backward (g = dy w: sum g and sum g x_hat) and one that writes, whose parameter-gradient
    terms go to this head's own partial row (``partial_row``: a pointer to it)."""
    if NORM != NORM_NONE:
        mean, rstd = chunked_norm_stats(query_rows, row_offsets, node_mask, C, eps_q, NORM, BLOCK_C)
        sum_g = tl.zeros_like(mean)
        sum_gx = tl.zeros_like(mean)
        for c0 in range(0, C, BLOCK_C):
            weights = _extended_weight_tile(
                edge_weight_ptr, edge_bias_ptr, w_stride_d, w_stride_hc, head, C, D, HAS_EDGE_BIAS, BLOCK_D, BLOCK_C,
                c0,
            )  # fmt: skip
            grad_q_norm = tl.dot(sums, weights, input_precision="tf32x3")
            q_raw, mask = row_chunk(query_rows, row_offsets, node_mask, c0, C, BLOCK_C)
            w = load_norm_param(q_weight_ptr + c0, C - c0, HAS_Q_WEIGHT, 1.0, BLOCK_C)
            g = tl.where(mask, grad_q_norm * w[None, :], 0.0)
            q_hat = tl.where(mask, (q_raw - mean) * rstd, 0.0)
            sum_g += tl.sum(g, axis=1, keep_dims=True)
            sum_gx += tl.sum(g * q_hat, axis=1, keep_dims=True)
        if NORM != NORM_LAYER:
            sum_g = tl.zeros_like(sum_g)  # RMSNorm's backward has no mean term
    for c0 in range(0, C, BLOCK_C):
        weights = _extended_weight_tile(
            edge_weight_ptr, edge_bias_ptr, w_stride_d, w_stride_hc, head, C, D, HAS_EDGE_BIAS, BLOCK_D, BLOCK_C, c0
        )
        rows = tl.dot(sums, weights, input_precision="tf32x3")  # [BLOCK_N, BLOCK_C]
        target, mask = row_chunk(target_rows, row_offsets, node_mask, c0, C, BLOCK_C)
        if NORM != NORM_NONE:
            q_raw, _ = row_chunk(query_rows, row_offsets, node_mask, c0, C, BLOCK_C)
            w = load_norm_param(q_weight_ptr + c0, C - c0, HAS_Q_WEIGHT, 1.0, BLOCK_C)
            q_hat = tl.where(mask, (q_raw - mean) * rstd, 0.0)
            g = tl.where(mask, rows * w[None, :], 0.0)
            offs_c = c0 + tl.arange(0, BLOCK_C)
            if HAS_Q_WEIGHT:
                tl.store(partial_row + offs_c, tl.sum(rows * q_hat, axis=0), mask=offs_c < C)
            if HAS_Q_BIAS:
                tl.store(partial_row + (partial_width - C) + offs_c, tl.sum(rows, axis=0), mask=offs_c < C)
            rows = (g - sum_g / C - q_hat * (sum_gx / C)) * rstd
        tl.store(target_rows + row_offsets + c0, (target + rows).to(target_rows.dtype.element_ty), mask=mask)


@triton.jit
def add_expanded_rows_kernel(
    sums_ptr,  # [N, ..., H, D1] fp32: rows sums_row_stride apart, each [H, D1]
    sums_row_stride,
    edge_weight_ptr,  # [D, H * C], strides (w_stride_d, w_stride_hc)
    edge_bias_ptr,  # [H * C] (unused without HAS_EDGE_BIAS)
    w_stride_d,
    w_stride_hc,
    target_ptr,  # [N, H, C], read and written
    query_ptr,  # [N, H, C] the raw query (unused with NORM_NONE)
    q_weight_ptr,  # [C] (unused without HAS_Q_WEIGHT)
    param_grad_partial_ptr,  # [programs (x H with CHUNKED), partial_width] fp32 out (unused with NORM_NONE)
    partial_width,
    first_partial_row,
    num_nodes,
    H,
    C,
    eps_q,
    D: tl.constexpr,
    HAS_EDGE_BIAS: tl.constexpr,
    NORM: tl.constexpr,  # tiles.NORM_*; NORM_NONE: target += sums W
    HAS_Q_WEIGHT: tl.constexpr,
    HAS_Q_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,  # D1 padded to a power of two, at least 16 (tl.dot)
    BLOCK_C: tl.constexpr,  # channels per tile: C padded to a power of two (at least 16), or fewer with CHUNKED
    CHUNKED: tl.constexpr,  # BLOCK_C < C: each head's row in several tiles (module docstring)
):
    """target[n, h] += sums[n, h] W_h: the forward's messages from the edges' features (NORM_NONE).

    With a norm, sums W is a term of dL/dq' and what is added is its image under the query norm's backward (which
    is linear in dL/dq'), with its terms of the norm's weight and bias gradients in this program's row of the
    partials (row first_partial_row + program: after the by-destination pass's rows; with CHUNKED one row per
    program and head, first_partial_row + program * H + head)."""
    nodes, node_mask, row_offsets, row_mask = _node_block(num_nodes, H, C, BLOCK_N, BLOCK_C)
    offs_d = tl.arange(0, BLOCK_D)
    d1 = D + HAS_EDGE_BIAS
    sums_offsets = nodes[:, None] * sums_row_stride + offs_d[None, :]
    sums_mask = node_mask[:, None] & (offs_d[None, :] < d1)
    if CHUNKED:
        first_row = first_partial_row + tl.program_id(0).to(tl.int64) * H
        for head in range(H):
            sums = tl.load(sums_ptr + sums_offsets + head * d1, mask=sums_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
            _add_expanded_chunked(
                sums, edge_weight_ptr, edge_bias_ptr, w_stride_d, w_stride_hc, target_ptr + head * C,
                query_ptr + head * C, q_weight_ptr, param_grad_partial_ptr + (first_row + head) * partial_width,
                partial_width, row_offsets, node_mask, head, C, eps_q, D, HAS_EDGE_BIAS, NORM, HAS_Q_WEIGHT,
                HAS_Q_BIAS, BLOCK_D, BLOCK_C,
            )  # fmt: skip
        return
    w = load_norm_param(q_weight_ptr, C, HAS_Q_WEIGHT, 1.0, BLOCK_C)
    # The norm's parameter-gradient terms summed over the heads element-wise and over the block's nodes once at the
    # end: a sum across nodes crosses warps (shared memory and barriers), twice per head as each head's row was
    # reduced on its own (benchmarks/NOTES.md v40).
    grad_w = tl.zeros([BLOCK_N, BLOCK_C], tl.float32)
    grad_b = tl.zeros([BLOCK_N, BLOCK_C], tl.float32)
    for head in range(H):
        sums = tl.load(sums_ptr + sums_offsets + head * d1, mask=sums_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        weights = _extended_weight_tile(
            edge_weight_ptr, edge_bias_ptr, w_stride_d, w_stride_hc, head, C, D, HAS_EDGE_BIAS, BLOCK_D, BLOCK_C
        )
        rows = tl.dot(sums, weights, input_precision="tf32x3")  # [BLOCK_N, BLOCK_C]
        if NORM != NORM_NONE:
            q_raw = tl.load(query_ptr + row_offsets + head * C, mask=row_mask, other=0.0).to(tl.float32)
            mean, rstd = norm_stats(q_raw, C, eps_q, NORM)
            grad_q_norm = rows
            rows, q_hat = normalize_heads_backward(q_raw, mean, rstd, w[None, :], grad_q_norm, row_mask, C, NORM)
            grad_w += grad_q_norm * q_hat
            grad_b += grad_q_norm
        target = tl.load(target_ptr + row_offsets + head * C, mask=row_mask, other=0.0).to(tl.float32)
        tl.store(target_ptr + row_offsets + head * C, (target + rows).to(target_ptr.dtype.element_ty), mask=row_mask)
    if NORM != NORM_NONE:
        store_param_grad_partial(
            param_grad_partial_ptr, first_partial_row + tl.program_id(0), partial_width, tl.sum(grad_w, axis=0),
            tl.sum(grad_b, axis=0), C, HAS_Q_WEIGHT, HAS_Q_BIAS, BLOCK_C,
        )  # fmt: skip
