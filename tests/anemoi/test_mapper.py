"""gtnorm's mappers prepare their graph once per graph (gtnorm/anemoi/mapper.py): later steps with the same graph
(the same tensor, a clone, or a registered expansion) compute no partition or chunk again and compare nothing,
and their results stay Anemoi's, step after step; a chunk written to in place is made again."""

from __future__ import annotations

import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

import torch  # noqa: E402
from anemoi.models.distributed import khop_edges  # noqa: E402
from anemoi.models.distributed.khop_edges import GraphPartition  # noqa: E402

from gtnorm.anemoi import mapper as gtnorm_mapper  # noqa: E402
from gtnorm.triton import layout_cache  # noqa: E402
from tests.anemoi.setups import (  # noqa: E402
    Case,
    Inputs,
    assert_steps_match,
    build_pair,
    forward,
    make_inputs,
    training_step,
)
from tests.anemoi.test_modules import TOL  # noqa: E402
from tests.conftest import HAS_CUDA  # noqa: E402


@pytest.fixture(autouse=True)
def empty_layout_cache():
    layout_cache.clear_layout_cache()
    yield
    layout_cache.clear_layout_cache()


@pytest.fixture
def count_preparations(monkeypatch):
    """Chunks made and partitions counted on the device (each ends in a host sync), by gtnorm's mappers."""
    made = []
    make_chunk, build_partition = gtnorm_mapper._make_chunk, gtnorm_mapper.build_graph_partition
    monkeypatch.setattr(gtnorm_mapper, "_make_chunk", lambda *a: made.append("chunk") or make_chunk(*a))
    monkeypatch.setattr(
        gtnorm_mapper, "build_graph_partition", lambda *a, **k: made.append("partition") or build_partition(*a, **k)
    )
    return made


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("num_chunks", [1, 3])
def test_graph_is_prepared_once_and_steps_stay_anemoi_s(kind, num_chunks, device, count_preparations, count_compares):
    case = Case(kind, norm="off", num_chunks=num_chunks)
    anemoi_module, gtnorm_module = build_pair(case, "triton", device)
    inputs = make_inputs(case, device)
    for step in range(3):
        if step == 2:  # a new tensor of the same graph: found by content, once
            inputs.edge_index = inputs.edge_index.clone()
        count_preparations.clear(), count_compares.clear()
        assert_steps_match(training_step(gtnorm_module, case, inputs), training_step(anemoi_module, case, inputs), TOL)
        if step == 0:
            assert count_preparations.count("chunk") == num_chunks
            assert count_preparations.count("partition") == (num_chunks > 1)
        else:
            assert count_preparations == []
            assert len(count_compares) == (step == 2)


def test_chunk_graphs_are_kept_with_the_mapper_s_graph_at_any_chunking(device, count_layout_builds, monkeypatch):
    """A mapper's chunk graphs live in its graph's cache entry: at more chunks than the cache keeps graphs (4 here
    instead of 32, as an O1280 model at 16 chunks has 35 graphs), later calls build no layout again (counted one by
    one, the LRU, walked in the same order every call, missed every lookup), and the cache holds one graph."""
    monkeypatch.setattr(layout_cache._SHARED_CACHE, "max_graphs", 4)
    case = Case("decoder", norm="off", num_chunks=8)
    _, module = build_pair(case, "triton", device)
    module.eval()
    inputs = make_inputs(case, device)
    with torch.inference_mode():
        first = forward(module, case, inputs)
        assert count_layout_builds  # every chunk's, once
        count_layout_builds.clear()
        again = forward(module, case, inputs)
    assert count_layout_builds == []
    assert len(layout_cache._SHARED_CACHE) == 1
    assert torch.equal(first, again)


