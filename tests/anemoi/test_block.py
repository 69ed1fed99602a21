"""gtnorm's Anemoi blocks: which attention runs, where the norm modules live, converting a built model."""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass

import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

import torch  # noqa: E402
from anemoi.models.distributed.shapes import BipartiteGraphShardInfo  # noqa: E402
from anemoi.models.layers import block as anemoi_block  # noqa: E402

import gtnorm.anemoi  # noqa: E402
from gtnorm.anemoi import block as gtnorm_block  # noqa: E402
from tests.anemoi.setups import EDGE_DIM, ZERO_GRADIENT, Case, build_pair, forward, make_inputs, rel_error  # noqa: E402
from tests.anemoi.test_modules import TOL  # noqa: E402
from tests.conftest import DEVICE  # noqa: E402
from tests.graphs import ROWS_PAST_INT32_AT_1024, Selection, last_and_random, ring_with_tail  # noqa: E402
from tests.launches import FORWARD, FORWARD_CALLS, PYG_CALLS, attention_ran, count_launches  # noqa: E402


def gtnorm_blocks(module):
    return [m for m in module.modules() if isinstance(m, anemoi_block.GraphTransformerBaseBlock)]


@pytest.mark.parametrize("kind", ["processor", "decoder"])
def test_triton_backend_runs_gtnorm_kernels(kind, device):
    """One op call and one forward-kernel launch per block (each graph has edges), none of the PyG path."""
    case = Case(kind, checkpoint=False, batch=1)
    _, gtnorm_module = build_pair(case, "triton", device)
    with count_launches() as launches:
        forward(gtnorm_module, case, make_inputs(case, device))
    blocks = len(gtnorm_blocks(gtnorm_module))
    assert launches[FORWARD_CALLS] == launches[FORWARD] == blocks, launches
    assert launches[PYG_CALLS] == 0


def test_pyg_backend_does_not_run_kernels(device):
    case = Case("processor")
    _, gtnorm_module = build_pair(case, "pyg", device)
    with count_launches() as launches:
        forward(gtnorm_module, case, make_inputs(case, device))
    assert launches[PYG_CALLS] == len(gtnorm_blocks(gtnorm_module))
    assert launches[FORWARD_CALLS] == launches[FORWARD] == 0, launches


@pytest.mark.parametrize("kind", ["processor", "encoder", "decoder"])
def test_norms_stay_the_block_s_own_modules(kind):
    """The conv uses the block's q_norm / k_norm; the gtnorm conv inside it is not a submodule (no parameter
    listed twice), also in a deep copy and after pickling."""
    anemoi_module, gtnorm_module = build_pair(Case(kind, norm="rms"), "triton", torch.device("cpu"))
    # Anemoi's module on its PyG backend, which has a conv submodule (its Triton backend keeps a function there).
    names = {name for name, _ in anemoi_module.named_modules()}
    for module in (gtnorm_module, copy.deepcopy(gtnorm_module), pickle.loads(pickle.dumps(gtnorm_module))):
        assert {name for name, _ in module.named_modules()} == names
        for block in gtnorm_blocks(module):
            assert block.conv.fused.q_norm is block.q_norm and block.conv.fused.k_norm is block.k_norm
            assert all(sub is not block.conv.fused for sub in block.modules())


def test_use_gtnorm_attention_converts_a_built_model(device):
    """Converting Anemoi's own module in place: same state_dict, same result as before, now from the kernels."""
    case = Case("encoder", norm="rms", batch=1)
    anemoi_module, _ = build_pair(case, "triton", device)
    keys = list(anemoi_module.state_dict())
    inputs = make_inputs(case, device)
    with torch.no_grad():
        expected = forward(anemoi_module, case, inputs)
        gtnorm.anemoi.use_gtnorm_attention(anemoi_module, "triton")
        with count_launches() as launches:
            actual = forward(anemoi_module, case, inputs)
    assert launches[FORWARD] >= 1 and launches[PYG_CALLS] == 0, launches
    assert list(anemoi_module.state_dict()) == keys
    assert [type(b) for b in gtnorm_blocks(anemoi_module)] == [gtnorm.anemoi.GraphTransformerMapperBlock]
    assert rel_error(actual, expected) <= TOL


def test_environment_backend_override(monkeypatch):
    """Anemoi's ANEMOI_INFERENCE_GRAPHTRANSFORMER_ATTENTION_BACKEND (read at import) picks the backend here too."""
    monkeypatch.setattr(anemoi_block, "ATTENTION_BACKEND", "pyg")
    _, gtnorm_module = build_pair(Case("encoder"), "triton", torch.device("cpu"))
    assert [b.conv.fused.backend for b in gtnorm_blocks(gtnorm_module)] == ["pyg"]


