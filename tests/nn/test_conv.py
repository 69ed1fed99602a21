"""GraphTransformerConv: both backends against each other, state_dict, layout cache, backend choice, checks.

Tolerances: the Triton backend in float32 against the PyG backend run in float64 on the same inputs and
parameters, relative Frobenius error < 1e-5 for the output and every gradient (query, key, value, edge_attr,
q_norm.weight, k_norm.weight); the PyG backend in float32 meets the same bound. On the CPU the Triton backend
runs through the interpreter (tests/conftest.py sets TRITON_INTERPRET=1), so graphs stay small.
"""

from __future__ import annotations

import copy
import itertools
import pickle

import pytest
import torch

import gtnorm
import gtnorm.nn.conv as conv_module
from gtnorm.nn.conv import GraphTransformerConv, LayoutCache, clear_layout_cache
from gtnorm.triton.layout import GraphLayout
from tests.conftest import DEVICE, HAS_CUDA
from tests.graphs import GRAPH_BUILDERS, SmallGraph, make_graph, random_inputs, rel_error

EPS = 1e-6
TOLERANCE = 1e-5
HEADS_CHANNELS = [(2, 8), (3, 5)] + ([(16, 64)] if HAS_CUDA else [])


@pytest.fixture(autouse=True)
def empty_layout_cache():
    clear_layout_cache()
    yield
    clear_layout_cache()


@pytest.fixture
def count_layout_builds(monkeypatch):
    """Counts GraphLayout builds made by the conv's cache."""
    builds = []
    original = GraphLayout.from_edge_index

    def counting(edge_index, num_nodes=None):
        builds.append((edge_index.shape[1], tuple(num_nodes)))
        return original(edge_index, num_nodes)

    monkeypatch.setattr(conv_module.GraphLayout, "from_edge_index", staticmethod(counting))
    return builds


def make_conv(channels, qk_norm=True, backend="auto", eps=EPS, dtype=torch.float32, device=DEVICE, seed=0):
    """A conv whose norm weights are far from their all-ones initialisation, so that they matter."""
    conv = GraphTransformerConv(channels, qk_norm=qk_norm, eps=eps, backend=backend)
    if qk_norm:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for norm in (conv.q_norm, conv.k_norm):
                norm.weight.copy_(1.0 + 0.5 * torch.randn(channels, generator=generator, dtype=torch.float64))
    return conv.to(device=device, dtype=dtype)


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



# --- the two backends compute the same function --------------------------------------------------------------


def _backend_cases():
    """(graph, (H, C), qk_norm, edge_attr). On the CPU (interpreter, ~1 s per fwd+bwd) a covering selection:
    every graph, both shapes, with and without norm and edge features; graph-by-graph breadth of the kernels
    themselves is tests/triton's job. On a GPU the full product."""
    if HAS_CUDA:
        return list(itertools.product(GRAPH_BUILDERS, HEADS_CHANNELS, [True, False], [True, False]))
    return [
        ("random_bipartite", (2, 8), True, True),
        ("random_bipartite", (3, 5), False, False),
        ("encoder_like", (3, 5), True, True),
        ("encoder_like", (2, 8), True, False),
        ("decoder_like", (2, 8), False, True),
        ("decoder_like", (3, 5), True, True),
        ("processor_like", (3, 5), True, False),
        ("processor_like", (2, 8), True, True),
    ]


def _case_id(case):
    graph_name, (heads, channels), qk_norm, edge_attr = case
    norm = "qk_norm" if qk_norm else "no_norm"
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
            assert rel_error(grad, ref_grads[name]) < TOLERANCE, (backend, name)


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
        assert grad.dtype == (torch.float32 if name.endswith("weight") else torch.bfloat16), name
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


# --- layout cache --------------------------------------------------------------------------------------------


def _call(conv, graph, edge_index=None, heads=2, channels=8):
    inputs = make_inputs(graph, heads, channels, dtype=torch.float32, device=DEVICE)
    edge_index = graph.edge_index.to(DEVICE) if edge_index is None else edge_index
    return conv(inputs["query"], inputs["key"], inputs["value"], inputs["edge_attr"], edge_index,
                size=(graph.num_src, graph.num_dst)), inputs  # fmt: skip


