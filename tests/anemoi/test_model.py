"""gtnorm.anemoi.AnemoiModelEncProcDec: Anemoi's model with its residual added out of place. The same prediction and
gradients, bitwise, as Anemoi's model (both on the PyG path and in float64, where gtnorm's output head is torch's
LayerNorm too, so that only the residual differs), without the sorting index backward; Anemoi's in-place add where
the output indices repeat; the state_dict unchanged."""

from __future__ import annotations

import copy

import pytest

from tests.requirements import ANEMOI_GRAPHS, ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)
require_module("anemoi.graphs", ANEMOI_GRAPHS)

import torch  # noqa: E402
from anemoi.models.layers import block as anemoi_block  # noqa: E402

import gtnorm.anemoi  # noqa: E402
from benchmarks.model import run  # noqa: E402
from benchmarks.model.build import build_model, make_batch  # noqa: E402
from benchmarks.model.config import ModelSpec  # noqa: E402
from benchmarks.model.graph import build_model_graph  # noqa: E402
from gtnorm.anemoi import grad_columns  # noqa: E402
from gtnorm.anemoi import mapper as gtnorm_mapper  # noqa: E402

TINY = ModelSpec(**run.TINY_MODEL)


@pytest.fixture(scope="module")
def anemoi_model():
    model = build_model("anemoi", TINY, run.TINY_DATA, build_model_graph("o2_r0")).double()
    for block in model.modules():  # on a machine with CUDA Anemoi's blocks were built for its Triton kernel
        if isinstance(block, anemoi_block.GraphTransformerBaseBlock):
            block.graph_attention_backend = "pyg"
            block.set_attention_function()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # the output head away from its zero initialisation, so that the output is not x_skip
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator))
    return model


def converted(model: torch.nn.Module) -> torch.nn.Module:
    gtnorm_model = copy.deepcopy(model)
    gtnorm.anemoi.use_gtnorm_attention(gtnorm_model, "pyg")
    return gtnorm_model


def step(model: torch.nn.Module, x: torch.Tensor, input_grad: bool = True) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """(prediction, {parameter name: gradient}, input gradient) of a training step on a copy of ``x``."""
    model.zero_grad(set_to_none=True)
    x = x.double().requires_grad_(input_grad)
    prediction = model({"data": x})["data"]
    weights = torch.randn(prediction.shape, generator=torch.Generator().manual_seed(7), dtype=prediction.dtype)
    (prediction * weights).sum().backward()
    return prediction.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, x.grad


