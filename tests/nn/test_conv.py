"""GraphTransformerConv: both backends against each other, state_dict, layout cache, backend choice, checks.

Tolerances: the Triton backend in float32 against the PyG backend run in float64 on the same inputs and
parameters, relative Frobenius error < 1e-5 for the output and every gradient (query, key, value, edge_attr,
q_norm.weight, k_norm.weight); the PyG backend in float32 meets the same bound. On the CPU the Triton backend
runs through the interpreter (tests/conftest.py sets TRITON_INTERPRET=1), so graphs stay small.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import pickle
import warnings

import pytest
import torch

import gtnorm
import gtnorm.nn.conv as conv_module
from gtnorm.nn.conv import GraphTransformerConv
from gtnorm.triton.attention import MAX_EDGE_FEATURES
from gtnorm.triton.layout_cache import clear_layout_cache
from tests.conftest import DEVICE, HAS_CUDA
from tests.graphs import GRAPH_BUILDERS, SmallGraph, key_bias_error, make_graph, random_inputs, rel_error

EPS = 1e-6
TOLERANCE = 1e-5
HEADS_CHANNELS = [(2, 8), (3, 5)] + ([(16, 64)] if HAS_CUDA else [])


@pytest.fixture(autouse=True)
def empty_layout_cache():
    clear_layout_cache()
    yield
    clear_layout_cache()


def make_conv(channels, qk_norm=True, backend="auto", eps=EPS, dtype=torch.float32, device=DEVICE, seed=0, **norms):
    """A conv whose norm parameters are far from their initialisation (weights 1, biases 0), so that they matter.
    ``norms``: the caller's q_norm / k_norm modules instead of qk_norm."""
    if norms:
        conv = GraphTransformerConv(channels, backend=backend, **norms)
    else:
        conv = GraphTransformerConv(channels, qk_norm=qk_norm, eps=eps, backend=backend)
    randomize_norm_parameters(conv, seed)
    return conv.to(device=device, dtype=dtype)