def test_unknown_backend_is_refused():
    anemoi_module, _ = build_pair(Case("processor"), "pyg", torch.device("cpu"))
    with pytest.raises(ValueError, match="graph_attention_backend"):
        gtnorm.anemoi.use_gtnorm_attention(anemoi_module, "flash")


@pytest.mark.parametrize("size", [(9, 5), 6, (7, 6)], ids=["sources", "one-int", "destinations"])
def test_size_that_disagrees_with_the_tensors_is_refused(size):
    """The block's attention takes its sizes from query and key (a compiled block must not read the ints a mapper
    hands it per chunk); a ``size`` that disagrees with them is an error, raised before any kernel runs."""
    _, module = build_pair(Case("encoder"), "triton", torch.device("cpu"))
    block = gtnorm_blocks(module)[0]
    query, key = torch.randn(5, 2, 8), torch.randn(7, 2, 8)
    edge_index = torch.tensor([[0, 6], [0, 4]])
    with count_launches() as launches, pytest.raises(ValueError, match="does not match"):
        block.apply_gt(query, key, key.clone(), torch.randn(2, 2, 8), edge_index, size)
    assert launches[FORWARD_CALLS] == launches[PYG_CALLS] == 0


@pytest.mark.parametrize(
    "case, fused",
    [
        (Case("processor"), True),
        (Case("encoder"), True),
        (Case("decoder"), True),
        (Case("processor", edge_pre_mlp=True), False),
        (Case("processor", shard_strategy="heads", batch=1), False),
        (Case("encoder", shard_strategy="heads", batch=1), False),
    ],
    ids=["processor", "encoder", "decoder", "edge-pre-mlp", "processor-heads", "encoder-heads"],
)
def test_lin_edge_fused_where_the_block_projects_raw_attributes(case, fused, device, monkeypatch):
    """By default lin_edge runs inside the kernels (never applied as a module) exactly where the block has no
    edge_pre_mlp and shards by edges; state_dict keys stay Anemoi's."""
    anemoi_module, gtnorm_module = build_pair(case, "triton", device)
    assert list(gtnorm_module.state_dict()) == list(anemoi_module.state_dict())
    applied = []
    for block in gtnorm_blocks(gtnorm_module):
        assert (block.conv.lin_edge is block.lin_edge) == fused
        assert block.conv.lin_edge is None or block.conv.lin_edge is block.lin_edge
        block.lin_edge.register_forward_hook(lambda *_: applied.append(1))
    forward(gtnorm_module, case, make_inputs(case, device))
    assert bool(applied) != fused


def test_lin_edge_materialised_when_switched_off(device, monkeypatch):
    monkeypatch.setattr(gtnorm_block, "FUSE_EDGE_PROJECTION", False)
    _, gtnorm_module = build_pair(Case("processor"), "triton", device)
    assert all(block.conv.lin_edge is None for block in gtnorm_blocks(gtnorm_module))


@pytest.mark.parametrize("kind", ["processor", "encoder", "decoder"])
def test_fused_projection_state_dict_round_trips(kind):
    """With lin_edge fused into the kernels, the drop-in's state_dict loads into Anemoi's own module (strict)
    and gives back every tensor unchanged (test_modules.py: the same module's training step matches Anemoi's in
    fp32)."""
    anemoi_module, gtnorm_module = build_pair(Case(kind), "triton", torch.device("cpu"))
    assert all(block.conv.lin_edge is block.lin_edge for block in gtnorm_blocks(gtnorm_module))
    fresh = type(anemoi_module)(**Case(kind).arguments("pyg"))
    fresh.load_state_dict(gtnorm_module.state_dict(), strict=True)
    expected = anemoi_module.state_dict()
    assert list(fresh.state_dict()) == list(expected)
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


@dataclass(frozen=True)
class BlockSize:
    name: str
    num_src: int
    num_dst: int
    channels: int
    heads: int
    tail: int  # the last destinations' extra edges from the last sources (tests/graphs.py: ring_with_tail)


# Past 2**31 elements: 2.2M sources x 1024 channels (16 heads x 64) in bfloat16, into 100k destinations (22 edges
# each, 2.2M edges). The source side holds x_src, its LayerNorm, key and value [2.2M, 1024] (4.5 GB each) and
# their gradients; materialised, e and its gradient too: ~40-60 GB on the GPU. About 10-20 s per case on an H100.
BLOCK_SIZES = [
    pytest.param(BlockSize("tiny", 40, 8, 16, 2, 3), id="tiny"),
    pytest.param(BlockSize("past_int32", ROWS_PAST_INT32_AT_1024, 100_000, 1024, 16, 32), id="past_int32",
                 marks=pytest.mark.gpu),
]  # fmt: skip