def backward_nodes(output: torch.Tensor) -> list[str]:
    """The names of every autograd node behind ``output``."""
    seen, names, stack = set(), [], [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


def test_converted_model_is_gtnorms_class_with_anemois_state(anemoi_model):
    model = converted(anemoi_model)
    assert type(model) is gtnorm.anemoi.AnemoiModelEncProcDec
    assert model._gtnorm_residual_out_of_place == {"data": True}
    assert model.state_dict().keys() == anemoi_model.state_dict().keys()
    gtnorm.anemoi.AnemoiModelEncProcDec.load_state_dict(model, anemoi_model.state_dict())


def test_residual_out_of_place_matches_anemoi_bitwise(anemoi_model):
    model = converted(anemoi_model)
    x = make_batch(anemoi_model, run.TINY_DATA, batch_size=2)
    expected, expected_grads, expected_dx = step(anemoi_model, x)
    found, grads, dx = step(model, x)
    assert torch.equal(found, expected)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert torch.equal(grad, expected_grads[name]), name
    assert torch.equal(dx, expected_dx)  # the residual's own gradient (x_skip's), through the gather


@pytest.mark.parametrize("input_grad", [False, True])
def test_decoder_holds_the_gradient_of_the_trainable_columns_only(anemoi_model, monkeypatch, input_grad):
    """The grid input is marked with its trainable columns (the last 8) when the data needs no gradient, so that
    the decoder's chunks hand on those columns' gradient only (grad_columns.py); every gradient stays Anemoi's,
    bitwise. With the input requiring a gradient nothing is marked."""
    splits = []

    def recording_split(x, sizes):
        splits.append((x.shape[1], grad_columns.grad_columns_start(x)))
        return grad_columns.split_rows(x, sizes)

    monkeypatch.setattr(gtnorm_mapper, "split_rows", recording_split)
    model = converted(anemoi_model)
    x = make_batch(anemoi_model, run.TINY_DATA, batch_size=2)
    expected, expected_grads, expected_dx = step(anemoi_model, x, input_grad)
    found, grads, dx = step(model, x, input_grad)
    width = model.input_dim["data"]
    trainable = TINY.trainable_node
    assert (width, None if input_grad else width - trainable) in splits  # the decoder's destinations
    assert torch.equal(found, expected)
    assert grads.keys() == expected_grads.keys() and "node_attributes.trainable_tensors.data.trainable" in grads
    for name, grad in grads.items():
        assert torch.equal(grad, expected_grads[name]), name
    assert (dx is None and expected_dx is None) or torch.equal(dx, expected_dx)


def assembled(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """_assemble_output of a decoder output x_out [2 * grid, vars] (requiring grad) and the residual: (output,
    x_out)."""
    x_out = torch.randn(2 * model.node_attributes.num_nodes["data"], model.num_output_channels["data"])
    x_out.requires_grad_()
    x_skip = make_batch(model, run.TINY_DATA, batch_size=2)[:, -1:]
    return model._assemble_output(x_out, x_skip, 2, 1, torch.float32, "data"), x_out


def test_residual_backward_has_no_index_backward(anemoi_model):
    """Anemoi's residual leaves an IndexBackward node (its read of x_out's columns, whose backward is the sorting
    index backward) that gtnorm's, an index_add, does not; the bounding's own indexing stays on both sides."""
    anemoi_nodes = backward_nodes(assembled(anemoi_model)[0])
    gtnorm_nodes = backward_nodes(assembled(converted(anemoi_model))[0])
    assert "IndexAddBackward0" in gtnorm_nodes and "IndexAddBackward0" not in anemoi_nodes
    assert gtnorm_nodes.count("IndexBackward0") == anemoi_nodes.count("IndexBackward0") - 1


def test_repeated_output_indices_keep_anemois_in_place_add(anemoi_model):
    """With an output index twice, an in-place add adds once and index_add twice: the model must find that (when
    checked again after the indices change) and fall back to Anemoi's add."""
    model = converted(anemoi_model)
    reference = copy.deepcopy(anemoi_model)
    for m in (model, reference):
        index = m._internal_output_idx["data"].clone()
        index[1] = index[0]
        m._internal_output_idx["data"] = index
    model.check_residual_indices()
    assert model._gtnorm_residual_out_of_place == {"data": False}
    x = make_batch(anemoi_model, run.TINY_DATA).double()
    with torch.no_grad():
        assert torch.equal(model({"data": x})["data"], reference({"data": x})["data"])


def test_residual_compiles_without_graph_break(anemoi_model):
    model = converted(anemoi_model)
    x_out = torch.randn(2 * model.node_attributes.num_nodes["data"], model.num_output_channels["data"])
    x_skip = make_batch(model, run.TINY_DATA, batch_size=2)[:, -1:]
    expected = model._assemble_output(x_out, x_skip, 2, 1, torch.float32, "data")
    compiled = torch.compile(model._assemble_output, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x_out, x_skip, 2, 1, torch.float32, "data"), expected)


# Tensor methods that read a tensor's values to the host (and torch.equal, which returns a bool): on a GPU each one
# waits for every kernel queued before it.
HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu", "nonzero")


def host_reads_of_a_step(model: torch.nn.Module, x: torch.Tensor) -> list[str]:
    """The host reads (HOST_READS) a training step of ``model`` makes, after two steps that build its caches."""
    reads = []
    for index in range(3):
        model.zero_grad(set_to_none=True)
        with pytest.MonkeyPatch.context() as patch:
            if index == 2:
                for owner, name in [(torch.Tensor, name) for name in HOST_READS] + [(torch, "equal")]:
                    original = getattr(owner, name)
                    patch.setattr(owner, name, lambda *a, _f=original, _n=name, **k: reads.append(_n) or _f(*a, **k))
            model({"data": x.clone()})["data"].square().mean().backward()
    return reads


def test_converted_model_s_step_reads_nothing_to_the_host(device):
    """From its third step on, the converted model's training step makes no host read (no sync on a GPU): its graph
    providers size the edge shards from the node counts they hold and its mappers prepare their graphs once, where
    Anemoi's model reads the node counts and its partition's sizes at every step."""
    anemoi = build_model("anemoi", TINY, run.TINY_DATA, build_model_graph("o2_r0")).to(device)
    gtnorm_model = gtnorm.anemoi.use_gtnorm_attention(copy.deepcopy(anemoi), "triton")
    x = make_batch(anemoi, run.TINY_DATA).to(device)
    assert host_reads_of_a_step(gtnorm_model, x) == []
    assert host_reads_of_a_step(anemoi, x).count("tolist") == 3  # a provider each: what the test would see come back
