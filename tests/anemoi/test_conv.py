"""The drop-in blocks look like Anemoi's to code that inspects them: the conv is of Anemoi's GraphTransformerConv
class, every attribute and sub-module Anemoi's block has is there under its name, and the state_dict is Anemoi's key
for key and value for value (gtnorm/anemoi/conv.py)."""

from __future__ import annotations

import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

import torch  # noqa: E402
from anemoi.models.layers import block as anemoi_block  # noqa: E402
from anemoi.models.layers.conv import GraphTransformerConv as AnemoiGraphTransformerConv  # noqa: E402
from anemoi.models.layers.utils import load_layer_kernels  # noqa: E402

import gtnorm.anemoi  # noqa: E402
from gtnorm.anemoi.conv import FusedGraphTransformerConv  # noqa: E402
from tests.anemoi.setups import Case, build_pair, forward, make_inputs, rel_error  # noqa: E402
from tests.anemoi.test_modules import TOL  # noqa: E402

HEADS, CHANNELS, EDGE_DIM = 8, 128, 11


def block_arguments(edge_pre_mlp: bool, mapper: bool, backend: str) -> dict:
    """A block as Anemoi's own block tests build one (qk_norm on, its default LayerNorm kernels)."""
    args = dict(
        in_channels=CHANNELS, hidden_dim=64, out_channels=CHANNELS, edge_dim=EDGE_DIM, num_heads=HEADS, bias=True,
        qk_norm=True, layer_kernels=load_layer_kernels(), graph_attention_backend=backend, edge_pre_mlp=edge_pre_mlp,
    )  # fmt: skip
    return args | ({"update_src_nodes": False} if mapper else {})


BLOCKS = {
    "processor": (anemoi_block.GraphTransformerProcessorBlock, gtnorm.anemoi.GraphTransformerProcessorBlock, False),
    "processor, edge MLP": (
        anemoi_block.GraphTransformerProcessorBlock, gtnorm.anemoi.GraphTransformerProcessorBlock, True,
    ),  # fmt: skip
    "mapper": (anemoi_block.GraphTransformerMapperBlock, gtnorm.anemoi.GraphTransformerMapperBlock, False),
}


@pytest.mark.parametrize("name", list(BLOCKS))
def test_block_is_anemoi_s_block_with_an_anemoi_conv(name):
    anemoi_class, gtnorm_class, edge_pre_mlp = BLOCKS[name]
    mapper = anemoi_class is anemoi_block.GraphTransformerMapperBlock
    torch.manual_seed(0)
    # Anemoi's block on its PyG backend, as its own tests build it: there its conv is a module (on its Triton
    # backend, with CUDA, a function).
    expected = anemoi_class(**block_arguments(edge_pre_mlp, mapper, "pyg"))
    block = gtnorm_class(**block_arguments(edge_pre_mlp, mapper, "triton"))
    block.load_state_dict(expected.state_dict())

    assert isinstance(block, anemoi_class)
    assert isinstance(block.conv, AnemoiGraphTransformerConv) and isinstance(block.conv, FusedGraphTransformerConv)
    assert (block.conv.out_channels, block.conv.dropout) == (expected.conv.out_channels, expected.conv.dropout)
    assert block.out_channels_conv == CHANNELS // HEADS and block.num_heads == HEADS
    assert block.q_norm.bias is None and block.k_norm.bias is None
    assert type(block.edge_pre_mlp) is type(expected.edge_pre_mlp)
    # The same module tree under the same names and classes (the block and conv subclasses aside), the same state.
    expected_tree = {n: type(m) for n, m in expected.named_modules()}
    tree = {n: type(m) for n, m in block.named_modules()}
    assert tree.keys() == expected_tree.keys()
    assert {n: t for n, t in tree.items() if n not in ("", "conv")} == {
        n: t for n, t in expected_tree.items() if n not in ("", "conv")
    }
    state, expected_state = block.state_dict(), expected.state_dict()
    assert list(state) == list(expected_state)
    assert all(torch.equal(state[k], expected_state[k]) for k in state)
    assert list(block.conv.state_dict()) == [] and list(block.conv.parameters()) == []
    # Where lin_edge runs: inside the kernels without an edge MLP, in the block with one.
    assert (block.conv.lin_edge is block.lin_edge) == (not edge_pre_mlp)


def test_conv_refuses_attention_dropout_in_training():
    """Anemoi's conv drops attention weights when its dropout is set; the kernels cannot, so they say so."""
    case = Case("processor", checkpoint=False, batch=1)
    _, module = build_pair(case, "triton", torch.device("cpu"))
    inputs = make_inputs(case, torch.device("cpu"))
    conv = next(m for m in module.modules() if isinstance(m, FusedGraphTransformerConv))
    conv.dropout = 0.1
    with pytest.raises(NotImplementedError, match="dropout"):
        forward(module, case, inputs)
    module.eval()  # no dropout at inference: runs
    with torch.no_grad():
        forward(module, case, inputs)


@pytest.mark.parametrize("kind", ["processor", "encoder"])
def test_conv_computes_anemoi_s_function(kind, device):
    """The conv of Anemoi's class gives the block Anemoi's result (the blocks' whole checks: test_modules.py)."""
    case = Case(kind, checkpoint=False, batch=1)
    anemoi_module, gtnorm_module = build_pair(case, "triton", device)
    inputs = make_inputs(case, device)
    with torch.no_grad():
        assert rel_error(forward(gtnorm_module, case, inputs), forward(anemoi_module, case, inputs)) <= TOL


def test_anemoi_models_versions_said_at_import():
    check = gtnorm.anemoi.check_anemoi_models_version
    check("0.19.0")
    check("0.19.3rc1")
    for old in ("0.18.0", "0.17.2"):
        with pytest.raises(ImportError, match=r"supports anemoi-models 0\.19\.x .* found " + old.replace(".", r"\.")):
            check(old)
    with pytest.warns(UserWarning, match="untested"):
        check("0.20.0")
