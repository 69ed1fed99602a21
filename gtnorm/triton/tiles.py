"""@triton.jit helpers that move [H, C] node/edge rows between memory and fp32 register tiles.

Every [N, H, C] tensor is contiguous, so the BLOCK_H heads a program handles are BLOCK_H*C consecutive
elements of a row, read or written as one contiguous segment. Row indices are widened to int64
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
def store_streamed_row(ptr, row, offsets, mask, row_len, value):
    """store_row for results nothing reads again in the kernel: marked first to leave L2, so that they do not
    push out the rows that later edges gather (measured 0.5-1.2 % on the by-source pass, benchmarks/NOTES.md)."""
    tl.store(
        ptr + row.to(tl.int64) * row_len + offsets, value.to(ptr.dtype.element_ty), mask=mask,
        eviction_policy="evict_first",
    )  # fmt: skip


@triton.jit
def program_edge_run(offsets_ptr, nodes_per_program, num_nodes):
    """The stretch ``start .. end`` of walk positions this program takes: the edges of its run of
    ``nodes_per_program`` consecutive slots (``offsets_ptr``: [num_nodes + 1] by slot)."""
    first_slot = tl.program_id(0) * nodes_per_program
    start = tl.load(offsets_ptr + first_slot)
    end = tl.load(offsets_ptr + tl.minimum(first_slot + nodes_per_program, num_nodes))
    return start, end


@triton.jit
def walk_position(node_ptr, pos, start, end):
    """The node that edge position ``pos`` of a walk belongs to, and whether pos is the node's first and its
    last position within the program's run ``start .. end`` (the run holds whole nodes)."""
    node = tl.load(node_ptr + pos)
    prev_node = tl.load(node_ptr + pos - 1, mask=pos > start, other=-1)
    next_node = tl.load(node_ptr + pos + 1, mask=pos + 1 < end, other=-1)
    return node, node != prev_node, node != next_node


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
