"""gtnorm's Anemoi blocks: which attention runs, where the norm modules live, converting a built model."""

from __future__ import annotations

import copy
import pickle

import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

import torch  # noqa: E402
from anemoi.models.layers import block as anemoi_block  # noqa: E402

import gtnorm.anemoi  # noqa: E402
from gtnorm.anemoi import block as gtnorm_block  # noqa: E402
from tests.anemoi.setups import Case, build_pair, forward, make_inputs, rel_error  # noqa: E402
from tests.anemoi.test_modules import TOL  # noqa: E402
from tests.launches import FORWARD, FORWARD_CALLS, PYG_CALLS, count_launches  # noqa: E402


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