def test_chunk_sources_are_the_connected_ones(device):
    """Sources without edges in a chunk are dropped and the rest numbered in order, as Anemoi's materialise does;
    a chunk that reaches every source takes the mapper's own source features, not a gathered copy."""
    edge_index = torch.tensor([[3, 1, 1, 0, 2, 3], [0, 0, 1, 2, 2, 3]], device=device)
    partition = gtnorm_mapper._CachedChunkPartition.of(khop_edges.build_graph_partition(edge_index, 2, (5, 4)))
    x = (torch.randn(5, 2, device=device), torch.randn(4, 2, device=device))
    edge_attr = torch.randn(6, 1, device=device)
    expected = [([1, 3], [[1, 0, 0], [0, 0, 1]]), ([0, 2, 3], [[0, 1, 2], [0, 0, 1]])]  # per chunk: sources, edges
    for part, (src_ids, expected_edges) in enumerate(expected):
        (x_src, x_dst), attr, chunk_edges, _ = partition.materialise(part, x, edge_attr, edge_index)
        anemoi_side = GraphPartition(*gtnorm_mapper._fields(partition)).materialise(part, x, edge_attr, edge_index)
        assert torch.equal(x_src, x[0][src_ids]) and torch.equal(x_src, anemoi_side[0][0])
        assert torch.equal(chunk_edges, torch.tensor(expected_edges, device=device))
        assert torch.equal(chunk_edges, anemoi_side[2]) and torch.equal(attr, anemoi_side[1])
        assert torch.equal(x_dst, anemoi_side[0][1])
    every_source = torch.tensor([[4, 0, 1, 2, 3], [0, 0, 1, 1, 1]], device=device)
    whole = gtnorm_mapper._prepared_partition(every_source, 1, (5, 2))
    (x_src, _), _, _, _ = whole.materialise(0, (x[0], x[1][:2]), edge_attr[:5], every_source)
    assert x_src is x[0]


def test_chunk_written_in_place_is_made_again(device):
    """A caller's in-place write into a chunk it was handed: the next preparation makes the chunks again."""
    edge_index = torch.tensor([[0, 1, 1], [0, 0, 1]], device=device)
    partition = gtnorm_mapper._prepared_partition(edge_index, 1, (2, 2))
    x = (torch.randn(2, 3, device=device), torch.randn(2, 3, device=device))
    edge_attr = torch.randn(3, 1, device=device)
    first = partition.materialise(0, x, edge_attr, edge_index)[2]
    assert gtnorm_mapper._prepared_partition(edge_index, 1, (2, 2)) is partition
    first[0, 0] = 1
    again = gtnorm_mapper._prepared_partition(edge_index, 1, (2, 2))
    chunk = again.materialise(0, x, edge_attr, edge_index)[2]
    assert chunk is not first and torch.equal(chunk, edge_index)
    assert gtnorm_mapper._prepared_partition(edge_index, 1, (2, 2)) is again  # kept in place of the written one


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_later_steps_make_no_host_sync(kind):
    """From the second step on, a mapper's training step (gradient checkpointing on) and inference enqueue their
    work without waiting for the device: Anemoi's mappers sync on every partition and chunk, every step."""
    case = Case(kind, norm="layer", num_chunks=2)
    _, module = build_pair(case, "triton", torch.device("cuda"))
    inputs = make_inputs(case, torch.device("cuda"))
    leaves = [t.requires_grad_() for t in inputs.leaves()]
    inputs = Inputs(tuple(leaves[:-1]), leaves[-1], inputs.edge_index, inputs.batch)

    def train_and_infer():
        module.train()
        forward(module, case, inputs).sum().backward()
        module.eval()
        with torch.inference_mode():
            forward(module, case, inputs)

    train_and_infer()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        train_and_infer()
    finally:
        torch.cuda.set_sync_debug_mode("default")


