"""@triton.jit helpers that move [H, C] node/edge rows between memory and fp32 register tiles.

Every [N, H, C] tensor is contiguous, so the BLOCK_H heads a program handles are BLOCK_H*C consecutive
elements of a row, read or written as one contiguous segment. Row indices are widened to int64
before the multiply, because M*H*C passes 2**31 on the largest graphs.
"""

import triton
import triton.language as tl

from gtnorm.layernorm.math import (
    FLOAT32_MAX,
    layer_norm_affine,
    layer_norm_backward,
    layer_norm_centred,
    layer_norm_forward,
    layer_norm_normalized,
    layer_norm_stats,
)
from gtnorm.rmsnorm.math import rms_norm_backward, rms_norm_rstd


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
def load_norm_param(ptr, C, PRESENT: tl.constexpr, DEFAULT: tl.constexpr, BLOCK_C: tl.constexpr):
    """A norm weight or bias [C] as fp32 [BLOCK_C]; DEFAULT (1 for a weight, 0 for a bias) on the real lanes when the
    norm has none. 0 on padding lanes either way: the LayerNorm's output is then 0 there without a mask (norm_apply).
    """
    offs_c = tl.arange(0, BLOCK_C)
    if PRESENT:
        p = tl.load(ptr + offs_c, mask=offs_c < C, other=0.0).to(tl.float32)
    else:
        p = tl.where(offs_c < C, DEFAULT, 0.0)
    return p


