"""The columns of a mapper's destination input whose gradient reaches a parameter, so that the chunks' backward
holds only those.

Anemoi's model feeds its decoder the grid input it gave the encoder: the data's variables over the input steps,
the nodes' sin/cos coordinates and the nodes' trainable parameters, one fp32 row each (208 wide at the default
config's 8 trainable columns). Only the last columns reach a parameter, but the row requires a gradient as a
whole, so every decoder chunk's backward makes the gradient of all its columns; the destinations are split once
before the chunks (mapper._SplitDestinations) and torch's split joins its outputs' gradients only when the last
one arrives. At O800 with 4 chunks that is three [647,200, 208] fp32 gradients (1.5 GiB) held through the last
chunk's backward, where the step peaks (benchmarks/NOTES.md v40). Told which columns reach a parameter, the split
takes those columns apart: each chunk's rows are the whole row's values, detached, with a backward that hands on
the chunk's gradient of those columns alone ([647,200, 8] a chunk). Values and gradients are bitwise the same.

gtnorm's model marks the grid input it assembles (model.AnemoiModelEncProcDec) when no other column can need a
gradient: the data does not require one (not when a user takes gradients with respect to the input) and the
model's forward runs eagerly or under blocks-only compilation (not while torch.compile traces the whole model, where
the mark, a lookup by tensor identity, is not made). The decoder finds the mark where its destinations are that
tensor itself, as with the default config's target features (``encoded_data``); a target joined from several
features is a new tensor, unmarked. Unmarked inputs are split whole, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.weak import WeakTensorKeyDictionary

_MARKED: WeakTensorKeyDictionary = WeakTensorKeyDictionary()


def mark_grad_columns(x: Tensor, start: int) -> Tensor:  # x: [N, C]
    """Records that only ``x[:, start:]`` can pass a gradient on (the caller's knowledge of how x was made).
    Nothing is marked while torch.compile traces, or where x needs no gradient; x is returned unchanged."""
    if torch.compiler.is_compiling() or not x.requires_grad:
        return x
    if x.dim() != 2 or not 0 <= start < x.shape[1]:
        raise ValueError(f"grad columns from {start} of a tensor of shape {tuple(x.shape)}: not a 2-d column range")
    _MARKED[x] = start
    return x


def grad_columns_start(x: Tensor) -> int | None:
    """The first column of x whose gradient reaches a parameter if x was marked, else None."""
    if torch.compiler.is_compiling():
        return None
    return _MARKED.get(x)


class _RowsWithGradColumns(torch.autograd.Function):
    """The rows' values, whose backward passes on the gradient of the columns from ``start`` only."""

    @staticmethod
    def forward(ctx, values: Tensor, grad_part: Tensor, start: int) -> Tensor:  # [n, C], [n, C - start] -> [n, C]
        ctx.start = start
        return values.view_as(values)

    @staticmethod
    def backward(ctx, grad: Tensor):  # [n, C]
        # A copy, not a view: a view would keep the whole [n, C] gradient alive until the split joins the chunks.
        return None, grad[:, ctx.start :].contiguous(), None


@dataclass(frozen=True)
class SplitRows:
    """x split into chunks of rows, each taken by ``chunk(i)`` when its chunk runs (split_rows)."""

    values: tuple[Tensor, ...]  # [n_i, C] each: views of x, detached where marked
    grad_parts: tuple[Tensor, ...] | None  # [n_i, C - start] each: views of x's marked columns; None: unmarked
    start: int | None

    def chunk(self, i: int) -> Tensor:  # [n_i, C]
        if self.grad_parts is None:
            return self.values[i]
        return _RowsWithGradColumns.apply(self.values[i], self.grad_parts[i], self.start)


def split_rows(x: Tensor, sizes: list[int]) -> SplitRows:  # x: [N, C]
    """x split into rows of ``sizes``: views, unless x was marked (mark_grad_columns), then rows with the values of
    x whose backward passes on the marked columns' gradient only (module docstring). The narrowing is made when a
    chunk takes its rows, inside the chunk: autograd runs the ready node made last first, so a node made here, at
    the split, would run after every chunk's backward and hold each chunk's whole gradient in its input until then
    (measured at O800: the step's peak unchanged)."""
    start = grad_columns_start(x)
    if start is None:
        return SplitRows(x.split(sizes), None, None)
    return SplitRows(x.detach().split(sizes), x[:, start:].split(sizes), start)
