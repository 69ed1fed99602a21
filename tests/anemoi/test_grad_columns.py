"""gtnorm/anemoi/grad_columns.py: rows split from a marked input have its values and pass on the gradient of the
marked columns only, bitwise the gradient a plain split gives those columns; unmarked inputs split as views."""

from __future__ import annotations

import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

import torch  # noqa: E402

from gtnorm.anemoi.grad_columns import grad_columns_start, mark_grad_columns, split_rows  # noqa: E402

SIZES = [4, 3, 3]


def grid_input(trainable: torch.Tensor) -> torch.Tensor:
    """[10, 7]: five data columns that need no gradient, then ``trainable``'s two columns, as Anemoi's row is."""
    data = torch.randn(10, 5, generator=torch.Generator().manual_seed(1), dtype=trainable.dtype)
    return torch.cat([data, trainable], dim=-1)


def loss_over_chunks(chunks, weight: torch.Tensor) -> torch.Tensor:
    return sum((chunk @ weight).sin().sum() for chunk in chunks)


def test_marked_rows_give_the_split_s_values_and_gradients_holding_the_marked_columns_only():
    weight = torch.randn(7, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    grads = {}
    for how in ("marked", "plain"):
        trainable = torch.randn(10, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        trainable.requires_grad_()
        x = grid_input(trainable)
        if how == "marked":
            assert mark_grad_columns(x, 5) is x and grad_columns_start(x) == 5
        chunks = split_rows(x, SIZES)
        for chunk, reference in zip(chunks, x.detach().split(SIZES), strict=True):
            assert torch.equal(chunk, reference)
        arriving = []  # the gradients the split node holds until its last output's arrives
        split_node = chunks[0].grad_fn if how == "plain" else chunks[0].grad_fn.next_functions[1][0]
        assert type(split_node).__name__.startswith("Split")
        split_node.register_prehook(
            lambda grads_in, seen=arriving: seen.extend(g.shape for g in grads_in if g is not None)
        )
        loss_over_chunks(chunks, weight).backward()
        grads[how] = trainable.grad
        widths = {shape[1] for shape in arriving}
        assert widths == ({2} if how == "marked" else {7})
    assert torch.equal(grads["marked"], grads["plain"])


def test_unmarked_rows_are_views():
    x = torch.randn(10, 7, requires_grad=True)
    assert grad_columns_start(x) is None
    assert all(chunk._base is x for chunk in split_rows(x, SIZES))


def test_nothing_is_marked_without_a_gradient_and_a_bad_range_is_refused():
    x = torch.randn(10, 7)
    mark_grad_columns(x, 5)
    assert grad_columns_start(x) is None
    x.requires_grad_()
    for start in (-1, 7):
        with pytest.raises(ValueError, match="column range"):
            mark_grad_columns(x, start)
    with pytest.raises(ValueError, match="column range"):
        mark_grad_columns(torch.randn(2, 10, 7, requires_grad=True), 5)


def test_mark_lives_with_its_tensor():
    x = torch.randn(10, 7, requires_grad=True)
    mark_grad_columns(x, 5)
    assert grad_columns_start(x) == 5
    assert grad_columns_start(x.detach().requires_grad_()) is None  # another tensor: unmarked