class _SliceGradients(torch.utils._python_dispatch.TorchDispatchMode):
    """The shapes of the gradients that slicing's backward makes (zero-filled, the sliced tensor's whole size)."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.slice_backward.default:
            self.shapes.append(tuple(out.shape))
        return out


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_destinations_split_once_give_anemoi_s_gradients_without_full_size_ones(kind, device, monkeypatch):
    """The mappers split the destinations once before the chunk loop: the output and every gradient are bitwise
    those of slicing inside each chunk (Anemoi's way) on the same module, and the backward no longer makes a
    zero-filled gradient of every destination per chunk (at O1280's decoder, 5.1 GiB each)."""
    case = Case(kind, norm="layer", num_chunks=3)
    _, module = build_pair(case, "triton", device)
    inputs = make_inputs(case, device)
    full_shape = tuple(inputs.x[1].shape)
    recorded = {}
    for loop in ("gtnorm", "anemoi"):
        if loop == "anemoi":
            def sliced_in_the_chunk(self, partition_id, x, edge_attr, edge_index, cond=None):  # as Anemoi does
                return self.partition.materialise(partition_id, x, edge_attr, edge_index, cond)

            monkeypatch.setattr(gtnorm_mapper._SplitDestinations, "materialise", sliced_in_the_chunk)
        with _SliceGradients() as slices:
            recorded[loop] = training_step(module, case, inputs)
        recorded[loop + " full-size slice gradients"] = slices.shapes.count(full_shape)
    assert recorded["gtnorm full-size slice gradients"] == 0
    assert recorded["anemoi full-size slice gradients"] == case.num_chunks  # the check sees them where they are
    ours, anemoi_s = recorded["gtnorm"], recorded["anemoi"]
    assert torch.equal(ours.output, anemoi_s.output)
    for mine, theirs in zip([*ours.input_grads, *ours.param_grads.values()],
                            [*anemoi_s.input_grads, *anemoi_s.param_grads.values()], strict=True):  # fmt: skip
        assert (mine is None and theirs is None) or torch.equal(mine, theirs)


def test_chunks_gather_their_sources_with_gathered_gradients(device, monkeypatch):
    """A chunk that drops sources takes them through source_rows.gather_source_rows (its backward a gather, not
    torch's sorting index backward) with each source's position in the chunk, and its gradient is Anemoi's."""
    calls = []
    gather = gtnorm_mapper.gather_source_rows
    monkeypatch.setattr(gtnorm_mapper, "gather_source_rows", lambda *a: calls.append(a) or gather(*a))
    edge_index = torch.tensor([[3, 1, 1, 0, 2, 3], [0, 0, 1, 2, 2, 3]], device=device)
    partition = gtnorm_mapper._prepared_partition(edge_index, 2, (5, 4))
    x_src = torch.randn(5, 2, device=device, requires_grad=True)
    x = (x_src, torch.randn(4, 2, device=device))
    edge_attr = torch.randn(6, 1, device=device)
    anemoi_partition = GraphPartition(*gtnorm_mapper._fields(partition))
    ours = torch.cat([partition.materialise(part, x, edge_attr, edge_index)[0][0] for part in range(2)])
    x_theirs = x_src.detach().clone().requires_grad_()
    theirs = torch.cat(
        [anemoi_partition.materialise(part, (x_theirs, x[1]), edge_attr, edge_index)[0][0] for part in range(2)]
    )
    grad = torch.randn_like(ours)
    ours.backward(grad)
    theirs.backward(grad)
    assert len(calls) == 2 and torch.equal(x_src.grad, x_theirs.grad)
    assert [chunk.src_positions.tolist() for chunk in partition.chunks] == [[2, 0, 2, 1, 2], [0, 3, 1, 2, 3]]


@pytest.mark.parametrize("num_chunks", [1, 3])
def test_decoder_keeps_its_last_chunk_and_gives_anemoi_s_step(num_chunks, device, monkeypatch):
    """The decoder runs its last chunk outside a checkpoint: a training step runs the chunks' blocks
    2 * num_chunks - 1 times, not 2 * num_chunks as Anemoi's loop does, and the output and every gradient are
    bitwise those of Anemoi's loop on the same module. Under inference_mode it runs Anemoi's loop as is."""
    case = Case("decoder", norm="layer", num_chunks=num_chunks)
    _, module = build_pair(case, "triton", device)
    inputs = make_inputs(case, device)
    block_calls = []
    for block in module.modules():
        if isinstance(block, gtnorm_mapper.GraphTransformerMapperBlock):
            block.register_forward_pre_hook(lambda *_: block_calls.append(1))
    recorded = {}
    for loop in ("gtnorm", "anemoi"):
        if loop == "anemoi":
            anemoi_loop = gtnorm_mapper.anemoi_mapper.GraphTransformerBaseMapper.mapper_forward_with_edge_sharding
            monkeypatch.setattr(gtnorm_mapper, "_chunks_with_the_last_kept", anemoi_loop)
        block_calls.clear()
        recorded[loop] = training_step(module, case, inputs)
        recorded[loop + " block calls"] = len(block_calls)
    assert recorded["gtnorm block calls"] == 2 * num_chunks - 1
    assert recorded["anemoi block calls"] == 2 * num_chunks
    ours, anemoi_s = recorded["gtnorm"], recorded["anemoi"]
    assert torch.equal(ours.output, anemoi_s.output)
    for mine, theirs in zip([*ours.input_grads, *ours.param_grads.values()],
                            [*anemoi_s.input_grads, *anemoi_s.param_grads.values()], strict=True):  # fmt: skip
        assert (mine is None and theirs is None) or torch.equal(mine, theirs)
    block_calls.clear()
    with torch.inference_mode():
        assert torch.equal(forward(module, case, inputs), ours.output)
    assert len(block_calls) == num_chunks