def _pyg_on(graph, edge_index, inputs):
    """The PyG backend's answer for the graph edge_index describes now."""
    return make_conv(8, backend="pyg")(inputs["query"], inputs["key"], inputs["value"], inputs["edge_attr"],
                                       edge_index, size=(graph.num_src, graph.num_dst))  # fmt: skip


def test_same_edge_index_builds_once(count_layout_builds):
    graph = make_graph("random_bipartite", seed=5)
    edge_index = graph.edge_index.to(DEVICE)
    conv = make_conv(8, backend="triton")
    for _ in range(3):
        _call(conv, graph, edge_index)
    # Another module on the same graph (a processor's next block) shares the layout.
    _call(make_conv(8, backend="triton", seed=1), graph, edge_index)
    # So does a view of the same memory (same data_ptr, shape and strides).
    _call(conv, graph, edge_index[:, :])
    assert len(count_layout_builds) == 1


def test_in_place_write_rebuilds(count_layout_builds):
    graph = make_graph("processor_like", seed=6)
    edge_index = graph.edge_index.clone().to(DEVICE)
    conv = make_conv(8, backend="triton")
    _call(conv, graph, edge_index)
    edge_index[1, :5] = (edge_index[1, :5] + 1) % graph.num_dst  # same memory, new graph
    out, inputs = _call(conv, graph, edge_index)
    assert len(count_layout_builds) == 2
    torch.testing.assert_close(out, _pyg_on(graph, edge_index, inputs), rtol=1e-5, atol=1e-5)
    # A write through a view bumps the shared version counter too.
    edge_index[0].fill_(0)
    out, inputs = _call(conv, graph, edge_index)
    assert len(count_layout_builds) == 3
    torch.testing.assert_close(out, _pyg_on(graph, edge_index, inputs), rtol=1e-5, atol=1e-5)


def test_different_graphs_each_keep_their_layout(count_layout_builds):
    encoder, decoder = make_graph("encoder_like", seed=7), make_graph("decoder_like", seed=7)
    encoder_edges, decoder_edges = encoder.edge_index.to(DEVICE), decoder.edge_index.to(DEVICE)
    conv = make_conv(8, backend="triton")
    for _ in range(2):
        _call(conv, encoder, encoder_edges)
        out, inputs = _call(conv, decoder, decoder_edges)
    assert len(count_layout_builds) == 2
    torch.testing.assert_close(out, _pyg_on(decoder, decoder_edges, inputs), rtol=1e-5, atol=1e-5)
    # Equal values in another tensor are another graph as far as the cache knows: rebuilt, not compared.
    _call(conv, encoder, encoder_edges.clone())
    assert len(count_layout_builds) == 3


def test_same_memory_with_other_strides_rebuilds(count_layout_builds):
    num_nodes = 30
    memory = (torch.arange(2 * num_nodes) * 7 % num_nodes).to(DEVICE)
    by_rows = memory.view(2, num_nodes)  # sources are the first half of memory
    interleaved = memory.view(num_nodes, 2).t()  # same memory and shape, sources at even positions
    assert by_rows.data_ptr() == interleaved.data_ptr() and by_rows.shape == interleaved.shape
    graph = SmallGraph("square", by_rows.cpu(), num_nodes, num_nodes)
    conv = make_conv(8, backend="triton")
    _call(conv, graph, by_rows)
    out, inputs = _call(conv, graph, interleaved)
    assert len(count_layout_builds) == 2
    torch.testing.assert_close(out, _pyg_on(graph, interleaved, inputs), rtol=1e-5, atol=1e-5)


def test_other_node_counts_rebuild(count_layout_builds):
    graph = make_graph("random_bipartite", seed=8)
    edge_index = graph.edge_index.to(DEVICE)
    conv = make_conv(8, backend="triton")
    _call(conv, graph, edge_index)
    bigger = SmallGraph("bigger", graph.edge_index, graph.num_src + 2, graph.num_dst + 3)
    out, _ = _call(conv, bigger, edge_index)
    assert len(count_layout_builds) == 2 and out.shape[0] == graph.num_dst + 3