def randomize_norm_parameters(conv, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in conv.named_parameters():
            offset = 1.0 if name.endswith("weight") else 0.0
            param.copy_(offset + 0.5 * torch.randn(param.shape, generator=generator, dtype=torch.float64))


def make_inputs(graph: SmallGraph, heads, channels, edge_attr=True, dtype=torch.float64, device="cpu"):
    inputs = random_inputs(graph, heads, channels, edge_attr=edge_attr)
    return {k: v.to(device=device, dtype=dtype) if v is not None else None for k, v in inputs.items()}


def run_conv(conv, inputs, graph, grad_out=None, size=True):
    """Output and gradients of every input and parameter (by name) that takes part."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items() if v is not None}
    device = leaves["query"].device
    out = conv(
        leaves["query"], leaves["key"], leaves["value"], leaves.get("edge_attr"), graph.edge_index.to(device),
        size=(graph.num_src, graph.num_dst) if size else None,
    )  # fmt: skip
    if grad_out is None:
        return out, {}
    wrt = dict(leaves, **{name: p for name, p in conv.named_parameters()})
    grads = torch.autograd.grad(out, list(wrt.values()), grad_out.to(device=device, dtype=out.dtype))
    return out, dict(zip(wrt, grads, strict=True))


def grad_error(name, grads, ref_grads) -> float:
    """rel_error, except for k_norm.bias, whose exact gradient is 0 (tests/graphs.py: key_bias_error)."""
    if name == "k_norm.bias":
        return key_bias_error(grads[name], ref_grads[name], ref_grads["key"])
    return rel_error(grads[name], ref_grads[name])


def assert_same_function(conv, reference, graph, inputs, dtype=torch.float32, tolerance=TOLERANCE):
    """conv on inputs cast to dtype against reference (a float64 CPU conv) on the float64 inputs: output and
    every gradient (inputs and parameters, by name)."""
    grad_out = torch.randn(graph.num_dst, *inputs["query"].shape[1:], dtype=torch.float64)
    ref_out, ref_grads = run_conv(reference, inputs, graph, grad_out)
    cast = {k: v.to(DEVICE, dtype) if v is not None else None for k, v in inputs.items()}
    out, grads = run_conv(conv, cast, graph, grad_out)
    assert out.dtype == dtype
    assert rel_error(out, ref_out) < tolerance
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        assert grad_error(name, grads, ref_grads) < tolerance, name


# --- the two backends compute the same function --------------------------------------------------------------


def _backend_cases():
    """(graph, (H, C), qk_norm, edge_attr). On the CPU (interpreter, ~1 s per fwd+bwd) a covering selection:
    every graph, both shapes, with and without norm and edge features; graph-by-graph breadth of the kernels
    themselves is tests/triton's job. On a GPU the full product."""
    if HAS_CUDA:
        return list(itertools.product(GRAPH_BUILDERS, HEADS_CHANNELS, [True, "layer", False], [True, False]))
    return [
        ("random_bipartite", (2, 8), True, True),
        ("random_bipartite", (3, 5), False, False),
        ("encoder_like", (3, 5), "layer", True),
        ("encoder_like", (2, 8), True, False),
        ("decoder_like", (2, 8), False, True),
        ("decoder_like", (3, 5), "layer", True),
        ("processor_like", (3, 5), True, False),
        ("processor_like", (2, 8), "layer", True),
    ]


def _case_id(case):
    graph_name, (heads, channels), qk_norm, edge_attr = case
    norm = {True: "rms", "layer": "layer", False: "no_norm"}[qk_norm]
    edges = "edge_attr" if edge_attr else "no_edge_attr"
    return f"{graph_name}-H{heads}C{channels}-{norm}-{edges}"


@pytest.mark.parametrize("case", _backend_cases(), ids=_case_id)
def test_triton_backend_matches_pyg_backend(case):
    graph_name, (heads, channels), qk_norm, edge_attr = case
    graph = make_graph(graph_name, seed=0)
    inputs = make_inputs(graph, heads, channels, edge_attr=edge_attr)
    grad_out = torch.randn(graph.num_dst, heads, channels, dtype=torch.float64)

    reference = make_conv(channels, qk_norm, backend="pyg", dtype=torch.float64, device="cpu")
    ref_out, ref_grads = run_conv(reference, inputs, graph, grad_out)
    inputs32 = {k: v.to(DEVICE, torch.float32) if v is not None else None for k, v in inputs.items()}
    for backend in ("triton", "pyg"):
        conv = make_conv(channels, qk_norm, backend=backend)
        out, grads = run_conv(conv, inputs32, graph, grad_out)
        assert out.dtype == torch.float32 and out.shape == ref_out.shape
        assert rel_error(out, ref_out) < TOLERANCE, backend
        assert grads.keys() == ref_grads.keys()
        for name, grad in grads.items():
            assert grad.shape == ref_grads[name].shape, name
            assert grad_error(name, grads, ref_grads) < TOLERANCE, (backend, name)


def test_default_eps_agrees_between_backends():
    """eps=None: both backends use torch.finfo(float32).eps."""
    graph = make_graph("processor_like", seed=1)
    inputs = make_inputs(graph, 2, 8, dtype=torch.float32, device=DEVICE)
    # Tiny inputs make eps a visible part of mean(x^2) + eps.
    inputs["query"], inputs["key"] = 1e-4 * inputs["query"], 1e-4 * inputs["key"]
    grad_out = torch.randn(graph.num_dst, 2, 8)
    pyg_out, pyg_grads = run_conv(make_conv(8, backend="pyg", eps=None), inputs, graph, grad_out)
    out, grads = run_conv(make_conv(8, backend="triton", eps=None), inputs, graph, grad_out)
    assert rel_error(out, pyg_out) < TOLERANCE
    for name in grads:
        assert rel_error(grads[name], pyg_grads[name]) < TOLERANCE, name


@pytest.mark.parametrize("backend", ["triton", "pyg"])
def test_bfloat16_inputs_with_float32_weights(backend):
    """Autocast-style mixed precision: bf16 activations, fp32 parameters. Output and input grads come back in
    bf16, weight grads in fp32; both backends stay within bf16 rounding of the float64 result."""
    graph = make_graph("encoder_like", seed=2)
    inputs = make_inputs(graph, 2, 16)
    inputs = {k: v.to(torch.bfloat16).double() for k, v in inputs.items()}  # both see the same rounded values
    grad_out = torch.randn(graph.num_dst, 2, 16, dtype=torch.float64).to(torch.bfloat16).double()
    ref_out, ref_grads = run_conv(
        make_conv(16, backend="pyg", dtype=torch.float64, device="cpu"), inputs, graph, grad_out
    )
    conv = make_conv(16, backend=backend)  # float32 parameters
    inputs_bf16 = {k: v.to(DEVICE, torch.bfloat16) for k, v in inputs.items()}
    out, grads = run_conv(conv, inputs_bf16, graph, grad_out)
    assert out.dtype == torch.bfloat16
    assert rel_error(out, ref_out) < 1.5e-2
    for name, grad in grads.items():
        assert grad.dtype == (torch.float32 if "norm" in name else torch.bfloat16), name
        assert rel_error(grad, ref_grads[name]) < 3e-2, name


@pytest.mark.parametrize("backend", ["triton", "pyg"])
def test_graph_without_edges_gives_zeros(backend):
    graph = SmallGraph("empty", torch.zeros(2, 0, dtype=torch.long), 5, 4)
    inputs = make_inputs(graph, 2, 8, dtype=torch.float32, device=DEVICE)
    out, _ = run_conv(make_conv(8, backend=backend), inputs, graph)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("backend", ["triton", "pyg"])
def test_square_graph_needs_no_size(backend):
    graph = make_graph("processor_like", seed=3)
    inputs = make_inputs(graph, 2, 8, dtype=torch.float32, device=DEVICE)
    conv = make_conv(8, backend=backend)
    with_size, _ = run_conv(conv, inputs, graph)
    without_size, _ = run_conv(conv, inputs, graph, size=False)
    # PyG's scatter on a GPU adds in a varying order (atomics): equal up to float32 rounding.
    assert rel_error(with_size, without_size) < 1e-6


# --- state_dict ----------------------------------------------------------------------------------------------


def test_state_dict_keys():
    assert set(GraphTransformerConv(8, qk_norm=True).state_dict()) == {"q_norm.weight", "k_norm.weight"}
    assert GraphTransformerConv(8, qk_norm=False).state_dict() == {}
    conv = GraphTransformerConv(8, qk_norm=True)
    assert isinstance(conv.q_norm, gtnorm.RMSNorm) and isinstance(conv.q_norm, torch.nn.RMSNorm)
    assert torch.equal(conv.q_norm.weight, torch.ones(8)) and conv.q_norm.eps is None
    no_norm = GraphTransformerConv(8)
    assert no_norm.q_norm is None and no_norm.k_norm is None and list(no_norm.parameters()) == []


def test_state_dict_moves_between_backends():
    graph = make_graph("decoder_like", seed=4)
    inputs = make_inputs(graph, 3, 5, dtype=torch.float32, device=DEVICE)
    grad_out = torch.randn(graph.num_dst, 3, 5)
    pyg = make_conv(5, backend="pyg", seed=7)
    triton = GraphTransformerConv(5, qk_norm=True, eps=EPS, backend="triton").to(DEVICE)
    triton.load_state_dict(pyg.state_dict())
    pyg_again = GraphTransformerConv(5, qk_norm=True, eps=EPS, backend="pyg").to(DEVICE)
    pyg_again.load_state_dict(triton.state_dict())

    pyg_out, pyg_grads = run_conv(pyg, inputs, graph, grad_out)
    out, grads = run_conv(triton, inputs, graph, grad_out)
    assert rel_error(out, pyg_out) < TOLERANCE
    for name in grads:
        assert rel_error(grads[name], pyg_grads[name]) < TOLERANCE, name
    assert rel_error(run_conv(pyg_again, inputs, graph)[0], pyg_out) < 1e-6
    # A torch.nn.RMSNorm's state loads into the norms too (same parameter name and shape).
    plain = torch.nn.RMSNorm(5)
    triton.q_norm.load_state_dict(plain.state_dict())
    assert torch.equal(triton.q_norm.weight, torch.ones(5, device=DEVICE))


def _call(conv, graph, edge_index=None, heads=2, channels=8):
    inputs = make_inputs(graph, heads, channels, dtype=torch.float32, device=DEVICE)
    edge_index = graph.edge_index.to(DEVICE) if edge_index is None else edge_index
    return conv(inputs["query"], inputs["key"], inputs["value"], inputs["edge_attr"], edge_index,
                size=(graph.num_src, graph.num_dst)), inputs  # fmt: skip


def _pyg_on(graph, edge_index, inputs):
    """The PyG backend's answer for the graph edge_index describes now."""
    return make_conv(8, backend="pyg")(inputs["query"], inputs["key"], inputs["value"], inputs["edge_attr"],
                                       edge_index, size=(graph.num_src, graph.num_dst))  # fmt: skip


# --- copies -------------------------------------------------------------------------------------------------


def test_module_copies_after_use():
    graph = make_graph("decoder_like", seed=12)
    conv = make_conv(8, backend="triton")
    out, inputs = _call(conv, graph)
    for clone in (copy.deepcopy(conv), pickle.loads(pickle.dumps(conv))):
        again = clone(inputs["query"], inputs["key"], inputs["value"], inputs["edge_attr"],
                      graph.edge_index.to(DEVICE), size=(graph.num_src, graph.num_dst))  # fmt: skip
        assert torch.equal(again, out)


# --- backend choice ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("triton_runs", [True, False])
def test_auto_uses_triton_exactly_where_it_can_run(monkeypatch, triton_runs):
    calls = []
    monkeypatch.setattr(conv_module, "triton_can_run_on", lambda device: triton_runs)
    # Each stand-in returns the query as the output, which the layer hands back in the query's dtype.
    monkeypatch.setattr(conv_module, "attention_on_checked_inputs", lambda *a, **k: calls.append("triton") or a[0])
    monkeypatch.setattr(
        conv_module, "reference_graph_transformer_attention", lambda *a, **k: calls.append("pyg") or a[0]
    )
    _call(make_conv(8, backend="auto"), make_graph("decoder_like", seed=13))
    assert calls == (["triton"] if triton_runs else ["pyg"])


@pytest.mark.skipif(HAS_CUDA, reason="CPU tensors without the interpreter")
def test_cpu_without_interpreter(monkeypatch, count_layout_builds):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    graph = make_graph("decoder_like", seed=14)
    with pytest.raises(RuntimeError, match="backend='triton'.*TRITON_INTERPRET"):
        _call(make_conv(8, backend="triton"), graph)
    assert count_layout_builds == []
    out, inputs = _call(make_conv(8, backend="auto"), graph)  # falls back to PyG
    torch.testing.assert_close(out, _pyg_on(graph, graph.edge_index, inputs), rtol=0, atol=0)


def test_backend_and_channels_are_checked():
    with pytest.raises(ValueError, match="backend must be one of"):
        GraphTransformerConv(8, backend="cuda")
    for bad in (0, -3, 8.0, True):
        with pytest.raises(ValueError, match="out_channels must be a positive int"):
            GraphTransformerConv(bad)


def test_extra_repr():
    assert "out_channels=8, qk_norm='rms', backend='pyg'" in repr(GraphTransformerConv(8, qk_norm=True, backend="pyg"))
    assert GraphTransformerConv(4).extra_repr() == "out_channels=4, qk_norm=False, backend='auto'"


# --- input checks --------------------------------------------------------------------------------------------


def _bad_calls():
    """(description, change to the valid call's kwargs, exception type, message fragment)."""
    meta = torch.device("meta")

    def set_(**changes):
        return lambda kw: kw.update({k: f(kw) for k, f in changes.items()})

    return [
        ("query rank", set_(query=lambda kw: kw["query"][0]), ValueError, "query must have shape"),
        ("key rank", set_(key=lambda kw: kw["key"][None]), ValueError, "key must have shape"),
        ("edge_attr rank", set_(edge_attr=lambda kw: kw["edge_attr"][:, 0]), ValueError, "edge_attr must have shape"),
        ("value type", set_(value=lambda kw: kw["value"].tolist()), TypeError, "value must be a torch.Tensor"),
        ("integer query", set_(query=lambda kw: kw["query"].long()), TypeError, "query must be a floating"),
        ("key heads", set_(key=lambda kw: kw["key"][:, :1]), ValueError, "key has 1 heads x 8 channels"),
        ("value channels", set_(value=lambda kw: kw["value"][..., :4]), ValueError, "value has 2 heads x 4"),
        ("edge_attr heads", set_(edge_attr=lambda kw: kw["edge_attr"][:, :1]), ValueError, "edge_attr has 1 heads"),
        (
            "channels != out_channels",
            lambda kw: kw.update({k: kw[k][..., :4] for k in ("query", "key", "value", "edge_attr")}),
            ValueError,
            "4 channels per head, but out_channels=8",
        ),
        ("key/value nodes", set_(value=lambda kw: kw["value"][1:]), ValueError, "key has .* nodes, value has"),
        ("edge_attr rows", set_(edge_attr=lambda kw: kw["edge_attr"][1:]), ValueError, "edge_attr has .* rows"),
        ("key device", set_(key=lambda kw: kw["key"].to(meta)), ValueError, "key is on meta"),
        (
            "edge_index device",
            set_(edge_index=lambda kw: kw["edge_index"].to(meta)),
            ValueError,
            "edge_index is on meta",
        ),
        (
            "edge_index type",
            set_(edge_index=lambda kw: kw["edge_index"].tolist()),
            TypeError,
            "edge_index must be a torch.Tensor",
        ),
        (
            "edge_index rank",
            set_(edge_index=lambda kw: kw["edge_index"][0]),
            ValueError,
            r"edge_index must have shape \[2, num_edges\]",
        ),
        (
            "edge_index rows",
            set_(edge_index=lambda kw: kw["edge_index"].repeat(2, 1)),
            ValueError,
            r"edge_index must have shape \[2, num_edges\]",
        ),
        (
            "edge_index dtype",
            set_(edge_index=lambda kw: kw["edge_index"].float()),
            TypeError,
            "edge_index must be int64 or int32",
        ),
        ("missing size", set_(size=lambda kw: None), ValueError, r"pass size=\(num_src, num_dst\)"),
        ("size length", set_(size=lambda kw: (3,)), ValueError, "size must be"),
        ("size type", set_(size=lambda kw: (1.5, 2)), ValueError, "size must hold two ints"),
        (
            "size sources",
            set_(size=lambda kw: (kw["size"][0] + 1, kw["size"][1])),
            ValueError,
            "source nodes, key and value have",
        ),
        (
            "size destinations",
            set_(size=lambda kw: (kw["size"][0], kw["size"][1] - 1)),
            ValueError,
            "destination nodes, query has",
        ),
        (
            "source index too large",
            set_(edge_index=lambda kw: _with(kw["edge_index"], 0, kw["size"][0])),
            ValueError,
            r"edge_index\[0\] \(source\) holds index",
        ),
        (
            "destination index too large",
            set_(edge_index=lambda kw: _with(kw["edge_index"], 1, kw["size"][1])),
            ValueError,
            r"edge_index\[1\] \(destination\) holds index",
        ),
        ("negative index", set_(edge_index=lambda kw: _with(kw["edge_index"], 1, -1)), ValueError, "negative"),
    ]


def _with(edge_index, row, value):
    edge_index = edge_index.clone()
    edge_index[row, 0] = value
    return edge_index


@pytest.mark.parametrize("backend", ["triton", "pyg"])
@pytest.mark.parametrize("case", _bad_calls(), ids=lambda c: c[0])
def test_bad_input_raises_before_any_work(case, backend, monkeypatch):
    _, change, exc, fragment = case
    graph = make_graph("encoder_like", seed=15)  # bipartite: size is needed
    inputs = make_inputs(graph, 2, 8, dtype=torch.float32, device=DEVICE)
    kwargs = dict(inputs, edge_index=graph.edge_index.to(DEVICE), size=(graph.num_src, graph.num_dst))
    change(kwargs)
    work = []
    monkeypatch.setattr(conv_module, "attention_on_checked_inputs", lambda *a, **k: work.append("triton"))
    monkeypatch.setattr(conv_module, "reference_graph_transformer_attention", lambda *a, **k: work.append("pyg"))
    with pytest.raises(exc, match=fragment):
        make_conv(8, backend=backend)(**kwargs)
    assert work == []


DTYPE_CASES = ["query", "edge_attr", "q_norm.weight", "lin_edge.weight"]


def _conv_and_inputs_with(what, dtype, backend):
    """A conv and float32 inputs on DEVICE, the input or parameter ``what`` in ``dtype``."""
    graph = make_graph("encoder_like", seed=15)
    lin_edge = what == "lin_edge.weight"
    conv = make_projection_conv(8, 2, 3, backend=backend) if lin_edge else make_conv(8, backend=backend)
    inputs = projection_inputs(graph, 2, 8, 3) if lin_edge else make_inputs(graph, 2, 8)
    inputs = {k: v.to(DEVICE, torch.float32) for k, v in inputs.items() if v is not None}
    if what in inputs:
        inputs[what] = inputs[what].to(dtype)
    else:
        conv.get_parameter(what).data = conv.get_parameter(what).data.to(dtype)
    return conv, inputs, graph


# What runs in float64 in each case: tensors of the inputs, and modules of the layer (lin_edge with its raw
# attributes, as a float64 model holds them).
FLOAT64_CASES = {"query": (["query"], []), "edge_attr": (["edge_attr"], []), "q_norm": ([], ["q_norm"])}
FLOAT64_CASES["lin_edge"] = (["edge_attr"], ["lin_edge"])


@pytest.mark.parametrize("case", sorted(FLOAT64_CASES))
def test_dtype_float64_runs_on_every_backend(case):
    """One dtype rule for both backends. The Triton backend hands float64 tensors to the kernels as float32
    copies; output and gradients come back in their own dtypes, within float32 rounding of the PyG backend's."""
    tensors, modules = FLOAT64_CASES[case]
    graph = make_graph("encoder_like", seed=15)
    inputs = projection_inputs(graph, 2, 8, 3) if case == "lin_edge" else make_inputs(graph, 2, 8)
    inputs = {
        k: v.to(DEVICE, torch.float64 if k in tensors else torch.float32) for k, v in inputs.items() if v is not None
    }
    grad_out = torch.randn(graph.num_dst, 2, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    results = {}
    for backend in ("triton", "pyg"):
        conv = make_projection_conv(8, 2, 3, backend=backend) if case == "lin_edge" else make_conv(8, backend=backend)
        for module in modules:
            getattr(conv, module).double()
        results[backend] = run_conv(conv, inputs, graph, grad_out)
    (out, grads), (ref_out, ref_grads) = results["triton"], results["pyg"]
    assert out.dtype == ref_out.dtype == inputs["query"].dtype
    assert rel_error(out, ref_out) < TOLERANCE
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        float64 = name in tensors or name.split(".")[0] in modules
        assert grads[name].dtype == ref_grads[name].dtype == (torch.float64 if float64 else torch.float32), name
        assert grad_error(name, grads, ref_grads) < TOLERANCE, name


@pytest.mark.parametrize("backend", ["triton", "pyg"])
@pytest.mark.parametrize("what", DTYPE_CASES)
def test_other_dtypes_raise_the_same_error_on_every_backend(what, backend, monkeypatch):
    conv, inputs, graph = _conv_and_inputs_with(what, torch.float8_e4m3fn, backend)
    monkeypatch.setattr(conv_module, "attention_on_checked_inputs", lambda *a, **k: pytest.fail("ran the op"))
    monkeypatch.setattr(conv_module, "reference_graph_transformer_attention", lambda *a, **k: pytest.fail("ran PyG"))
    message = f"^{what} must be float16, bfloat16, float32 or float64, got torch.float8_e4m3fn$"
    with pytest.raises(TypeError, match=message):
        run_conv(conv, inputs, graph)


def test_norm_weights_on_another_device_raise():
    graph = make_graph("decoder_like", seed=16)
    conv = make_conv(8, backend="pyg")
    conv.k_norm.to("meta")
    with pytest.raises(ValueError, match="k_norm.weight is on meta"):
        _call(conv, graph)


# --- norms: the caller's modules, LayerNorm, eps ---------------------------------------------------------------


def _norm_modules():
    """(id, factory of one norm module for C channels): every kind the layer fuses, and one it does not."""
    from anemoi.models.layers.normalization import AutocastLayerNorm

    return [
        ("torch_rms", lambda c: torch.nn.RMSNorm(c, eps=1e-5)),
        ("torch_rms_no_weight", lambda c: torch.nn.RMSNorm(c, elementwise_affine=False)),
        ("gtnorm_rms", lambda c: gtnorm.RMSNorm(c, eps=2e-6)),
        ("layer", lambda c: torch.nn.LayerNorm(c)),
        ("layer_no_bias", lambda c: torch.nn.LayerNorm(c, bias=False, eps=1e-4)),
        ("layer_no_affine", lambda c: torch.nn.LayerNorm(c, elementwise_affine=False)),
        ("anemoi_autocast_layer_norm", lambda c: AutocastLayerNorm(c, bias=False)),
    ]


@pytest.mark.parametrize("case", _norm_modules(), ids=lambda c: c[0])
def test_caller_modules_are_fused_and_match_pyg(case, monkeypatch):
    """The caller's modules stay its submodules (same state_dict keys), run inside the kernels (no unfused
    call of the module), and give what the PyG backend gives with the same modules."""
    _, factory = case
    graph = make_graph("encoder_like", seed=20)
    inputs = make_inputs(graph, 2, 8)
    conv = make_conv(8, backend="triton", q_norm=factory(8), k_norm=factory(8), seed=3)
    reference = make_conv(8, backend="pyg", q_norm=factory(8), k_norm=factory(8), dtype=torch.float64, device="cpu")
    reference.load_state_dict(conv.state_dict())
    parameters = [name for name, _ in factory(8).named_parameters()]
    assert set(conv.state_dict()) == {f"{norm}.{p}" for norm in ("q_norm", "k_norm") for p in parameters}
    for norm in (conv.q_norm, conv.k_norm):
        monkeypatch.setattr(norm, "forward", lambda x: pytest.fail("the norm module was applied unfused"))
    with warnings_as_errors():
        assert_same_function(conv, reference, graph, inputs)


@contextlib.contextmanager
def warnings_as_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


class ScaledTanhNorm(torch.nn.Module):
    """A norm the kernels do not know: applied unfused."""

    def __init__(self, channels):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(channels))

    def forward(self, x):
        return torch.tanh(x) * self.scale


@pytest.mark.parametrize(
    "norms",
    [
        ("unknown", lambda c: (ScaledTanhNorm(c), ScaledTanhNorm(c))),
        ("mixed_kinds", lambda c: (torch.nn.LayerNorm(c), torch.nn.RMSNorm(c))),
        ("other_shape", lambda c: (torch.nn.LayerNorm((2, c)), torch.nn.LayerNorm((2, c)))),
        ("query_only", lambda c: (torch.nn.LayerNorm(c), None)),
    ],
    ids=lambda n: n[0],
)
@pytest.mark.parametrize("backend", ["triton", "pyg"])
def test_other_modules_are_applied_unfused_with_one_warning(norms, backend):
    _, factory = norms
    graph = make_graph("decoder_like", seed=21)
    inputs = make_inputs(graph, 2, 8)
    q_norm, k_norm = factory(8)
    conv = make_conv(8, backend=backend, q_norm=q_norm, k_norm=k_norm, seed=4)
    reference = copy.deepcopy(conv).to(device="cpu", dtype=torch.float64)
    reference.backend = "pyg"
    if backend == "triton":
        with pytest.warns(UserWarning, match="applied before the Triton kernels"):
            assert_same_function(conv, reference, graph, inputs)
        with warnings_as_errors():  # once per module
            run_conv(conv, {k: v.to(DEVICE, torch.float32) for k, v in inputs.items()}, graph)
    else:
        with warnings_as_errors():  # the PyG backend fuses nothing: nothing to say
            assert_same_function(conv, reference, graph, inputs)


@pytest.mark.parametrize("backend", ["triton", "pyg"])
def test_layer_norm_option(backend):
    conv = GraphTransformerConv(8, qk_norm="layer", backend=backend)
    assert type(conv.q_norm) is torch.nn.LayerNorm and conv.q_norm.eps == 1e-5
    assert set(conv.state_dict()) == {"q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias"}
    assert GraphTransformerConv(8, qk_norm="layer", eps=1e-3).k_norm.eps == 1e-3
    graph = make_graph("processor_like", seed=22)
    conv = make_conv(8, qk_norm="layer", backend=backend, eps=None, seed=5)
    reference = make_conv(8, qk_norm="layer", backend="pyg", eps=None, dtype=torch.float64, device="cpu", seed=5)
    assert_same_function(conv, reference, graph, make_inputs(graph, 2, 8))


def test_separate_eps_of_caller_modules():
    graph = make_graph("encoder_like", seed=23)
    inputs = make_inputs(graph, 2, 8)
    inputs["query"], inputs["key"] = 0.2 * inputs["query"], 0.5 * inputs["key"]
    norms = dict(q_norm=torch.nn.LayerNorm(8, eps=0.05), k_norm=torch.nn.LayerNorm(8, eps=0.4))
    conv = make_conv(8, backend="triton", **copy.deepcopy(norms))
    reference = make_conv(8, backend="pyg", dtype=torch.float64, device="cpu", **norms)
    assert_same_function(conv, reference, graph, inputs)


@pytest.mark.parametrize("backend", ["triton", "pyg"])
@pytest.mark.parametrize("qk_norm", [True, "layer"])
def test_mixed_operand_dtypes(backend, qk_norm):
    """As autocast leaves them: fp16 q, k, v, fp32 edge features and parameters. Output in the query's dtype,
    gradients in each input's dtype, values within fp16 rounding of the float64 result on the same values."""
    graph = make_graph("encoder_like", seed=24)
    inputs = make_inputs(graph, 2, 16)
    dtypes = {"query": torch.float16, "key": torch.float16, "value": torch.bfloat16, "edge_attr": torch.float32}
    rounded = {k: v.to(dtypes[k]).double() for k, v in inputs.items()}
    grad_out = torch.randn(graph.num_dst, 2, 16, dtype=torch.float64).half().double()
    reference = make_conv(16, qk_norm=qk_norm, backend="pyg", dtype=torch.float64, device="cpu")
    ref_out, ref_grads = run_conv(reference, rounded, graph, grad_out)
    conv = make_conv(16, qk_norm=qk_norm, backend=backend)
    out, grads = run_conv(conv, {k: v.to(DEVICE, dtypes[k]) for k, v in rounded.items()}, graph, grad_out)
    assert out.dtype == torch.float16
    assert rel_error(out, ref_out) < 1e-2
    for name, grad in grads.items():
        assert grad.dtype == dtypes.get(name, torch.float32), name
        assert grad_error(name, grads, ref_grads) < 3e-2, name


@pytest.mark.skipif(HAS_CUDA, reason="CPU autocast of the PyG path")
def test_cpu_autocast_with_anemoi_norms():
    """Under CPU autocast (bf16 linear layers) an Anemoi-style block hands the layer bf16 q, k, v and fp32 edge
    features: accepted, result in bf16, close to the fp32 result."""
    from anemoi.models.layers.normalization import AutocastLayerNorm

    graph = make_graph("decoder_like", seed=25)
    inputs = make_inputs(graph, 2, 16, dtype=torch.float32)
    projection = torch.nn.Linear(16, 16)
    norms = {name: AutocastLayerNorm(16, bias=False) for name in ("q_norm", "k_norm")}
    conv = make_conv(16, backend="auto", **norms)
    size = (graph.num_src, graph.num_dst)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = (projection(inputs[n]) for n in ("query", "key", "value"))
        assert q.dtype == torch.bfloat16
        out = conv(q, k, v, inputs["edge_attr"], graph.edge_index, size=size)
    expected = conv(*(projection(inputs[n]) for n in ("query", "key", "value")), inputs["edge_attr"],
                    graph.edge_index, size=size)  # fmt: skip
    assert out.dtype == torch.bfloat16
    assert rel_error(out, expected) < 3e-2


def test_positional_options_are_refused_with_a_hint():
    with pytest.raises(TypeError, match="only out_channels .* is positional.*not PyG's"):
        GraphTransformerConv(16, 64)
    with pytest.raises(TypeError, match="positional"):
        GraphTransformerConv(16, True)


def test_norm_options_are_checked():
    with pytest.raises(ValueError, match="qk_norm must be False, True, 'rms' or 'layer'"):
        GraphTransformerConv(8, qk_norm="batch")
    with pytest.raises(ValueError, match="not both"):
        GraphTransformerConv(8, qk_norm=True, q_norm=torch.nn.RMSNorm(8), k_norm=torch.nn.RMSNorm(8))
    with pytest.raises(ValueError, match="not both"):
        GraphTransformerConv(8, eps=1e-3, q_norm=torch.nn.RMSNorm(8), k_norm=torch.nn.RMSNorm(8))
    with pytest.raises(TypeError, match="q_norm must be a torch.nn.Module"):
        GraphTransformerConv(8, q_norm=torch.ones(8))
    for qk_norm in (True, "layer"):
        with pytest.raises(ValueError, match="eps must be non-negative"):
            GraphTransformerConv(8, qk_norm=qk_norm, eps=-1e-6)


@pytest.mark.parametrize("backend", ["triton", "pyg"])
@pytest.mark.parametrize("module", ["torch_rms", "layer", "gtnorm_rms"])
def test_negative_eps_is_refused_on_every_path(backend, module):
    """eps set after construction (torch's modules take any eps): refused before any work on both backends."""
    factory = dict(_norm_modules())[module]
    conv = make_conv(8, backend=backend, q_norm=factory(8), k_norm=factory(8))
    conv.k_norm.eps = -1e-3
    with pytest.raises(ValueError, match="eps must be non-negative"):
        _call(conv, make_graph("decoder_like", seed=26))


def test_reset_parameters():
    conv = make_conv(8, qk_norm="layer", backend="pyg", seed=6)
    assert not torch.equal(conv.q_norm.weight, torch.ones(8, device=DEVICE))
    conv.reset_parameters()
    for norm in (conv.q_norm, conv.k_norm):
        assert torch.equal(norm.weight, torch.ones(8, device=DEVICE))
        assert torch.equal(norm.bias, torch.zeros(8, device=DEVICE))
    GraphTransformerConv(8).reset_parameters()  # no norms: nothing to do


# --- the edge projection (lin_edge) --------------------------------------------------------------------------


class ScaledLinear(torch.nn.Linear):
    """A Linear whose forward differs from torch.nn.Linear's: applied before the kernels, not fused."""

    def forward(self, x):
        return 2.0 * super().forward(x)


def make_projection_conv(channels, heads, edge_dim, *, bias=True, linear=torch.nn.Linear, backend="triton"):
    conv = GraphTransformerConv(
        channels, backend=backend, q_norm=torch.nn.LayerNorm(channels), k_norm=torch.nn.LayerNorm(channels),
        lin_edge=linear(edge_dim, heads * channels, bias=bias),
    )  # fmt: skip
    randomize_norm_parameters(conv, seed=5)
    with torch.no_grad():  # e of the size of k and v
        conv.lin_edge.weight.mul_(1.0 / edge_dim)
    return conv.to(DEVICE)


def projection_inputs(graph, heads, channels, edge_dim):
    inputs = make_inputs(graph, heads, channels, edge_attr=False)
    inputs["edge_attr"] = torch.randn(graph.edge_index.shape[1], edge_dim, dtype=torch.float64)
    return inputs


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("linear", [torch.nn.Linear, ScaledLinear], ids=["linear", "subclass"])
def test_lin_edge_backends_match(bias, linear):
    """Raw edge attributes [M, D] through the caller's Linear: fused into the kernels (a torch.nn.Linear) or
    applied before them (a subclass with its own forward, warned once), the same function as the PyG backend;
    gradients reach lin_edge.weight, lin_edge.bias and the raw attributes."""
    graph = make_graph("encoder_like", seed=3)
    inputs = projection_inputs(graph, 3, 5, 4)
    conv = make_projection_conv(5, 3, 4, bias=bias, linear=linear)
    reference = copy.deepcopy(conv).to(device="cpu", dtype=torch.float64)
    reference.backend = "pyg"
    context = pytest.warns(UserWarning, match="lin_edge") if linear is ScaledLinear else warnings_as_errors()
    with context:
        assert_same_function(conv, reference, graph, inputs)
    with warnings_as_errors():  # once per module
        run_conv(conv, {k: v.to(DEVICE, torch.float32) for k, v in inputs.items() if v is not None}, graph)


def test_wide_lin_edge_runs_before_the_kernels():
    """More raw attributes than the fused projection takes (MAX_EDGE_FEATURES): lin_edge runs as a matmul, the
    same function as the PyG backend, without a warning."""
    edge_dim = MAX_EDGE_FEATURES + 3
    graph = make_graph("encoder_like", seed=6)
    conv = make_projection_conv(4, 2, edge_dim)
    reference = copy.deepcopy(conv).to(device="cpu", dtype=torch.float64)
    reference.backend = "pyg"
    with warnings_as_errors():
        assert_same_function(conv, reference, graph, projection_inputs(graph, 2, 4, edge_dim))


def test_lin_edge_is_fused(monkeypatch):
    """A torch.nn.Linear is not applied as a module on the Triton backend: the kernels take its parameters."""
    graph = make_graph("decoder_like", seed=4)
    conv = make_projection_conv(8, 2, 3)
    monkeypatch.setattr(conv.lin_edge, "forward", lambda x: pytest.fail("lin_edge applied unfused"))
    inputs = {k: v.to(DEVICE, torch.float32) for k, v in projection_inputs(graph, 2, 8, 3).items() if v is not None}
    out, _ = run_conv(conv, inputs, graph)
    assert out.shape == (graph.num_dst, 2, 8)


def test_lin_edge_state_dict_keys():
    conv = GraphTransformerConv(8, qk_norm=True, lin_edge=torch.nn.Linear(3, 16))
    assert set(conv.state_dict()) == {"q_norm.weight", "k_norm.weight", "lin_edge.weight", "lin_edge.bias"}


@pytest.mark.parametrize("backend", ["triton", "pyg"])
@pytest.mark.parametrize(
    "case",
    [
        ("no edge_attr", lambda inputs: inputs.update(edge_attr=None), TypeError, "raw edge attributes"),
        ("wrong D", lambda inputs: inputs.update(edge_attr=inputs["edge_attr"][:, :2]), ValueError, "in_features"),
        ("rank 3", lambda inputs: inputs.update(edge_attr=inputs["edge_attr"][..., None]), ValueError,
         "in_features"),
        ("out_features", lambda inputs: inputs.update(query=inputs["query"][:, :1], key=inputs["key"][:, :1],
         value=inputs["value"][:, :1]), ValueError, "lin_edge.out_features"),
    ],
    ids=lambda c: c[0],
)  # fmt: skip
def test_lin_edge_inputs_are_checked(case, backend):
    _, change, exc, fragment = case
    graph = make_graph("decoder_like", seed=4)
    conv = make_projection_conv(8, 2, 3, backend=backend)
    inputs = {k: v.to(DEVICE, torch.float32) for k, v in projection_inputs(graph, 2, 8, 3).items() if v is not None}
    change(inputs)
    with pytest.raises(exc, match=fragment):
        conv(
            inputs["query"],
            inputs["key"],
            inputs["value"],
            inputs["edge_attr"],
            graph.edge_index.to(DEVICE),
            size=(graph.num_src, graph.num_dst),
        )
    with pytest.raises(TypeError, match="lin_edge must be a torch.nn.Linear"):
        GraphTransformerConv(8, lin_edge=torch.nn.Identity())


def test_compiled_conv_does_not_compile_once_per_graph_size():
    """A compiled layer that meets graphs of new sizes (each mapper chunk has its own number of sources) compiles
    a second, size-generic graph and then no more: the sizes it is handed stay symbolic (they were once turned
    into ints, which made each size a new graph until torch's recompile limit sent the layer back to eager)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    conv = make_conv(8, qk_norm="layer")
    counter = CompileCounter()
    compiled = torch.compile(conv, backend=counter)
    outputs = []
    for num_src in (5, 7, 9, 11):
        dst = torch.arange(4).repeat_interleave(3)
        graph = SmallGraph("ring", torch.stack([(dst + torch.arange(12) % 3) % num_src, dst]), num_src, 4)
        inputs = make_inputs(graph, 2, 8, dtype=torch.float32, device=DEVICE)
        outputs.append((compiled(inputs["query"], inputs["key"], inputs["value"], inputs["edge_attr"],
                                 graph.edge_index.to(DEVICE), size=(num_src, 4)), conv, inputs, graph))  # fmt: skip
    assert counter.frame_count == 2, f"{counter.frame_count} compiled graphs for 4 graph sizes"
    for out, module, inputs, graph in outputs:  # and each compiled call is the layer's own result
        expected = run_conv(module, inputs, graph)[0]
        torch.testing.assert_close(out, expected)
    torch._dynamo.reset()
