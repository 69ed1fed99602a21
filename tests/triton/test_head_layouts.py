"""Every head layout Anemoi's widths allow, with and without the fused edge projection, against float64 (GPU only:
the interpreter has no shared-memory or register limit, so only compiled kernels can fail to launch).

The grid: wide heads (tiles of the node-block kernels split along the channels) and many narrow ones, H * C up to
4096, D in {1, 3, 8, 32, 64} raw attributes, norm off / RMS / LayerNorm, bfloat16 and float32; forward and every
gradient. float32: 1e-5 relative; bfloat16: within the PyG path's own error (x 1.5, + 1e-3). The plan's arithmetic
is checked on the CPU by tests/triton/test_config.py.
"""

from __future__ import annotations

import pytest
import torch

import gtnorm
from gtnorm._runtime import shared_memory_per_block
from gtnorm.nn.reference import reference_graph_transformer_attention
from gtnorm.triton.config import attention_launch_config
from tests.conftest import DEVICE
from tests.graphs import make_graph, rel_error
from tests.triton.test_attention import layout_of, torch_norm
from tests.triton.test_edge_projection import (
    EPS,
    PARAM_NAMES,
    PROJECTION_NAMES,
    assert_matches,
    grad_error,
    leaf_copies,
    make_inputs,
)

# The layouts that failed to launch before the plan fitted tiles to shared memory (issue 30), Anemoi's usual ones
# and the extremes of H * C = 1024; H * C = 4096 (whose walks take minutes to compile per variant) on a few cases.
HEAD_LAYOUTS = [(4, 256), (6, 160), (2, 512), (1, 1024), (16, 64), (8, 128), (32, 32), (64, 16)]
WIDEST_LAYOUTS = [(1, 4096), (4, 1024)]
EDGE_DIMS = [1, 3, 8, 32, 64]
NORMS = {"none": False, "rms": "rms", "layer": "layer"}
GRAPH_SCALE = 10  # random_bipartite: 230 sources, 170 destinations (a few without edges), 700 edges


def _run(inputs, graph, grad_out, qk_norm, launch=None, reference=False):
    """Output and gradients of gtnorm's op (or the PyG reference), with edge_attr or with the fused projection."""
    edge_attr = inputs.get("edge_attr")
    names = [k for k, v in inputs.items() if v is not None]
    kwargs = {k: inputs[k] for k in (*PROJECTION_NAMES, *PARAM_NAMES)}
    q, k, v = inputs["query"], inputs["key"], inputs["value"]
    if reference:
        channels = q.shape[-1]
        norms = [torch_norm(qk_norm, channels, kwargs.pop(f"{x}_norm_weight"), kwargs.pop(f"{x}_norm_bias"), EPS)
                 for x in "qk"]  # fmt: skip
        edge_index = graph.edge_index.to(q.device)
        out = reference_graph_transformer_attention(
            q, k, v, edge_attr, edge_index, size=(graph.num_src, graph.num_dst), q_norm=norms[0], k_norm=norms[1],
            **kwargs,
        )  # fmt: skip
    else:
        out = gtnorm.graph_transformer_attention(
            q, k, v, edge_attr, layout_of(graph), qk_norm=qk_norm, eps=EPS, launch=launch, **kwargs
        )
    grads = torch.autograd.grad(out, [inputs[n] for n in names], grad_out.to(out.dtype))
    return out, dict(zip(names, grads, strict=True))


def _check(heads, channels, edge_dim, norm, dtype, projection: bool):
    graph = make_graph("random_bipartite", scale=GRAPH_SCALE)
    qk_norm = NORMS[norm]
    inputs = make_inputs(graph, heads, channels, edge_dim, qk_norm=qk_norm)
    inputs["edge_attr"] = None
    if not projection:  # the same edge features, formed before the kernels
        features = inputs["edge_features"] @ inputs["edge_weight"] + inputs["edge_bias"]
        inputs.update(edge_attr=features.view(-1, heads, channels), edge_features=None, edge_weight=None)
        inputs["edge_bias"] = None
    launch = None
    if projection:  # passed in, so that the fused path runs whatever the dispatch rule would pick
        launch = attention_launch_config(heads, channels, edge_dim + 1, shared_memory_per_block(DEVICE))
        assert launch is not None
    rounded = {k: v.to(dtype).double() if v is not None else None for k, v in inputs.items()}
    grad_out = torch.randn(graph.num_dst, heads, channels, dtype=torch.float64).to(dtype).double()
    ref_out, ref_grads = _run(leaf_copies(rounded, torch.float64, "cpu"), graph, grad_out, qk_norm, reference=True)
    out, grads = _run(leaf_copies(rounded, dtype, DEVICE), graph, grad_out.to(DEVICE), qk_norm, launch)
    torch.cuda.synchronize()
    if dtype == torch.float32:
        assert_matches(out, grads, ref_out, ref_grads, 1e-5)
        return
    pyg = _run(leaf_copies(rounded, dtype, DEVICE), graph, grad_out.to(DEVICE), qk_norm, reference=True)
    assert rel_error(out, ref_out) <= 1.5 * rel_error(pyg[0], ref_out) + 1e-3
    for name in grads:
        assert grad_error(name, grads, ref_grads) <= 1.5 * grad_error(name, pyg[1], ref_grads) + 1e-3, name


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("norm", list(NORMS))
@pytest.mark.parametrize("edge_dim", EDGE_DIMS, ids=lambda d: f"D{d}")
@pytest.mark.parametrize("heads_channels", HEAD_LAYOUTS, ids=lambda hc: f"{hc[0]}x{hc[1]}")
def test_fused_edge_projection_runs_every_layout(heads_channels, edge_dim, norm, dtype):
    _check(*heads_channels, edge_dim, norm, dtype, projection=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("norm", list(NORMS))
@pytest.mark.parametrize("heads_channels", HEAD_LAYOUTS, ids=lambda hc: f"{hc[0]}x{hc[1]}")
def test_edge_features_run_every_layout(heads_channels, norm, dtype):
    _check(*heads_channels, 8, norm, dtype, projection=False)


@pytest.mark.gpu
@pytest.mark.parametrize("projection", [True, False], ids=["fused_projection", "edge_features"])
@pytest.mark.parametrize("heads_channels", WIDEST_LAYOUTS, ids=lambda hc: f"{hc[0]}x{hc[1]}")
def test_widest_layouts_run(heads_channels, projection):
    _check(*heads_channels, 8, "layer", torch.bfloat16, projection=projection)