@triton.jit
def store_param_grad_partial(
    partial_ptr, row, partial_width, grad_w, grad_b, C, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Row ``row`` of a norm's parameter-gradient partials (one per program): the weight's C columns, then the
    bias's (each only where the norm has it), so that one fixed-order column sum on the host serves both."""
    offs_c = tl.arange(0, BLOCK_C)
    row_ptr = partial_ptr + row.to(tl.int64) * partial_width
    if HAS_WEIGHT:
        tl.store(row_ptr + offs_c, grad_w, mask=offs_c < C)
    if HAS_BIAS:
        tl.store(row_ptr + (partial_width - C) + offs_c, grad_b, mask=offs_c < C)


# The kinds of the NORM constexpr of the attention kernels (ops.NORM_CODES maps qk_norm's names to them).
NORM_NONE = tl.constexpr(0)
NORM_RMS = tl.constexpr(1)
NORM_LAYER = tl.constexpr(2)


@triton.jit
def norm_stats(x, C, eps, NORM: tl.constexpr):
    """(mean, rstd) of every head of a [..., BLOCK_H, BLOCK_C] tile, each [..., BLOCK_H, 1]; mean is 0 for
    RMSNorm. Padding lanes of x must hold 0."""
    if NORM == NORM_LAYER:
        mean, rstd = layer_norm_stats(x, C, eps, len(x.shape) - 1)
    else:
        rstd = rms_norm_rstd(x, C, eps, len(x.shape) - 1)
        mean = tl.zeros_like(rstd)
    return mean, rstd


@triton.jit
def norm_apply(x, mean, rstd, w, b, NORM: tl.constexpr):
    """The norm of x from its statistics, weight w and bias b ([BLOCK_C], shared by the heads, 0 on padding lanes:
    load_norm_param).

    No mask (it cost one select per element of every gathered row): LayerNorm rows are 0 on padding lanes through
    w and b, so scores need no mask of their own; a padding head comes out as b, which nothing reads: its scores
    and outputs are never stored, and its gradient terms are 0 (its keys and edge features are 0, so dq' is 0
    there, and the parameter gradients take x_hat, which normalize_heads_backward masks).
    """
    if NORM == NORM_LAYER:
        y = layer_norm_affine(x, mean, rstd, w, b)
    else:
        y = x * rstd * w
    return y


@triton.jit
def normalize_heads(x, w, b, C, eps, NORM: tl.constexpr):
    """The norm of every head of a [..., BLOCK_H, BLOCK_C] tile (weight and bias shared by the heads), or x
    itself with NORM_NONE."""
    if NORM == NORM_NONE:
        y = x
    elif NORM == NORM_LAYER:
        y = layer_norm_forward(x, w, b, C, eps, len(x.shape) - 1)
    else:
        mean, rstd = norm_stats(x, C, eps, NORM)
        y = norm_apply(x, mean, rstd, w, b, NORM)
    return y


@triton.jit
def normalized_dot(x, y, C, eps, NORM: tl.constexpr):
    """<x_hat, y> for every head of [BLOCK_H, BLOCK_C] tiles, [BLOCK_H]: x normalised before its affine (x itself with
    NORM_NONE), y 0 on padding lanes. The normalisation scales the per-head sum once instead of every element of
    x: a score <q', k'> is <x_hat, q' w_k> + <q', b_k>, with the key's affine moved onto the query once per node."""
    if NORM == NORM_LAYER:
        centred, rstd = layer_norm_centred(x, C, eps, 1)
        d = tl.sum(y * centred, axis=1) * tl.reshape(rstd, [x.shape[0]])
    elif NORM == NORM_RMS:
        d = tl.sum(y * x, axis=1) * tl.reshape(rms_norm_rstd(x, C, eps, 1), [x.shape[0]])
    else:
        d = tl.sum(y * x, axis=1)
    return d


@triton.jit
def load_norm_stats(stats_ptr, offsets, mask, H, NORM: tl.constexpr):
    """(mean, rstd) at ``offsets`` (node * 2H + head, any shape) of [N, 2, H] fp32 statistics (each head's mean, then
    its rstd), shaped as offsets; 0 where masked, mean 0 unless LayerNorm."""
    rstd = tl.load(stats_ptr + offsets + H, mask=mask, other=0.0)
    mean = tl.zeros_like(rstd)
    if NORM == NORM_LAYER:
        mean = tl.load(stats_ptr + offsets, mask=mask, other=0.0)
    return mean, rstd


@triton.jit
def normalize_heads_backward(x, mean, rstd, w, dy, mask, C, NORM: tl.constexpr):
    """(dx, x_hat) for y = norm(x) given dy = dL/dy: dx, and the normalised x before the affine (0 on padding),
    whose product with dy is the weight's gradient term (dy itself is the bias's)."""
    if NORM == NORM_LAYER:
        x_hat = layer_norm_normalized(x, mean, rstd, C, len(x.shape) - 1)
        dx = layer_norm_backward(x_hat, rstd, w, dy, mask, C, len(x.shape) - 1)
    else:
        x_hat = x * rstd
        dx = rms_norm_backward(x, rstd, w, dy, C, len(x.shape) - 1)
    return dx, x_hat


@triton.jit
def row_chunk(ptr, row_offsets, node_mask, c0, C, BLOCK_C: tl.constexpr):
    """Channels c0 .. c0 + BLOCK_C of a block of head rows (``row_offsets``: [BLOCK_N, BLOCK_C] of channel 0) as fp32,
    0 past C and on masked nodes; and that mask."""
    mask = node_mask[:, None] & ((c0 + tl.arange(0, BLOCK_C))[None, :] < C)
    return tl.load(ptr + row_offsets + c0, mask=mask, other=0.0).to(tl.float32), mask


@triton.jit
def chunked_norm_stats(ptr, row_offsets, node_mask, C, eps, NORM: tl.constexpr, BLOCK_C: tl.constexpr):
    """(mean, rstd) [BLOCK_N, 1] of a block of head rows read in channel tiles: the statistics norm_stats takes from a
    whole row, with LayerNorm's two passes (the mean, then the centred variance); mean is 0 for RMSNorm."""
    total = tl.zeros([row_offsets.shape[0], 1], tl.float32)
    for c0 in range(0, C, BLOCK_C):
        x, _ = row_chunk(ptr, row_offsets, node_mask, c0, C, BLOCK_C)
        if NORM == NORM_LAYER:
            total += tl.sum(x, axis=1, keep_dims=True)
        else:
            total += tl.sum(x * x, axis=1, keep_dims=True)
    if NORM == NORM_LAYER:
        mean = total / C
        var = tl.zeros_like(total)
        for c0 in range(0, C, BLOCK_C):
            x, mask = row_chunk(ptr, row_offsets, node_mask, c0, C, BLOCK_C)
            centred = tl.where(mask, x - mean, 0.0)
            var += tl.sum(centred * centred, axis=1, keep_dims=True)
        # Finite for an all-zero row with eps = 0, as layer_norm_stats.
        rstd = tl.minimum(tl.rsqrt(var / C + eps), FLOAT32_MAX)
    else:
        mean = tl.zeros_like(total)
        rstd = tl.rsqrt(total / C + eps)
    return mean, rstd
