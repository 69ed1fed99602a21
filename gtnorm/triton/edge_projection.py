"""@triton.jit helpers of the fused edge projection: the edge features e_ij = x_ij W + b (x_ij: the edge's D raw
attributes, W [D, H*C], b [H*C]) used without ever being formed.

Everything the attention does with e is linear in it, so each use splits into a part per node and a part per edge
of D numbers per head:

    <q'_i, e_ij>          = sum_d x_ij[d] <q'_i, W_d>          (scores; and <dO_i, e_ij> of the backward alike)
    sum_j a_ij e_ij       = (sum_j a_ij x_ij) W                 (messages; the backward's sums over k' + e alike)

An edge then costs O(H D) flops and a D-element load instead of an [H, C] row. The per-node parts (projections
<q'_i, W_d>, <dO_i, W_d> and expansions through W) are products of node rows with W, computed for blocks of nodes
by node_projection_kernels.py; the edge walks load and store them as [H, D + 1] fp32 rows. The bias is W's extra
row D, matched by a constant 1 appended to x ("extended" rows and columns), so it needs no terms of its own.
Coefficient tiles are [BLOCK_H, BLOCK_D]: the program's heads by the D (+1) extended feature columns.
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
def features_dot(coef, x):
    """sum_d coef[h, d] x[d] per head: [BLOCK_H] from coef [BLOCK_H, BLOCK_D] and extended attributes x [BLOCK_D]."""
    return tl.sum(coef * x[None, :], axis=1)
