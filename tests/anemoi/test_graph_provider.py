"""Anemoi's graph providers and mappers converted by use_gtnorm_attention (gtnorm/anemoi/graph_provider.py,
mapper.py, convert.py): the same edges and state, the per-step expansion and the mapper chunks found by identity
(no content compare, so no host sync) from the second step on, in training and in inference, with the results
of Anemoi's own modules."""

from __future__ import annotations

import copy

import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

import torch  # noqa: E402

import gtnorm.anemoi  # noqa: E402
import gtnorm.triton.attention  # noqa: E402
from gtnorm.anemoi import graph_provider  # noqa: E402
from gtnorm.triton import layout_cache  # noqa: E402
from tests.anemoi.setups import Case, ProviderModel, build_pair, make_inputs, make_provider, rel_error  # noqa: E402
from tests.anemoi.test_modules import TOL  # noqa: E402
from tests.launches import attention_ran, count_launches  # noqa: E402


@pytest.fixture(autouse=True)
def empty_layout_cache():
    layout_cache.clear_layout_cache()
    yield
    layout_cache.clear_layout_cache()


def converted_pair(case: Case, device) -> tuple[ProviderModel, ProviderModel]:
    """(Anemoi's module on PyG with its provider, a deep copy converted by use_gtnorm_attention)."""
    anemoi_module, _ = build_pair(case, "triton", device, anemoi_backend="pyg")
    anemoi_model = ProviderModel(case, make_provider(case.kind), anemoi_module).to(device)
    gtnorm_model = gtnorm.anemoi.use_gtnorm_attention(copy.deepcopy(anemoi_model), "triton")
    return anemoi_model, gtnorm_model


def step(model: ProviderModel, x: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """Forward and backward: the output, the inputs' and every parameter's gradient."""
    model.train()
    model.zero_grad(set_to_none=True)
    leaves = [t.detach().clone().requires_grad_() for t in x]
    out = model(tuple(leaves))
    (out * torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)).sum().backward()
    return [out.detach(), *(t.grad for t in leaves), *(p.grad for p in model.parameters())]


@pytest.mark.parametrize("kind", ["processor", "encoder", "decoder"])
def test_converted_model_finds_its_layouts_without_compares(kind, device, count_compares):
    case = Case(kind, batch=2)
    anemoi_model, gtnorm_model = converted_pair(case, device)
    assert type(gtnorm_model.provider) is gtnorm.anemoi.StaticGraphProvider
    assert list(gtnorm_model.state_dict()) == list(anemoi_model.state_dict())
    assert len(list(gtnorm_model.buffers())) == len(list(anemoi_model.buffers()))
    x = make_inputs(case, device).x
    for index in range(2):
        count_compares.clear()
        expected, actual = step(anemoi_model, x), step(gtnorm_model, x)
        for a, e in zip(actual, expected, strict=True):
            assert rel_error(a, e) <= TOL
        if index > 0:
            assert count_compares == []
    anemoi_model.eval(), gtnorm_model.eval()
    with torch.inference_mode():
        for _ in range(2):
            assert rel_error(gtnorm_model(x), anemoi_model(x)) <= TOL
    assert count_compares == []


def test_expansion_is_anemoi_s_and_registered(device, count_compares):
    """The converted provider hands on Anemoi's edges; its lookups get the layout a content lookup of the same
    graph gets, with no compare."""
    provider = make_provider("encoder").to(device)
    converted = gtnorm.anemoi.use_gtnorm_attention(copy.deepcopy(provider))
    num_src, num_dst = provider.edge_inc[:, 0].tolist()
    for batch in (1, 3):
        for anemoi_edges, gtnorm_edges in zip(provider.get_edges(batch), converted.get_edges(batch), strict=True):
            assert (anemoi_edges is None) == (gtnorm_edges is None)
            assert anemoi_edges is None or torch.equal(anemoi_edges, gtnorm_edges)
        edge_index = converted.get_edges(batch)[1]
        layout = layout_cache.cached_layout(edge_index, (batch * num_src, batch * num_dst))
        assert not count_compares
        assert layout is layout_cache.cached_layout(edge_index.clone(), (batch * num_src, batch * num_dst))
        count_compares.clear()


def test_node_counts_are_read_once_and_after_a_write(monkeypatch):
    provider = gtnorm.anemoi.use_gtnorm_attention(make_provider("encoder"))
    reads = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(1) or original(t))
    for _ in range(3):
        assert graph_provider.base_node_counts(provider.edge_inc) == (16, 6)
    assert reads == []
    with torch.no_grad():
        provider.edge_inc[1, 0] = 7
    assert graph_provider.base_node_counts(provider.edge_inc) == (16, 7)
    assert len(reads) == 1


