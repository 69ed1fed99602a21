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


def test_marked_rows_give_the_split_s_values_and_gradients_holding_the_marked_columns_only():
    """Chunks run one after the other (as a mapper's loop does, each taking its rows when it runs): each chunk's
    gradient is narrowed to the marked columns before the chunk run before it starts its backward (autograd runs
    the newest ready node first), and the split's node receives the narrowed gradients only."""
    weight = torch.randn(7, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    grads = {}
    for how in ("marked", "plain"):
        trainable = torch.randn(10, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        trainable.requires_grad_()
        x = grid_input(trainable)
        if how == "marked":
            assert mark_grad_columns(x, 5) is x and grad_columns_start(x) == 5
        rows = split_rows(x, SIZES)
        events = []  # the backward's order: a chunk's own backward, its rows' narrowing, the split's
        loss = 0
        for i, reference in enumerate(x.detach().split(SIZES)):
            chunk = rows.chunk(i)
            assert torch.equal(chunk, reference)
            if how == "marked":
                chunk.grad_fn.register_prehook(lambda _, i=i, seen=events: seen.append(f"narrow {i}"))
            product = chunk @ weight
            product.register_hook(lambda _, i=i, seen=events: seen.append(f"chunk {i}"))
            loss = loss + product.sin().sum()
        split_node = chunk.grad_fn if how == "plain" else chunk.grad_fn.next_functions[1][0]
        assert type(split_node).__name__.startswith("Split")
        split_node.register_prehook(
            lambda grads_in, seen=events: seen.append({g.shape[1] for g in grads_in if g is not None})
        )
        loss.backward()
        grads[how] = trainable.grad
        if how == "marked":
            assert events == ["chunk 2", "narrow 2", "chunk 1", "narrow 1", "chunk 0", "narrow 0", {2}]
        else:
            assert events == ["chunk 2", "chunk 1", "chunk 0", {7}]
    assert torch.equal(grads["marked"], grads["plain"])


def test_unmarked_rows_are_views():
    x = torch.randn(10, 7, requires_grad=True)
    assert grad_columns_start(x) is None
    rows = split_rows(x, SIZES)
    assert all(rows.chunk(i)._base is x for i in range(len(SIZES)))


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