def test_dead_edge_index_is_never_hit(count_layout_builds):
    """A new graph may be allocated where a freed one was (same data_ptr, shape, version 0): it must not be
    served the freed graph's layout, and the dead entry's memory is released."""
    graph = make_graph("processor_like", seed=9)
    conv = make_conv(8, backend="triton")
    cache = conv_module._LAYOUT_CACHE
    _call(conv, graph, graph.edge_index.clone().to(DEVICE))  # the edge_index dies after the call
    assert len(count_layout_builds) == 1
    for _ in range(3):
        shuffled = graph.edge_index[:, torch.randperm(graph.edge_index.shape[1])].to(DEVICE)
        out, inputs = _call(conv, graph, shuffled)
        torch.testing.assert_close(out, _pyg_on(graph, shuffled, inputs), rtol=1e-5, atol=1e-5)
        del shuffled
    assert len(count_layout_builds) == 4
    _call(conv, graph, graph.edge_index.to(DEVICE))
    assert len(cache) == 1  # dead entries were dropped


def test_least_recently_used_layout_is_evicted(count_layout_builds):
    cache = LayoutCache(max_entries=2)
    graphs = [make_graph("decoder_like", seed=s) for s in range(3)]
    for g in graphs + graphs[1:]:
        cache.get(g.edge_index, g.num_src, g.num_dst)
    assert len(count_layout_builds) == 3 and len(cache) == 2
    cache.get(graphs[0].edge_index, graphs[0].num_src, graphs[0].num_dst)
    assert len(count_layout_builds) == 4


def test_inference_tensors_are_not_cached(count_layout_builds):
    graph = make_graph("decoder_like", seed=10)
    conv = make_conv(8, backend="triton")
    with torch.inference_mode():
        edge_index = graph.edge_index.to(DEVICE) + 0  # an inference tensor: no version counter
        out, inputs = _call(conv, graph, edge_index)
        _call(conv, graph, edge_index)
        expected = _pyg_on(graph, edge_index, inputs)
    assert len(count_layout_builds) == 2
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_pyg_backend_builds_no_layout(count_layout_builds):
    graph = make_graph("decoder_like", seed=11)
    _call(make_conv(8, backend="pyg"), graph)
    assert count_layout_builds == []


def test_torch_compile_sees_a_mutated_edge_index():
    """Under torch.compile the cache lookup runs eagerly (a graph break), so it still sees in-place writes."""
    graph = make_graph("processor_like", seed=18)
    edge_index = graph.edge_index.clone().to(DEVICE)
    inputs = make_inputs(graph, 2, 8, dtype=torch.float32, device=DEVICE)
    args = (inputs["query"], inputs["key"], inputs["value"], inputs["edge_attr"])
    compiled = torch.compile(make_conv(8, backend="triton"), backend="aot_eager")
    for _ in range(2):
        torch.testing.assert_close(compiled(*args, edge_index), _pyg_on(graph, edge_index, inputs), rtol=1e-5,
                                   atol=1e-5)  # fmt: skip
        edge_index[1, :10] = (edge_index[1, :10] + 3) % graph.num_dst


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
    monkeypatch.setattr(conv_module, "graph_transformer_attention", lambda *a, **k: calls.append("triton"))
    monkeypatch.setattr(
        conv_module, "reference_graph_transformer_attention", lambda *a, **k: calls.append("pyg") or a[0]
    )
    _call(make_conv(8, backend="auto"), make_graph("decoder_like", seed=13))
    assert calls == (["triton"] if triton_runs else ["pyg"])


@pytest.mark.skipif(HAS_CUDA, reason="CPU tensors without the interpreter")
def test_cpu_without_interpreter(monkeypatch, count_layout_builds):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    graph = make_graph("decoder_like", seed=14)
    with pytest.raises(RuntimeError, match="backend='triton'.*TRITON_INTERPRET=1"):
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
    monkeypatch.setattr(conv_module, "graph_transformer_attention", lambda *a, **k: work.append("triton"))
    monkeypatch.setattr(conv_module, "reference_graph_transformer_attention", lambda *a, **k: work.append("pyg"))
    with pytest.raises(exc, match=fragment):
        make_conv(8, backend=backend)(**kwargs)
    assert work == []


def test_norm_weights_on_another_device_raise():
    graph = make_graph("decoder_like", seed=16)
    conv = make_conv(8, backend="pyg")
    conv.k_norm.to("meta")
    with pytest.raises(ValueError, match="k_norm.weight is on meta"):
        _call(conv, graph)