def test_edges_read_no_node_counts_to_the_host(monkeypatch):
    """Anemoi's get_edges reads edge_inc to the host at every call (a sync on a GPU); the converted provider hands
    on the same edges and shard sizes from the counts it holds."""
    provider = make_provider("encoder")
    converted = gtnorm.anemoi.use_gtnorm_attention(copy.deepcopy(provider))
    expected = provider.get_edges(2)
    reads = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(1) or original(t))
    for _ in range(2):
        edge_attr, edge_index, shard_sizes = converted.get_edges(2)
        assert torch.equal(edge_attr, expected[0]) and torch.equal(edge_index, expected[1])
        assert shard_sizes == expected[2]
    assert reads == []
    provider.get_edges(2)  # Anemoi's own reads them: what this test guards against coming back
    assert reads


@pytest.mark.parametrize("kind", ["processor", "encoder"])
def test_trainable_edge_parameters_get_anemoi_s_gradients(kind, device, monkeypatch):
    """A graph provider with trainable edge parameters (trainable_size > 0): the raw attributes the blocks get
    require grad, lin_edge runs inside the kernels, and the fused projection's gradient reaches the trainable
    parameters as Anemoi's own path's does."""
    # These graphs are too sparse for the op's dispatch rule to fuse the projection: fused here all the same.
    monkeypatch.setattr(gtnorm.triton.attention, "edge_projection_pays", lambda *args: True)
    monkeypatch.setattr(gtnorm.triton.attention, "materialised_edge_features", None)  # a call would fail
    case = Case(kind, batch=2, trainable_size=4)
    anemoi_module, _ = build_pair(case, "triton", device, anemoi_backend="pyg")
    anemoi_model = ProviderModel(case, make_provider(kind, trainable_size=4), anemoi_module).to(device)
    gtnorm_model = gtnorm.anemoi.use_gtnorm_attention(copy.deepcopy(anemoi_model), "triton")
    names = [name for name, _ in gtnorm_model.named_parameters()]
    trainable = [i for i, name in enumerate(names) if name.startswith("provider.")]
    assert trainable, names
    blocks = [
        m
        for m in gtnorm_model.modules()
        if isinstance(m, gtnorm.anemoi.GraphTransformerProcessorBlock | gtnorm.anemoi.GraphTransformerMapperBlock)
    ]
    assert blocks and all(block.conv.lin_edge is block.lin_edge for block in blocks)  # the fused projection
    x = make_inputs(case, device).x
    expected = step(anemoi_model, x)
    with count_launches() as launches:
        actual = step(gtnorm_model, x)
    # The kernels ran, and the raw attributes' gradient came from the fused projection's own kernel.
    assert attention_ran(launches) is None and launches["edge_features_grad_kernel"] >= len(blocks), launches
    for a, e in zip(actual, expected, strict=True):
        assert rel_error(a, e) <= TOL
    first_param = len(actual) - len(names)
    for i in trainable:
        assert actual[first_param + i].abs().sum() > 0


@pytest.mark.parametrize("kind", ["processor", "encoder", "decoder"])
def test_inference_checks_no_edge_content_on_the_device(kind, device, monkeypatch, count_compares):
    """Under inference mode the converted provider's edges are a normal tensor (its writes visible to the cache),
    so no lookup compares their content, on the device or with the host; Anemoi's provider makes a new inference
    tensor every call, whose lookups do: compared with the host at the first, checked on the device at every other."""
    from gtnorm.triton import cached_graph

    checks = []
    original = cached_graph.CachedGraph.check_content_async
    monkeypatch.setattr(
        cached_graph.CachedGraph, "check_content_async", lambda *args: checks.append(1) or original(*args)
    )
    case = Case(kind, batch=2)
    anemoi_model, gtnorm_model = converted_pair(case, device)
    x = make_inputs(case, device).x
    anemoi_model.eval(), gtnorm_model.eval()
    with torch.inference_mode():
        for _ in range(2):
            assert rel_error(gtnorm_model(x), anemoi_model(x)) <= TOL
            _, edge_index, _ = gtnorm_model.provider.get_edges(2)
            assert not edge_index.is_inference()
    assert checks == [] and count_compares == []
    # gtnorm's blocks with Anemoi's provider:
    anemoi_blocks = gtnorm.anemoi.use_gtnorm_attention(copy.deepcopy(anemoi_model).module, "triton")
    anemoi_provider_model = ProviderModel(case, anemoi_model.provider, anemoi_blocks).to(device).eval()
    with torch.inference_mode():
        anemoi_provider_model(x), anemoi_provider_model(x)
    assert checks or count_compares  # what this test guards against coming back