# Both blocks run every layer in bfloat16, so each gradient carries that rounding through a different order of
# sums (the bias gradients most: reductions over the rows); measured on the tiny size: up to 1.8x the chunk's own
# bfloat16 error (lin_self.bias). A wrapped offset is off by orders of magnitude.
BLOCK_SLACK = 3.0


@pytest.mark.parametrize("fused", [True, False], ids=["lin_edge_fused", "lin_edge_materialised"])
@pytest.mark.parametrize("size", BLOCK_SIZES)
def test_mapper_block_past_int32_elements(size, fused, monkeypatch):
    """gtnorm's mapper block (LayerNorm on q and k) with node tensors, and materialised edge tensors, past 2**31
    elements, forward and backward, against Anemoi's own block (PyG backend) run on a chunk of the graph: the
    last destinations (whose edges have the highest ids and come from the last sources), the destinations of the
    last sources and a sample. The loss reads only those, so only their edges and sources get gradients. Bound per
    tensor: Anemoi's block on the chunk in bfloat16, its error against float64 x BLOCK_SLACK + 1e-3."""
    monkeypatch.setattr(gtnorm_block, "FUSE_EDGE_PROJECTION", fused)
    case = Case("encoder", channels=size.channels, heads=size.heads, batch=1, checkpoint=False)
    anemoi_module, gtnorm_module = build_pair(case, "triton", torch.device("cpu"))
    block = gtnorm_module.proc.to(DEVICE, torch.bfloat16)
    assert (block.conv.lin_edge is not None) == fused
    edge_index = ring_with_tail(size.num_src, size.num_dst, size.tail, DEVICE)
    num_edges = edge_index.shape[1]
    if size.name == "past_int32":
        assert size.num_src * size.channels > 2**31 and num_edges * size.channels > 2**31
    bf16 = dict(device=DEVICE, dtype=torch.bfloat16)
    x_src = torch.randn(size.num_src, size.channels, **bf16).requires_grad_()
    x_dst = torch.randn(size.num_dst, size.channels, **bf16).requires_grad_()
    edge_attr = torch.randn(num_edges, EDGE_DIM, **bf16).requires_grad_()
    last_sources_dst = (size.num_src - 1 - torch.arange(4)) % size.num_dst
    selection = Selection.of(
        edge_index, size.num_dst, last_and_random(size.num_dst, size.tail, 32, last_sources_dst).to(DEVICE)
    )
    weights = torch.randn(selection.dst.numel(), size.channels, device=DEVICE)

    def run(module, x, attr, edges, sizes):
        (_, out), _ = module(x, attr, edges, BipartiteGraphShardInfo(), batch_size=1, size=sizes)
        return out

    with count_launches() as launches:
        out = run(block, (x_src, x_dst), edge_attr, edge_index, (size.num_src, size.num_dst))
        (out[selection.dst].float() * weights).sum().backward()
    assert attention_ran(launches) is None, attention_ran(launches)
    actual = {"out": out[selection.dst], "x_src": x_src.grad[selection.src], "x_dst": x_dst.grad[selection.dst]}
    actual["edge_attr"] = edge_attr.grad[selection.edges]
    actual |= {name: p.grad for name, p in block.named_parameters()}
    del out, x_src.grad, x_dst.grad, edge_attr.grad

    def on_chunk(dtype):
        reference = copy.deepcopy(anemoi_module.proc).to(DEVICE, dtype)
        leaves = [x_src[selection.src], x_dst[selection.dst], edge_attr[selection.edges]]
        leaves = [t.detach().to(dtype).requires_grad_() for t in leaves]
        sizes = (selection.src.numel(), selection.dst.numel())
        result = run(reference, tuple(leaves[:2]), leaves[2], selection.local_edge_index, sizes)
        (result.double() * weights.double()).sum().backward()
        grads = {"out": result, "x_src": leaves[0].grad, "x_dst": leaves[1].grad, "edge_attr": leaves[2].grad}
        return grads | {name: p.grad for name, p in reference.named_parameters()}

    expected, same_dtype = on_chunk(torch.float64), on_chunk(torch.bfloat16)
    assert actual.keys() == expected.keys()
    largest = max(t.double().norm().item() for name, t in expected.items() if name != "out")
    for name, e in expected.items():
        if e.double().norm().item() < ZERO_GRADIENT * largest:  # zero in exact arithmetic
            assert actual[name].double().norm().item() < ZERO_GRADIENT * largest, name
            continue
        bound = BLOCK_SLACK * rel_error(same_dtype[name], e) + 1e-3
        assert rel_error(actual[name], e) <= bound, f"{name}: {rel_error(actual[name], e):.2e} > {bound:.2e}"
