"""graph_transformer_attention with the fused edge projection (edge_features, edge_weight, edge_bias) against the
PyG reference, which forms e = edge_features @ edge_weight + edge_bias and runs in float64.

Tolerances as in test_attention.py: 1e-5 relative for float32 kernels (measured ~1e-7 to 1e-6), the PyG path's
own error (x 1.5, + 1e-3) for 16-bit ones.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

import gtnorm
from gtnorm import _runtime
from gtnorm.nn.reference import reference_graph_transformer_attention
from gtnorm.triton.attention import fuses_edge_projection
from gtnorm.triton.config import attention_launch_config
from tests.conftest import DEVICE, HAS_CUDA
from tests.graphs import SmallGraph, draw_seed, key_bias_error, make_graph, rel_error
from tests.triton.test_attention import (
    NORM_PARAMETER_CASES,
    assert_refused_before_launch,
    layout_of,
    norm_parameter_id,
    torch_norm,
    with_norm_parameters,
)

EPS = 1e-6
PARAM_NAMES = ("q_norm_weight", "q_norm_bias", "k_norm_weight", "k_norm_bias")
PROJECTION_NAMES = ("edge_features", "edge_weight", "edge_bias")
INPUT_NAMES = ("query", "key", "value", *PROJECTION_NAMES, *PARAM_NAMES)
# Each edge-attribute count on a graph of its own kind (all four kinds are covered once).
EDGE_DIMS_GRAPHS = [(1, "decoder_like"), (3, "encoder_like"), (8, "processor_like"), (32, "random_bipartite")]


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    monkeypatch.setattr(_runtime, "POISON_OUTPUTS", True)


def make_inputs(graph: SmallGraph, heads, channels, edge_dim, *, bias=True, qk_norm=True, seed=None) -> dict:
    """Fresh float64 CPU inputs: q, k, v, raw edge attributes [M, D], projection weight [D, H*C] scaled so that e
    is of the size of k and v, bias (far from 0), norm weights (far from 1) and LayerNorm biases (far from 0)."""
    generator = torch.Generator().manual_seed(seed if seed is not None else draw_seed())

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    width = heads * channels
    inputs = dict.fromkeys(INPUT_NAMES)
    inputs.update(
        query=randn(graph.num_dst, heads, channels),
        key=randn(graph.num_src, heads, channels),
        value=randn(graph.num_src, heads, channels),
        edge_features=randn(graph.edge_index.shape[1], edge_dim),
        edge_weight=randn(edge_dim, width) / edge_dim**0.5,
        edge_bias=0.5 * randn(width) if bias else None,
    )
    if qk_norm:
        inputs.update(q_norm_weight=1.0 + 0.5 * randn(channels), k_norm_weight=1.0 + 0.5 * randn(channels))
    if qk_norm == "layer":
        inputs.update(q_norm_bias=0.5 * randn(channels), k_norm_bias=0.5 * randn(channels))
    return inputs


def leaf_copies(inputs, dtype, device, no_grad=()):
    return {
        k: v.to(device=device, dtype=dtype).requires_grad_(k not in no_grad) if v is not None else None
        for k, v in inputs.items()
    }


def _grads(out, inputs, grad_out):
    names = [k for k in INPUT_NAMES if inputs[k] is not None and inputs[k].requires_grad]
    grads = torch.autograd.grad(out, [inputs[k] for k in names], grad_out.to(out.dtype))
    return dict(zip(names, grads, strict=True))


def run_gtnorm(inputs, layout, grad_out, qk_norm, eps=EPS, launch=None):
    # The plan passed in keeps the projection fused whatever the dispatch rule would pick (test_dispatch_rule).
    extended = inputs["edge_features"].shape[1] + (inputs["edge_bias"] is not None)
    launch = launch or attention_launch_config(*inputs["query"].shape[1:], extended)
    out = gtnorm.graph_transformer_attention(
        inputs["query"], inputs["key"], inputs["value"], None, layout, qk_norm=qk_norm, eps=eps, launch=launch,
        **{name: inputs[name] for name in (*PROJECTION_NAMES, *PARAM_NAMES)},
    )  # fmt: skip
    return out, _grads(out, inputs, grad_out)


def run_reference(inputs, graph, grad_out, qk_norm, eps=EPS):
    channels = inputs["query"].shape[-1]
    q_norm = torch_norm(qk_norm, channels, inputs["q_norm_weight"], inputs["q_norm_bias"], eps)
    k_norm = torch_norm(qk_norm, channels, inputs["k_norm_weight"], inputs["k_norm_bias"], eps)
    out = reference_graph_transformer_attention(
        inputs["query"], inputs["key"], inputs["value"], None, graph.edge_index.to(inputs["query"].device),
        size=(graph.num_src, graph.num_dst), q_norm=q_norm, k_norm=k_norm,
        **{name: inputs[name] for name in PROJECTION_NAMES},
    )  # fmt: skip
    return out, _grads(out, inputs, grad_out)


def grad_error(name, grads, ref_grads) -> float:
    if name == "k_norm_bias":  # exactly 0 in exact arithmetic (tests/graphs.py: key_bias_error)
        return key_bias_error(grads[name], ref_grads[name], ref_grads["key"])
    return rel_error(grads[name], ref_grads[name])


def assert_matches(out, grads, ref_out, ref_grads, tolerance):
    assert rel_error(out, ref_out) < tolerance
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        assert grad.shape == ref_grads[name].shape, name
        assert grad_error(name, grads, ref_grads) < tolerance, name


def check_float32(graph, heads, channels, edge_dim, qk_norm, bias=True, no_grad=(), launch=None):
    inputs = make_inputs(graph, heads, channels, edge_dim, bias=bias, qk_norm=qk_norm)
    grad_out = torch.randn(graph.num_dst, heads, channels, dtype=torch.float64)
    ref_out, ref_grads = run_reference(leaf_copies(inputs, torch.float64, "cpu", no_grad), graph, grad_out, qk_norm)
    leaves = leaf_copies(inputs, torch.float32, DEVICE, no_grad)
    out, grads = run_gtnorm(leaves, layout_of(graph), grad_out.to(DEVICE), qk_norm, launch=launch)
    assert out.dtype == torch.float32
    assert_matches(out, grads, ref_out, ref_grads, 1e-5)
    return grads


@pytest.mark.parametrize("edge_dim_graph", EDGE_DIMS_GRAPHS, ids=lambda dg: f"D{dg[0]}-{dg[1]}")
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("qk_norm", [True, "layer", False], ids=["rms", "layer", "no_norm"])
def test_matches_reference_float32(edge_dim_graph, bias, qk_norm):
    """Output and every gradient (q, k, v, edge_features, edge_weight, edge_bias, norm parameters); odd H and C."""
    edge_dim, graph_name = edge_dim_graph
    check_float32(make_graph(graph_name), 3, 5, edge_dim, qk_norm, bias)


@pytest.mark.parametrize("case", NORM_PARAMETER_CASES, ids=norm_parameter_id)
def test_norm_parameters_are_independent(case):
    """q's and k's weight and bias each on or off on its own with the fused projection, whose node-block kernels
    and weight gradient take the query norm's parameters apart from the edge walks (test_attention.py has the same
    cases with and without edge rows)."""
    qk_norm = case[0]
    graph = make_graph("encoder_like")
    inputs = with_norm_parameters(make_inputs(graph, 2, 8, 3, qk_norm=qk_norm), case)
    grad_out = torch.randn(graph.num_dst, 2, 8, dtype=torch.float64)
    ref_out, ref_grads = run_reference(leaf_copies(inputs, torch.float64, "cpu"), graph, grad_out, qk_norm)
    out, grads = run_gtnorm(leaf_copies(inputs, torch.float32, DEVICE), layout_of(graph), grad_out.to(DEVICE), qk_norm)
    assert_matches(out, grads, ref_out, ref_grads, 1e-5)


@pytest.mark.parametrize("heads_channels", [(2, 16), (1, 4)] + ([(16, 64), (8, 32), (5, 24)] if HAS_CUDA else []))
def test_matches_reference_other_sizes(heads_channels):
    """Several heads per program and one head alone (and Anemoi's sizes on a GPU)."""
    check_float32(make_graph("encoder_like"), *heads_channels, 11, "layer")


@pytest.mark.parametrize("qk_norm", [True, "layer", False], ids=["rms", "layer", "no_norm"])
def test_channel_tiles_match_reference(qk_norm):
    """Heads walked in channel tiles by the node-block kernels and the weights' gradient (the plan for wide heads,
    forced here on 40 channels: tiles of 16, the last partial)."""
    heads, channels, edge_dim = 2, 40, 5
    plan = attention_launch_config(heads, channels, edge_dim + 1)
    plan = dataclasses.replace(plan, projection=dataclasses.replace(plan.projection, channel_block=16))
    check_float32(make_graph("encoder_like"), heads, channels, edge_dim, qk_norm, launch=plan)


def test_dispatch_rule_materialises_low_degree_graphs_with_a_norm():
    """Without a plan the op follows config.edge_projection_pays: on a decoder-like graph (3 edges per destination)
    with a norm it forms e itself, and the result is the same function (float32, against float64)."""
    graph = make_graph("decoder_like")
    layout = layout_of(graph)
    assert not gtnorm.triton.config.edge_projection_pays(layout.num_edges, layout.num_dst, "rms", 2 * 8)
    inputs = make_inputs(graph, 2, 8, 3, qk_norm=True)
    grad_out = torch.randn(graph.num_dst, 2, 8, dtype=torch.float64)
    ref_out, ref_grads = run_reference(leaf_copies(inputs, torch.float64, "cpu"), graph, grad_out, True)
    leaves = leaf_copies(inputs, torch.float32, DEVICE)
    out = gtnorm.graph_transformer_attention(
        leaves["query"], leaves["key"], leaves["value"], None, layout, qk_norm=True, eps=EPS,
        **{name: leaves[name] for name in (*PROJECTION_NAMES, *PARAM_NAMES)},
    )  # fmt: skip
    assert_matches(out, _grads(out, leaves, grad_out.to(DEVICE)), ref_out, ref_grads, 1e-5)


def test_edge_features_without_grad():
    """Constant raw attributes (Anemoi's edge lengths and directions): no gradient is asked for or returned;
    the weight and bias gradients stay exact."""
    grads = check_float32(make_graph("processor_like"), 3, 5, 4, True, no_grad=("edge_features",))
    assert "edge_features" not in grads and "edge_weight" in grads and "edge_bias" in grads


def test_transposed_linear_weight(monkeypatch):
    """A torch.nn.Linear weight [H*C, D] passed as weight.t() (strides (1, D)) gives the contiguous weight's
    results bit for bit, and its gradient reaches the Linear's weight."""
    monkeypatch.setattr(gtnorm.triton.config, "_PROJECTION_MIN_EDGES", 0)  # the dispatch rule fuses this small graph
    graph = make_graph("encoder_like")
    inputs = make_inputs(graph, 3, 5, 6)
    grad_out = torch.randn(graph.num_dst, 3, 5, device=DEVICE)
    layout = layout_of(graph)
    out, grads = run_gtnorm(leaf_copies(inputs, torch.float32, DEVICE), layout, grad_out, True)
    leaves = leaf_copies(inputs, torch.float32, DEVICE)
    linear_weight = inputs["edge_weight"].t().contiguous().to(DEVICE, torch.float32).requires_grad_()
    leaves["edge_weight"] = linear_weight.t()
    assert not leaves["edge_weight"].is_contiguous()
    out_t = gtnorm.graph_transformer_attention(
        leaves["query"], leaves["key"], leaves["value"], None, layout, qk_norm=True, eps=EPS,
        q_norm_weight=leaves["q_norm_weight"], k_norm_weight=leaves["k_norm_weight"],
        edge_features=leaves["edge_features"], edge_weight=leaves["edge_weight"], edge_bias=leaves["edge_bias"],
    )  # fmt: skip
    (grad_linear,) = torch.autograd.grad(out_t, [linear_weight], grad_out)
    assert torch.equal(out_t, out)
    assert torch.equal(grad_linear, grads["edge_weight"].t())


def test_matches_materialised_edge_attr():
    """The fused projection and the same e passed as edge_attr compute the same function (to fp32 rounding);
    the projection's gradients are those of the materialised e pushed through the projection."""
    graph = make_graph("processor_like")
    inputs = make_inputs(graph, 2, 8, 5)
    grad_out = torch.randn(graph.num_dst, 2, 8, device=DEVICE)
    layout = layout_of(graph)
    fused = leaf_copies(inputs, torch.float32, DEVICE)
    out, grads = run_gtnorm(fused, layout, grad_out, "rms")
    leaves = leaf_copies(inputs, torch.float32, DEVICE)
    edge_attr = (leaves["edge_features"] @ leaves["edge_weight"] + leaves["edge_bias"]).view(-1, 2, 8)
    materialised = gtnorm.graph_transformer_attention(
        leaves["query"], leaves["key"], leaves["value"], edge_attr, layout, qk_norm="rms", eps=EPS,
        q_norm_weight=leaves["q_norm_weight"], k_norm_weight=leaves["k_norm_weight"],
    )  # fmt: skip
    names = ("query", "key", "value", *PROJECTION_NAMES)
    ref_grads = torch.autograd.grad(materialised, [leaves[n] for n in names], grad_out)
    assert rel_error(out, materialised) < 1e-6
    for name, ref in zip(names, ref_grads, strict=True):
        assert rel_error(grads[name], ref) < 1e-5, name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("qk_norm", ["rms", "layer"])
def test_low_precision_within_pyg_error(dtype, qk_norm):
    heads, channels, edge_dim = (16, 64, 11) if HAS_CUDA else (2, 16, 6)
    graph = make_graph("encoder_like")
    inputs = make_inputs(graph, heads, channels, edge_dim, qk_norm=qk_norm)
    rounded = {k: v.to(dtype).double() if v is not None else None for k, v in inputs.items()}
    grad_out = torch.randn(graph.num_dst, heads, channels, dtype=torch.float64).to(dtype).double()
    ref_out, ref_grads = run_reference(leaf_copies(rounded, torch.float64, "cpu"), graph, grad_out, qk_norm)
    pyg_out, pyg_grads = run_reference(leaf_copies(rounded, dtype, DEVICE), graph, grad_out.to(DEVICE), qk_norm)
    out, grads = run_gtnorm(leaf_copies(rounded, dtype, DEVICE), layout_of(graph), grad_out.to(DEVICE), qk_norm)
    assert out.dtype == dtype
    assert rel_error(out, ref_out) <= 1.5 * rel_error(pyg_out, ref_out) + 1e-3
    for name, grad in grads.items():
        assert grad.dtype == dtype, name
        assert grad_error(name, grads, ref_grads) <= 1.5 * grad_error(name, pyg_grads, ref_grads) + 1e-3, name


def test_mixed_dtypes():
    """Autocast's mix: 16-bit q, k, v, float32 raw attributes and projection parameters. Each gradient comes in
    its input's dtype, values within the PyG path's own error with every operand in bfloat16, the narrowest of
    those dtypes (x 1.5 + 1e-3, as in test_low_precision_within_pyg_error)."""
    graph = make_graph("decoder_like")
    inputs = make_inputs(graph, 2, 8, 7)
    dtypes = {"query": torch.bfloat16, "key": torch.float16, "value": torch.bfloat16}
    rounded = {k: v.to(dtypes.get(k, torch.float32)).double() if v is not None else None for k, v in inputs.items()}
    grad_out = torch.randn(graph.num_dst, 2, 8, dtype=torch.float64).to(torch.bfloat16).double()
    ref_out, ref_grads = run_reference(leaf_copies(rounded, torch.float64, "cpu"), graph, grad_out, True)
    leaves = {
        k: v.to(DEVICE, dtypes.get(k, torch.float32)).requires_grad_() if v is not None else None
        for k, v in rounded.items()
    }
    out, grads = run_gtnorm(leaves, layout_of(graph), grad_out.to(DEVICE), True)
    pyg_out, pyg_grads = run_reference(leaf_copies(rounded, torch.bfloat16, DEVICE), graph, grad_out.to(DEVICE), True)
    assert out.dtype == torch.bfloat16
    assert rel_error(out, ref_out) <= 1.5 * rel_error(pyg_out, ref_out) + 1e-3
    for name, grad in grads.items():
        assert grad.dtype == leaves[name].dtype, name
        assert grad_error(name, grads, ref_grads) <= 1.5 * grad_error(name, pyg_grads, ref_grads) + 1e-3, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_backward_is_bitwise_deterministic(dtype):
    heads, channels = (16, 64) if HAS_CUDA else (2, 8)
    graph = make_graph("encoder_like")
    inputs = leaf_copies(make_inputs(graph, heads, channels, 11, qk_norm="layer"), dtype, DEVICE)
    layout = layout_of(graph)
    grad_out = torch.randn(graph.num_dst, heads, channels, device=DEVICE)
    first_out, first = run_gtnorm(inputs, layout, grad_out, "layer")
    for _ in range(2):
        out, again = run_gtnorm(inputs, layout, grad_out, "layer")
        assert torch.equal(out, first_out)
        for name in first:
            assert torch.equal(again[name], first[name]), name


def test_result_does_not_depend_on_edge_order():
    graph = make_graph("processor_like")
    inputs = make_inputs(graph, 3, 5, 4)
    grad_out = torch.randn(graph.num_dst, 3, 5, device=DEVICE)
    out, grads = run_gtnorm(leaf_copies(inputs, torch.float32, DEVICE), layout_of(graph), grad_out, True)
    perm = torch.randperm(graph.edge_index.shape[1])
    shuffled = SmallGraph("shuffled", graph.edge_index[:, perm], graph.num_src, graph.num_dst)
    inputs_shuffled = dict(inputs, edge_features=inputs["edge_features"][perm])
    out_s, grads_s = run_gtnorm(
        leaf_copies(inputs_shuffled, torch.float32, DEVICE), layout_of(shuffled), grad_out, True
    )
    assert rel_error(out_s, out) < 1e-5
    grads_s["edge_features"] = grads_s["edge_features"][torch.argsort(perm.to(DEVICE))]
    for name in grads:
        assert rel_error(grads_s[name], grads[name]) < 1e-5, name


def test_zero_degree_nodes_and_graph_without_edges():
    graph = make_graph("random_bipartite")
    inputs = leaf_copies(make_inputs(graph, 2, 8, 3, qk_norm="layer"), torch.float32, DEVICE)
    out, grads = run_gtnorm(inputs, layout_of(graph), torch.randn(graph.num_dst, 2, 8, device=DEVICE), "layer")
    no_in = (torch.bincount(graph.edge_index[1], minlength=graph.num_dst) == 0).to(DEVICE)
    no_out = (torch.bincount(graph.edge_index[0], minlength=graph.num_src) == 0).to(DEVICE)
    assert no_in.any() and no_out.any()
    assert (out[no_in] == 0).all() and (grads["query"][no_in] == 0).all()
    assert (grads["key"][no_out] == 0).all() and (grads["value"][no_out] == 0).all()

    empty = SmallGraph("empty", torch.zeros(2, 0, dtype=torch.long), 5, 4)
    inputs = leaf_copies(make_inputs(empty, 2, 8, 3, qk_norm="layer"), torch.float32, DEVICE)
    out, grads = run_gtnorm(inputs, layout_of(empty), torch.randn(4, 2, 8, device=DEVICE), "layer")
    assert torch.equal(out, torch.zeros_like(out))
    for name, grad in grads.items():
        assert torch.equal(grad, torch.zeros_like(grad)), name


def _op_args(graph, heads, channels, edge_dim, qk_norm, bias=True):
    inputs = make_inputs(graph, heads, channels, edge_dim, qk_norm=qk_norm, bias=bias)
    inputs = leaf_copies(inputs, torch.float32, DEVICE)
    tensors = [inputs[k] for k in ("query", "key", "value")] + [None] + [inputs[k] for k in INPUT_NAMES[3:]]
    return tensors, layout_of(graph).tensors()


@pytest.mark.parametrize(
    "edge_features_grad, bias", [(True, True), (False, False)], ids=["grad-bias", "no_grad-no_bias"]
)
def test_opcheck(edge_features_grad, bias):
    graph = make_graph("decoder_like", scale=1)
    tensors, layout_args = _op_args(graph, 2, 4, 3, "layer", bias)
    forward_args = (*tensors, list(layout_args), "layer", EPS, 2 * EPS)
    torch.library.opcheck(torch.ops.gtnorm.graph_attention_forward.default, forward_args)
    _, lse, query_proj = torch.ops.gtnorm.graph_attention_forward(*forward_args)
    detached = [t.detach() if t is not None else None for t in tensors]
    grad_out = torch.randn_like(detached[0])
    backward_args = (grad_out, *detached, lse, query_proj, list(layout_args), "layer", EPS, 2 * EPS)
    torch.library.opcheck(torch.ops.gtnorm.graph_attention_backward.default, (*backward_args, edge_features_grad))


@pytest.mark.gpu
def test_torch_compile_fullgraph(monkeypatch):
    """The fused projection under torch.compile(fullgraph=True): the same results as eager, bit for bit."""
    monkeypatch.setattr(gtnorm.triton.config, "_PROJECTION_MIN_EDGES", 0)  # the dispatch rule fuses this small graph
    graph = make_graph("encoder_like")
    layout = layout_of(graph)
    inputs = leaf_copies(make_inputs(graph, 16, 64, 11, qk_norm="layer"), torch.bfloat16, DEVICE)
    grad_out = torch.randn(graph.num_dst, 16, 64, device=DEVICE)

    def attention(query, key, value, edge_features, edge_weight, edge_bias, *norm_params):
        return gtnorm.graph_transformer_attention(
            query, key, value, None, layout, qk_norm="layer", eps=EPS,
            edge_features=edge_features, edge_weight=edge_weight, edge_bias=edge_bias,
            **dict(zip(PARAM_NAMES, norm_params, strict=True)),
        )  # fmt: skip

    compiled = torch.compile(attention, fullgraph=True)
    out = compiled(*[inputs[k] for k in INPUT_NAMES])
    compiled_grads = _grads(out, inputs, grad_out)
    eager_out = attention(*[inputs[k] for k in INPUT_NAMES])  # the same dispatch as the compiled call
    eager_grads = _grads(eager_out, inputs, grad_out)
    assert torch.equal(out, eager_out)
    for name in eager_grads:
        assert torch.equal(compiled_grads[name], eager_grads[name]), name


def _bad_inputs():
    """(description, change to the valid call's kwargs, exception type, message fragment)."""
    return [
        (
            "edge_attr and edge_features",
            lambda kw: kw.update(edge_attr=torch.zeros(kw["edge_features"].shape[0], 2, 8, device=DEVICE)),
            ValueError,
            "not both",
        ),
        (
            "weight without features",
            lambda kw: kw.update(edge_features=None),
            ValueError,
            "edge_weight was given without edge_features",
        ),
        (
            "bias without features",
            lambda kw: kw.update(edge_features=None, edge_weight=None),
            ValueError,
            "edge_bias was given without edge_features",
        ),
        ("features without weight", lambda kw: kw.update(edge_weight=None), ValueError, "needs edge_weight"),
        (
            "features rows",
            lambda kw: kw.update(edge_features=kw["edge_features"][1:]),
            ValueError,
            "edge_features must have shape",
        ),
        (
            "features rank",
            lambda kw: kw.update(edge_features=kw["edge_features"][:, :, None]),
            ValueError,
            "edge_features must have shape",
        ),
        (
            "too many attributes",
            lambda kw: kw.update(
                edge_features=torch.zeros(kw["edge_features"].shape[0], 65, device=DEVICE),
                edge_weight=torch.zeros(65, 16, device=DEVICE),
            ),
            ValueError,
            "1 to 64 attributes",
        ),
        (
            "weight D mismatch",
            lambda kw: kw.update(edge_weight=kw["edge_weight"][1:]),
            ValueError,
            "edge_weight must have shape",
        ),
        ("linear layout", lambda kw: kw.update(edge_weight=kw["edge_weight"].t()), ValueError, "weight.t()"),
        ("bias size", lambda kw: kw.update(edge_bias=kw["edge_bias"][1:]), ValueError, "edge_bias must have shape"),
        (
            "float64 features",
            lambda kw: kw.update(edge_features=kw["edge_features"].double()),
            TypeError,
            "edge_features must be float16",
        ),
        (
            "int weight",
            lambda kw: kw.update(edge_weight=kw["edge_weight"].int()),
            TypeError,
            "edge_weight must be float16",
        ),
        (
            "weight type",
            lambda kw: kw.update(edge_weight=kw["edge_weight"].tolist()),
            TypeError,
            "edge_weight must be a torch.Tensor",
        ),
        ("bias device", lambda kw: kw.update(edge_bias=kw["edge_bias"].to("meta")), ValueError, "edge_bias is on"),
    ]


@pytest.mark.parametrize("case", _bad_inputs(), ids=lambda c: c[0])
def test_bad_input_raises_before_launch(case, monkeypatch):
    _, change, exc, fragment = case
    graph = make_graph("encoder_like", scale=1)
    inputs = leaf_copies(make_inputs(graph, 2, 8, 3, qk_norm=False), torch.float32, DEVICE)
    kwargs = {k: v for k, v in inputs.items() if k not in PARAM_NAMES}
    kwargs.update(layout=layout_of(graph), edge_attr=None)
    change(kwargs)
    assert_refused_before_launch(kwargs, exc, fragment, monkeypatch)


@pytest.mark.parametrize("heads, channels, fused", [(16, 64, True), (4, 32, False)])
def test_dispatch_fuses_where_the_features_would_pass_2_to_the_31(heads, channels, fused):
    """The op's dispatch hands the rule H * C: an O1280 decoder chunk's 4.95M edges at 16 x 64 would materialise
    5.1 G feature elements and are fused; at 4 x 32 (0.6 G) the low-degree rule materialises them. Sizes only: the
    layout and tensors stand in (no kernel runs)."""
    layout = types.SimpleNamespace(num_edges=4_951_680, num_dst=1_650_560)
    query = torch.empty(1, heads, channels)
    edge_features = torch.empty(1, 11)
    assert fuses_edge_projection(query, edge_features, None, layout, "layer") is fused
