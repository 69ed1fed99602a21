"""A mapper chunk's source rows (gtnorm/anemoi/source_rows.py): the gather and its gathered gradient are bitwise
torch's ``x_src[src_ids]`` and its indexing backward, sources without a row in the chunk included; the mappers'
chunks use it, and torch.compile traces it."""

from __future__ import annotations

import pytest
import torch

from gtnorm.anemoi.source_rows import gather_source_rows, source_positions


def _chunk_ids(num_src: int, keep: float, generator: torch.Generator, device) -> torch.Tensor:
    ids = torch.nonzero(torch.rand(num_src, generator=generator) < keep).flatten()
    return ids.to(device)


def test_positions_point_at_each_source_s_row_or_past_the_chunk(device):
    src_ids = torch.tensor([1, 4, 5], device=device)
    positions = source_positions(src_ids, 7)
    assert positions.dtype == torch.int32
    assert positions.tolist() == [3, 0, 3, 3, 1, 2, 3]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(9,), (3, 5)])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_torch_indexing_bitwise(dtype, shape, seed, device):
    generator = torch.Generator().manual_seed(seed)
    num_src = 57
    src_ids = _chunk_ids(num_src, 0.4, generator, device)
    positions = source_positions(src_ids, num_src)
    x = torch.randn(num_src, *shape, generator=generator, dtype=torch.float64).to(device, dtype)
    grad = torch.randn(src_ids.numel(), *shape, generator=generator, dtype=torch.float64).to(device, dtype)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = gather_source_rows(ours, src_ids, positions)
    expected = theirs[src_ids]
    assert torch.equal(out, expected), f"seed {seed}"
    out.backward(grad)
    expected.backward(grad)
    assert torch.equal(ours.grad, theirs.grad), f"seed {seed}"
    absent = torch.ones(num_src, dtype=torch.bool, device=device)
    absent[src_ids] = False
    assert absent.any() and not ours.grad[absent].any()


def test_gradient_check_float64():
    generator = torch.Generator().manual_seed(3)
    src_ids = _chunk_ids(11, 0.5, generator, "cpu")
    x = torch.randn(11, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    positions = source_positions(src_ids, 11)
    assert torch.autograd.gradcheck(lambda t: gather_source_rows(t, src_ids, positions), (x,))


def test_compiles_without_a_graph_break():
    src_ids = torch.tensor([0, 2, 3, 6])
    positions = source_positions(src_ids, 8)
    x = torch.randn(8, 5, requires_grad=True)
    compiled = torch.compile(lambda t: gather_source_rows(t, src_ids, positions).square().sum(), backend="aot_eager",
                             fullgraph=True)  # fmt: skip
    compiled(x).backward()
    expected = torch.zeros(8, 5)
    expected[src_ids] = 2 * x.detach()[src_ids]
    assert torch.equal(x.grad, expected)
