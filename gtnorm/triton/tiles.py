"""@triton.jit helpers that move [H, C] node/edge rows between memory and fp32 register tiles.

Every [N, H, C] tensor is contiguous, so the BLOCK_H heads a program handles are BLOCK_H*C consecutive
elements of a row: a gather of BLOCK_E rows reads BLOCK_E contiguous segments. Row indices are widened to int64
before the multiply, because M*H*C passes 2**31 on the largest graphs.
"""

import triton
import triton.language as tl

from gtnorm.rmsnorm.math import rms_norm_forward


@triton.jit
def row_tile_offsets(head_start, H, C, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr):
    """Offsets [BLOCK_H, BLOCK_C] of heads head_start.. of one row, their mask, and the head indices."""
    offs_h = head_start + tl.arange(0, BLOCK_H)
    offs_c = tl.arange(0, BLOCK_C)
    offsets = offs_h[:, None] * C + offs_c[None, :]
    mask = (offs_h[:, None] < H) & (offs_c[None, :] < C)
    return offsets, mask, offs_h


@triton.jit
def load_row(ptr, row, offsets, mask, row_len):
    """Row ``row`` of a [n, H, C] tensor as fp32 [BLOCK_H, BLOCK_C]; padding lanes are 0."""
    return tl.load(ptr + row.to(tl.int64) * row_len + offsets, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_row(ptr, row, offsets, mask, row_len, value):
    tl.store(ptr + row.to(tl.int64) * row_len + offsets, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def gather_rows(ptr, rows, row_mask, offsets, mask, row_len):
    """Rows ``rows`` [BLOCK_E] of a [n, H, C] tensor as fp32 [BLOCK_E, BLOCK_H, BLOCK_C]."""
    ptrs = ptr + rows.to(tl.int64)[:, None, None] * row_len + offsets[None, :, :]
    return tl.load(ptrs, mask=row_mask[:, None, None] & mask[None, :, :], other=0.0).to(tl.float32)


@triton.jit
def scatter_rows(ptr, rows, row_mask, offsets, mask, row_len, value):
    ptrs = ptr + rows.to(tl.int64)[:, None, None] * row_len + offsets[None, :, :]
    tl.store(ptrs, value.to(ptr.dtype.element_ty), mask=row_mask[:, None, None] & mask[None, :, :])


@triton.jit
def mask_if_valid(mask, node, num_nodes):
    """``mask`` where node < num_nodes, else all False.

    The comparison is made on a block: the interpreter mistypes ``block_mask & scalar_bool``.
    """
    return mask & ((mask.to(tl.int32) * 0 + node) < num_nodes)


@triton.jit
def load_incoming_edge_rows(
    key_ptr, value_ptr, edge_attr_ptr, csc_src_ptr, csc_edge_id_ptr, pos, end, offsets, mask, row_len,
    HAS_EDGE_ATTR: tl.constexpr,
):
    """k, v and e rows [BLOCK_E, BLOCK_H, BLOCK_C] of the edges at CSC positions pos (< end), and their
    caller's edge ids; e = 0 without edge features."""
    edge_mask = pos < end
    src = tl.load(csc_src_ptr + pos, mask=edge_mask, other=0)
    k = gather_rows(key_ptr, src, edge_mask, offsets, mask, row_len)
    v = gather_rows(value_ptr, src, edge_mask, offsets, mask, row_len)
    edge_id = tl.load(csc_edge_id_ptr + pos, mask=edge_mask, other=0)
    if HAS_EDGE_ATTR:
        e = gather_rows(edge_attr_ptr, edge_id, edge_mask, offsets, mask, row_len)
    else:
        e = tl.zeros_like(k)
    return k, v, e, edge_id


@triton.jit
def load_norm_weight(ptr, C, HAS_WEIGHT: tl.constexpr, BLOCK_C: tl.constexpr):
    """The RMSNorm affine weight [C] as fp32 [BLOCK_C]; ones when the norm has no weight."""
    offs_c = tl.arange(0, BLOCK_C)
    if HAS_WEIGHT:
        w = tl.load(ptr + offs_c, mask=offs_c < C, other=0.0).to(tl.float32)
    else:
        w = tl.full([BLOCK_C], 1.0, tl.float32)
    return w


@triton.jit
def normalize_heads(x, w, C, eps, QK_NORM: tl.constexpr):
    """RMSNorm of every head of a [..., BLOCK_H, BLOCK_C] tile (weight shared by the heads), or x itself.

    Returns (normalised x, rstd) with rstd broadcastable against x; rstd is 1 without the norm.
    """
    if QK_NORM:
        y, rstd = rms_norm_forward(x, w, C, eps, len(x.shape) - 1)
    else:
        y = x
        rstd = 1.0
    return y, rstd
