"""A mapper chunk's source rows, gathered from the mapper's sources, with a backward that gathers too.

Anemoi's chunk takes ``x_src[src_ids]``, whose backward is torch's indexing backward: it sorts the ids and
accumulates rows into a zero-filled gradient of all the sources (index_put_ with accumulate). A chunk's ids are
sorted and distinct, so every source's gradient row is one row of the chunk's gradient, or zero: one gather by each
source's position in the chunk (made once per graph with the chunk) gives it, bitwise the same, with no sort and
no atomics. In an O800 training step on an H200 that sort-based backward took 49 ms of GPU time on both sides
(the encoder's fp32 grid input, 208 columns wide, and the decoder's hidden states; benchmarks/NOTES.md v31).
"""

from __future__ import annotations

import torch
from torch import Tensor


def source_positions(src_ids: Tensor, num_src: int) -> Tensor:  # src_ids [N_src_chunk] -> [N_src]
    """Each source's row in the chunk, N_src_chunk where it has none (the zero row the backward appends)."""
    dtype = torch.int32 if src_ids.numel() < 2**31 - 1 else torch.int64
    positions = torch.full((num_src,), src_ids.numel(), dtype=dtype, device=src_ids.device)
    positions[src_ids] = torch.arange(src_ids.numel(), dtype=dtype, device=src_ids.device)
    return positions


class _GatherSourceRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_src: Tensor, src_ids: Tensor, positions: Tensor) -> Tensor:
        ctx.save_for_backward(positions)
        return x_src.index_select(0, src_ids)

    @staticmethod
    def backward(ctx, grad_chunk: Tensor):
        (positions,) = ctx.saved_tensors
        padded = torch.cat([grad_chunk, grad_chunk.new_zeros(1, *grad_chunk.shape[1:])])
        return padded.index_select(0, positions), None, None


def gather_source_rows(
    x_src: Tensor,  # [N_src, ...]
    src_ids: Tensor,  # [N_src_chunk], sorted and distinct
    positions: Tensor,  # [N_src]: source_positions(src_ids, N_src)
) -> Tensor:  # [N_src_chunk, ...]
    """x_src[src_ids], its gradient gathered by ``positions`` (module docstring)."""
    return _GatherSourceRows.apply(x_src, src_ids, positions)
