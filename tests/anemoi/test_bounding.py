"""gtnorm.anemoi.bounding: the model's output boundings hold their columns as non-persistent buffers, which follow
the model to its device (no host sync when they index a CUDA output), with the same values and state_dict."""

from __future__ import annotations

import copy

import pytest

from tests.requirements import ANEMOI_GRAPHS, ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)
require_module("anemoi.graphs", ANEMOI_GRAPHS)

import torch  # noqa: E402
from anemoi.models.layers.bounding import BaseBounding, FractionBounding  # noqa: E402

import gtnorm.anemoi  # noqa: E402
from benchmarks.model import run  # noqa: E402
from benchmarks.model.build import build_model, make_batch  # noqa: E402
from benchmarks.model.config import ModelSpec  # noqa: E402
from benchmarks.model.graph import build_model_graph  # noqa: E402
from gtnorm.anemoi.bounding import bounding_indices_as_buffers  # noqa: E402
from tests.conftest import HAS_CUDA  # noqa: E402

TINY = ModelSpec(**run.TINY_MODEL)


@pytest.fixture(scope="module")
def anemoi_model():
    return build_model("anemoi", TINY, run.TINY_DATA, build_model_graph("o2_r0"))


def boundings(model: torch.nn.Module) -> list[BaseBounding]:
    return [m for m in model.modules() if isinstance(m, BaseBounding)]


@pytest.mark.parametrize("how", ["converted", "config"])
def test_indices_are_buffers_that_follow_the_model(anemoi_model, how):
    """Converted or built from gtnorm's class, every bounding's index is a buffer (Anemoi's: a plain CPU attribute)
    with Anemoi's values; it moves with ``model.to``, and the state_dict is Anemoi's."""
    if how == "converted":
        model = gtnorm.anemoi.use_gtnorm_attention(copy.deepcopy(anemoi_model), "pyg")
    else:
        model = build_model("gtnorm_config", TINY, run.TINY_DATA, build_model_graph("o2_r0"))
    expected = boundings(anemoi_model)
    assert expected and all("data_index" not in b._buffers for b in expected)  # what the test would see come back
    for ours, theirs in zip(boundings(model), expected, strict=True):
        assert "data_index" in ours._buffers and torch.equal(ours.data_index, theirs.data_index)
    assert model.state_dict().keys() == anemoi_model.state_dict().keys()
    model.to("meta")
    assert all(b.data_index.device.type == "meta" for b in boundings(model))


def test_indices_go_to_the_device_of_the_parameters_and_twice_is_once():
    """A model converted where its parameters already are on a device gets its indices there; FractionBounding's
    total column too; converting again changes nothing."""
    names = {"tp": 0, "cp": 1, "t": 2}
    holder = torch.nn.Module()
    holder.weight = torch.nn.Parameter(torch.zeros(1, device="meta"))
    holder.bounding = FractionBounding(variables=["cp"], name_to_index=names, min_val=0, max_val=1, total_var="tp")
    for _ in range(2):
        bounding_indices_as_buffers(holder)
        buffers = dict(holder.bounding.named_buffers())
        assert set(buffers) == {"data_index", "total_variable"}
        assert all(b.device.type == "meta" for b in buffers.values())
    assert holder.bounding.state_dict() == {}


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_converted_model_s_calls_make_no_host_sync(anemoi_model):
    """From its third call on, the converted model's training step and inference enqueue everything without waiting
    for the device (torch's sync debug mode raises at any sync); Anemoi's bounding alone syncs its model's."""
    device = torch.device("cuda")
    anemoi = copy.deepcopy(anemoi_model).to(device)
    model = gtnorm.anemoi.use_gtnorm_attention(copy.deepcopy(anemoi_model), "triton").to(device)
    x = make_batch(anemoi_model, run.TINY_DATA).to(device)

    def calls(m: torch.nn.Module) -> None:
        m.train()
        m({"data": x.clone()})["data"].square().mean().backward()
        m.eval()
        with torch.inference_mode():
            m({"data": x})

    for _ in range(2):
        calls(model)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        calls(model)
        for b in boundings(anemoi):
            with pytest.raises(RuntimeError, match="synchroniz"):
                b(torch.zeros(1, len(b.name_to_index), device=device))
    finally:
        torch.cuda.set_sync_debug_mode("default")
