"""@triton.jit helpers of the fused edge projection: the edge features e_ij = x_ij W + b (x_ij: the edge's D raw
attributes, W [D, H*C], b [H*C]) used without ever being formed.

Everything the attention does with e is linear in it, so each use splits into a part per node, computed once from
W, and a part per edge of D numbers per head:

    <q'_i, e_ij>          = sum_d x_ij[d] <q'_i, W_d>          (scores; and <dO_i, e_ij> of the backward alike)
    sum_j a_ij e_ij       = (sum_j a_ij x_ij) W                 (messages; the backward's sums over k' + e alike)

An edge then costs O(H D) flops and a D-element load instead of an [H, C] row (or O(H C D) flops to rebuild it),
and a node O(H C D) flops with W read from L1/L2. The bias is W's extra row D, matched by a constant 1 appended to
x ("extended" rows and columns below), so it needs no terms of its own. Coefficient tiles are [BLOCK_H, BLOCK_D]:
the program's heads by the D (+1) extended feature columns.
"""

import triton
import triton.language as tl


@triton.jit
def feature_tile_offsets(head_start, H, width, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Offsets [BLOCK_H, BLOCK_D] of heads head_start.. of one [H, width] row of per-head feature coefficients,
    and their mask."""
    offs_h = head_start + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    return offs_h[:, None] * width + offs_d[None, :], (offs_h[:, None] < H) & (offs_d[None, :] < width)


@triton.jit
def load_edge_features(features_ptr, edge_id, D: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_D: tl.constexpr):
    """The extended attributes of one edge as fp32 [BLOCK_D]: its D attributes, then 1 where there is a bias, then 0."""
    offs_d = tl.arange(0, BLOCK_D)
    x = tl.load(features_ptr + edge_id.to(tl.int64) * D + offs_d, mask=offs_d < D, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x = tl.where(offs_d == D, 1.0, x)
    return x


@triton.jit
def _extended_weight_row(
    weight_ptr, bias_ptr, d: tl.constexpr, w_stride_d, w_stride_hc, offsets, mask, D: tl.constexpr
):
    """Row d of W extended by b, at a program's [BLOCK_H, BLOCK_C] row offsets (head * C + channel), as fp32."""
    if d < D:
        row = tl.load(weight_ptr + d * w_stride_d + offsets * w_stride_hc, mask=mask, other=0.0)
    else:
        row = tl.load(bias_ptr + offsets, mask=mask, other=0.0)
    return row.to(tl.float32)


@triton.jit
def project_onto_weights(
    rows,
    weight_ptr,
    bias_ptr,
    w_stride_d,
    w_stride_hc,
    offsets,
    mask,
    D: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """<rows_h, W_d,h> for every head h and extended row d of W: [BLOCK_H, BLOCK_D] from rows [BLOCK_H, BLOCK_C]
    (0 on padding columns)."""
    offs_d = tl.arange(0, BLOCK_D)
    coef = tl.zeros((rows.shape[0], BLOCK_D), tl.float32)
    for d in tl.static_range(D + HAS_BIAS):
        row = _extended_weight_row(weight_ptr, bias_ptr, d, w_stride_d, w_stride_hc, offsets, mask, D)
        coef = tl.where(offs_d[None, :] == d, tl.sum(rows * row, axis=1)[:, None], coef)
    return coef


@triton.jit
def expand_with_weights(
    coef,
    weight_ptr,
    bias_ptr,
    w_stride_d,
    w_stride_hc,
    offsets,
    mask,
    D: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """sum_d coef[h, d] W_d,h over the extended rows of W: [BLOCK_H, BLOCK_C] from coef [BLOCK_H, BLOCK_D]."""
    offs_d = tl.arange(0, BLOCK_D)
    rows = tl.zeros(offsets.shape, tl.float32)
    for d in tl.static_range(D + HAS_BIAS):
        row = _extended_weight_row(weight_ptr, bias_ptr, d, w_stride_d, w_stride_hc, offsets, mask, D)
        rows += tl.sum(tl.where(offs_d[None, :] == d, coef, 0.0), axis=1)[:, None] * row
    return rows


@triton.jit
def project_pair_onto_weights(
    rows_a,
    rows_b,
    weight_ptr,
    bias_ptr,
    w_stride_d,
    w_stride_hc,
    offsets,
    mask,
    D: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """project_onto_weights of two tiles at once: each row of W is loaded once for both (at a node's first
    edge the by-destination pass projects q' and dO; W's rows come from L1/L2, and their loads are what the
    projection costs per node)."""
    offs_d = tl.arange(0, BLOCK_D)
    coef_a = tl.zeros((rows_a.shape[0], BLOCK_D), tl.float32)
    coef_b = tl.zeros((rows_b.shape[0], BLOCK_D), tl.float32)
    for d in tl.static_range(D + HAS_BIAS):
        row = _extended_weight_row(weight_ptr, bias_ptr, d, w_stride_d, w_stride_hc, offsets, mask, D)
        coef_a = tl.where(offs_d[None, :] == d, tl.sum(rows_a * row, axis=1)[:, None], coef_a)
        coef_b = tl.where(offs_d[None, :] == d, tl.sum(rows_b * row, axis=1)[:, None], coef_b)
    return coef_a, coef_b


@triton.jit
def expand_pair_with_weights(
    coef_a,
    coef_b,
    weight_ptr,
    bias_ptr,
    w_stride_d,
    w_stride_hc,
    offsets,
    mask,
    D: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """expand_with_weights of two coefficient tiles at once, loading each row of W once for both."""
    offs_d = tl.arange(0, BLOCK_D)
    rows_a = tl.zeros(offsets.shape, tl.float32)
    rows_b = tl.zeros(offsets.shape, tl.float32)
    for d in tl.static_range(D + HAS_BIAS):
        row = _extended_weight_row(weight_ptr, bias_ptr, d, w_stride_d, w_stride_hc, offsets, mask, D)
        rows_a += tl.sum(tl.where(offs_d[None, :] == d, coef_a, 0.0), axis=1)[:, None] * row
        rows_b += tl.sum(tl.where(offs_d[None, :] == d, coef_b, 0.0), axis=1)[:, None] * row
    return rows_a, rows_b


@triton.jit
def features_dot(coef, x):
    """sum_d coef[h, d] x[d] per head: [BLOCK_H] from coef [BLOCK_H, BLOCK_D] and extended attributes x [BLOCK_D]."""
    return tl.sum(coef * x[None, :], axis=1)
