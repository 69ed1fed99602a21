"""graph_transformer_attention (fused QK-RMSNorm Triton kernels) against the PyG reference.

Tolerances (relative Frobenius error against the PyG reference run in float64 on the same inputs):
- float32 kernels: 1e-5 for the output and every gradient (measured about 1e-7 to 5e-7);
- bfloat16 kernels: no more than the PyG path's own bfloat16 error (times 1.5, plus 1e-3 for the final
  rounding of very small tensors), both measured against the float64 reference.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton

import gtnorm
from gtnorm import _runtime
from gtnorm.nn.reference import reference_graph_transformer_attention
from gtnorm.triton import ops
from tests.conftest import DEVICE, HAS_CUDA
from tests.graphs import GRAPH_BUILDERS, SmallGraph, make_graph, random_inputs, rel_error

HEADS_CHANNELS = [(1, 4), (2, 8), (3, 5)] + ([(16, 64), (8, 32), (5, 24)] if HAS_CUDA else [])
INPUT_NAMES = ("query", "key", "value", "edge_attr", "q_norm_weight", "k_norm_weight")
EPS = 1e-6


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    monkeypatch.setattr(_runtime, "POISON_OUTPUTS", True)


def make_inputs(graph: SmallGraph, heads, channels, dtype, *, edge_attr=True, qk_norm=True, weights=True):
    """Fresh random inputs (float64 on the CPU; cast per use). Norm weights are far from 1 on purpose."""
    inputs = dict.fromkeys(INPUT_NAMES)
    inputs.update(random_inputs(graph, heads, channels, edge_attr=edge_attr, norm_weights=qk_norm and weights))
    return {k: v.to(dtype) if v is not None else None for k, v in inputs.items()}


def leaf_copies(inputs, dtype, device):
    return {
        k: v.to(device=device, dtype=dtype).requires_grad_() if v is not None else None for k, v in inputs.items()
    }


def run_gtnorm(inputs, layout, grad_out, qk_norm):
    out = gtnorm.graph_transformer_attention(
        inputs["query"], inputs["key"], inputs["value"], inputs["edge_attr"], layout,
        qk_norm=qk_norm, q_norm_weight=inputs["q_norm_weight"], k_norm_weight=inputs["k_norm_weight"], eps=EPS,
    )  # fmt: skip
    return out, _grads(out, inputs, grad_out)


def run_reference(inputs, graph, grad_out, qk_norm):
    """The PyG path: torch.nn.RMSNorm modules on q and k, then the MessagePassing reference."""
    channels = inputs["query"].shape[-1]
    norms = {}
    for name in ("q", "k"):
        weight = inputs[f"{name}_norm_weight"]
        if not qk_norm:
            norms[name] = None
            continue
        norm = torch.nn.RMSNorm(channels, eps=EPS, elementwise_affine=weight is not None)
        if weight is not None:
            # The module's forward reads self.weight: swap the parameter for the leaf tensor we differentiate.
            del norm.weight
            norm.weight = weight
        norms[name] = norm
    out = reference_graph_transformer_attention(
        inputs["query"], inputs["key"], inputs["value"], inputs["edge_attr"],
        graph.edge_index.to(inputs["query"].device), size=(graph.num_src, graph.num_dst),
        q_norm=norms["q"], k_norm=norms["k"],
    )  # fmt: skip
    return out, _grads(out, inputs, grad_out)


def _grads(out, inputs, grad_out):
    names = [k for k in INPUT_NAMES if inputs[k] is not None]
    grads = torch.autograd.grad(out, [inputs[k] for k in names], grad_out.to(out.dtype))
    return dict(zip(names, grads, strict=True))



def layout_of(graph: SmallGraph, device=DEVICE):
    return gtnorm.GraphLayout.from_edge_index(graph.edge_index.to(device), (graph.num_src, graph.num_dst))


@pytest.mark.parametrize("graph_name", list(GRAPH_BUILDERS))
@pytest.mark.parametrize("heads_channels", HEADS_CHANNELS, ids=lambda hc: f"H{hc[0]}C{hc[1]}")
@pytest.mark.parametrize("qk_norm", [True, False], ids=["qk_norm", "no_norm"])
@pytest.mark.parametrize("edge_attr", [True, False], ids=["edge_attr", "no_edge_attr"])
def test_matches_reference_float32(graph_name, heads_channels, qk_norm, edge_attr):
    graph = make_graph(graph_name)
    inputs = make_inputs(graph, *heads_channels, torch.float64, edge_attr=edge_attr, qk_norm=qk_norm)
    grad_out = torch.randn(graph.num_dst, *heads_channels, dtype=torch.float64)
    ref_out, ref_grads = run_reference(leaf_copies(inputs, torch.float64, "cpu"), graph, grad_out, qk_norm)
    out, grads = run_gtnorm(leaf_copies(inputs, torch.float32, DEVICE), layout_of(graph), grad_out.to(DEVICE),
                            qk_norm)
    assert out.dtype == torch.float32 and out.shape == ref_out.shape
    assert rel_error(out, ref_out) < 1e-5
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        assert grad.shape == ref_grads[name].shape, name
        assert rel_error(grad, ref_grads[name]) < 1e-5, name


@pytest.mark.parametrize("heads_channels", [(2, 8), (3, 100)], ids=lambda hc: f"H{hc[0]}C{hc[1]}")
def test_qk_norm_without_affine_weights(heads_channels):
    """Also the case of several head groups per row (C = 100 pads to 128: fewer heads fit one program)."""
    graph = make_graph("processor_like")
    inputs = make_inputs(graph, *heads_channels, torch.float64, weights=False)
    grad_out = torch.randn(graph.num_dst, *heads_channels, dtype=torch.float64)
    ref_out, ref_grads = run_reference(leaf_copies(inputs, torch.float64, "cpu"), graph, grad_out, True)
    out, grads = run_gtnorm(leaf_copies(inputs, torch.float32, DEVICE), layout_of(graph), grad_out.to(DEVICE), True)
    assert rel_error(out, ref_out) < 1e-5
    for name, grad in grads.items():
        assert rel_error(grad, ref_grads[name]) < 1e-5, name


@pytest.mark.parametrize("graph_name", ["encoder_like", "processor_like", "decoder_like"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_low_precision_within_pyg_error(graph_name, dtype):
    heads, channels = (16, 64) if HAS_CUDA else (2, 16)
    graph = make_graph(graph_name)
    inputs = make_inputs(graph, heads, channels, torch.float64)
    grad_out = torch.randn(graph.num_dst, heads, channels, dtype=torch.float64)
    # Both paths see the same low-precision inputs; the float64 reference runs on those rounded values.
    rounded = {k: v.to(dtype).double() if v is not None else None for k, v in inputs.items()}
    grad_out = grad_out.to(dtype).double()
    ref_out, ref_grads = run_reference(leaf_copies(rounded, torch.float64, "cpu"), graph, grad_out, True)
    pyg_out, pyg_grads = run_reference(leaf_copies(rounded, dtype, DEVICE), graph, grad_out.to(DEVICE), True)
    out, grads = run_gtnorm(leaf_copies(rounded, dtype, DEVICE), layout_of(graph), grad_out.to(DEVICE), True)
    assert out.dtype == dtype
    assert rel_error(out, ref_out) <= 1.5 * rel_error(pyg_out, ref_out) + 1e-3
    for name, grad in grads.items():
        assert grad.dtype == dtype, name
        assert rel_error(grad, ref_grads[name]) <= 1.5 * rel_error(pyg_grads[name], ref_grads[name]) + 1e-3, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("sharpness", [1e3, 1e4])
@pytest.mark.parametrize("qk_norm", [True, False], ids=["qk_norm", "no_norm"])
def test_sharp_softmax_with_equal_messages_has_no_query_key_gradient(dtype, sharpness, qk_norm):
    """Star graph, 8 neighbours, identical messages v + e: out does not depend on q or k, so dq = dk = 0.

    Large logits make a cancelling backward (dS = a (da - D) with D from a rounded output) blow up in bf16.
    """
    heads, channels, fan_in = 4, 16, 8
    graph = SmallGraph("star", torch.stack([torch.arange(fan_in), torch.zeros(fan_in, dtype=torch.long)]), fan_in, 1)
    query = torch.randn(1, heads, channels)
    key = torch.randn(fan_in, heads, channels)
    value = torch.randn(1, heads, channels).expand(fan_in, -1, -1).contiguous()
    edge_attr = torch.randn(1, heads, channels).expand(fan_in, -1, -1).contiguous()
    q_weight = torch.full((channels,), sharpness) if qk_norm else None
    if not qk_norm:
        query = query * sharpness
    inputs = dict(query=query, key=key, value=value, edge_attr=edge_attr, q_norm_weight=q_weight, k_norm_weight=None)
    inputs = leaf_copies(inputs, dtype, DEVICE)
    grad_out = torch.randn(1, heads, channels, device=DEVICE)
    _, grads = run_gtnorm(inputs, layout_of(graph), grad_out, qk_norm)
    dv_norm = grads["value"].float().norm()
    assert grads["query"].float().norm() / dv_norm < 1e-3
    assert grads["key"].float().norm() / dv_norm < 1e-3
    if qk_norm:
        assert torch.isfinite(grads["q_norm_weight"]).all()


def test_zero_degree_nodes_get_zeros():
    graph = make_graph("random_bipartite")
    inputs = leaf_copies(make_inputs(graph, 2, 8, torch.float32), torch.float32, DEVICE)
    out, grads = run_gtnorm(inputs, layout_of(graph), torch.randn(graph.num_dst, 2, 8, device=DEVICE), True)
    no_in = torch.bincount(graph.edge_index[1], minlength=graph.num_dst) == 0
    no_out = torch.bincount(graph.edge_index[0], minlength=graph.num_src) == 0
    assert no_in.any() and no_out.any()
    assert torch.equal(out[no_in.to(DEVICE)], torch.zeros_like(out[no_in.to(DEVICE)]))
    assert (grads["query"][no_in.to(DEVICE)] == 0).all()
    assert (grads["key"][no_out.to(DEVICE)] == 0).all()
    assert (grads["value"][no_out.to(DEVICE)] == 0).all()


def test_graph_without_edges():
    graph = SmallGraph("empty", torch.zeros(2, 0, dtype=torch.long), 5, 4)
    inputs = leaf_copies(make_inputs(graph, 2, 8, torch.float32), torch.float32, DEVICE)
    out, grads = run_gtnorm(inputs, layout_of(graph), torch.randn(4, 2, 8, device=DEVICE), True)
    assert torch.equal(out, torch.zeros_like(out))
    for name, grad in grads.items():
        assert torch.equal(grad, torch.zeros_like(grad)), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_backward_is_bitwise_deterministic(dtype):
    heads, channels = (16, 64) if HAS_CUDA else (2, 8)
    graph = make_graph("encoder_like")
    inputs = leaf_copies(make_inputs(graph, heads, channels, torch.float32), dtype, DEVICE)
    layout = layout_of(graph)
    grad_out = torch.randn(graph.num_dst, heads, channels, device=DEVICE)
    first_out, first = run_gtnorm(inputs, layout, grad_out, True)
    for _ in range(2):
        out, again = run_gtnorm(inputs, layout, grad_out, True)
        assert torch.equal(out, first_out)
        for name in first:
            assert torch.equal(again[name], first[name]), name


def test_result_does_not_depend_on_edge_order():
    graph = make_graph("processor_like")
    inputs = make_inputs(graph, 3, 5, torch.float32)
    grad_out = torch.randn(graph.num_dst, 3, 5, device=DEVICE)
    out, grads = run_gtnorm(leaf_copies(inputs, torch.float32, DEVICE), layout_of(graph), grad_out, True)

    perm = torch.randperm(graph.edge_index.shape[1])
    shuffled = SmallGraph("shuffled", graph.edge_index[:, perm], graph.num_src, graph.num_dst)
    inputs_shuffled = dict(inputs, edge_attr=inputs["edge_attr"][perm])
    out_s, grads_s = run_gtnorm(leaf_copies(inputs_shuffled, torch.float32, DEVICE), layout_of(shuffled), grad_out,
                                True)
    # Summation order within a node follows the edge order, so the results agree to float32 rounding.
    assert rel_error(out_s, out) < 1e-5
    grads_s["edge_attr"] = grads_s["edge_attr"][torch.argsort(perm.to(DEVICE))]
    for name in grads:
        assert rel_error(grads_s[name], grads[name]) < 1e-5, name


_RANGE_OVER_LOADED_BOUNDS = not _runtime.interpreter_active() or tuple(
    int(part) for part in triton.__version__.split(".")[:2]
) >= (3, 9)


@pytest.mark.parametrize("num_stages", [0, 1, 3], ids=["while_loop", "range_loop", "pipelined_range_loop"])
def test_both_loop_forms_match_reference(num_stages, monkeypatch):
    """The kernels' edge loops come in two forms (config.py): range() for the compiler, while for the
    interpreter. Whichever this platform runs by default, the other is checked here too."""
    if num_stages and not _RANGE_OVER_LOADED_BOUNDS:
        pytest.skip("this Triton's interpreter cannot run range() over loaded bounds")
    default = ops.attention_launch_config

    def with_stages(num_heads, head_dim):
        cfg = default(num_heads, head_dim)
        kernels = ("forward", "by_destination", "by_source")
        change = {k: dataclasses.replace(getattr(cfg, k), num_stages=num_stages) for k in kernels}
        return dataclasses.replace(cfg, **change)

    monkeypatch.setattr(ops, "attention_launch_config", with_stages)
    graph = make_graph("encoder_like")
    inputs = make_inputs(graph, 3, 5, torch.float64)
    grad_out = torch.randn(graph.num_dst, 3, 5, dtype=torch.float64)
    ref_out, ref_grads = run_reference(leaf_copies(inputs, torch.float64, "cpu"), graph, grad_out, True)
    out, grads = run_gtnorm(leaf_copies(inputs, torch.float32, DEVICE), layout_of(graph), grad_out.to(DEVICE), True)
    assert rel_error(out, ref_out) < 1e-5
    for name, grad in grads.items():
        assert rel_error(grad, ref_grads[name]) < 1e-5, name


@pytest.mark.parametrize("graph_name", ["encoder_like", "decoder_like"])
def test_result_does_not_depend_on_visiting_order(graph_name):
    graph = make_graph(graph_name)
    inputs = make_inputs(graph, 3, 5, torch.float32)
    grad_out = torch.randn(graph.num_dst, 3, 5, device=DEVICE)
    out, grads = run_gtnorm(leaf_copies(inputs, torch.float32, DEVICE), layout_of(graph), grad_out, True)
    shuffled = gtnorm.GraphLayout.from_edge_index(
        graph.edge_index.to(DEVICE), (graph.num_src, graph.num_dst),
        dst_order=torch.randperm(graph.num_dst), src_order=torch.randperm(graph.num_src),
    )  # fmt: skip
    out_s, grads_s = run_gtnorm(leaf_copies(inputs, torch.float32, DEVICE), shuffled, grad_out, True)
    # Every node's sums run over its edges in the same order: only the weight gradients' partial sums differ.
    assert torch.equal(out_s, out)
    for name in grads:
        if name.endswith("norm_weight"):
            assert rel_error(grads_s[name], grads[name]) < 1e-5, name
        else:
            assert torch.equal(grads_s[name], grads[name]), name


def _op_args(graph, heads, channels, dtype, qk_norm=True, requires_grad=True):
    inputs = leaf_copies(make_inputs(graph, heads, channels, torch.float32, qk_norm=qk_norm), dtype, DEVICE)
    for v in inputs.values():
        if v is not None:
            v.requires_grad_(requires_grad)
    layout = layout_of(graph)
    layout_args = layout.tensors()
    return inputs, layout_args


@pytest.mark.parametrize("qk_norm", [True, False], ids=["qk_norm", "no_norm"])
def test_opcheck(qk_norm):
    graph = make_graph("decoder_like", scale=1)
    inputs, layout_args = _op_args(graph, 2, 4, torch.float32, qk_norm=qk_norm)
    forward_args = (*[inputs[k] for k in INPUT_NAMES], *layout_args, qk_norm, EPS)
    torch.library.opcheck(torch.ops.gtnorm.graph_attention_forward.default, forward_args)
    _, lse = torch.ops.gtnorm.graph_attention_forward(*forward_args)
    detached = [inputs[k].detach() if inputs[k] is not None else None for k in INPUT_NAMES]
    grad_out = torch.randn_like(detached[0])
    backward_args = (grad_out, *detached, lse, *layout_args, qk_norm, EPS)
    torch.library.opcheck(torch.ops.gtnorm.graph_attention_backward.default, backward_args)


@pytest.mark.gpu
def test_torch_compile_fullgraph():
    graph = make_graph("encoder_like")
    layout = layout_of(graph)
    inputs = leaf_copies(make_inputs(graph, 16, 64, torch.float32), torch.bfloat16, DEVICE)
    grad_out = torch.randn(graph.num_dst, 16, 64, device=DEVICE)

    def attention(query, key, value, edge_attr, q_norm_weight, k_norm_weight):
        return gtnorm.graph_transformer_attention(query, key, value, edge_attr, layout, qk_norm=True,
                                                  q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight, eps=EPS)

    compiled = torch.compile(attention, fullgraph=True)
    out = compiled(*[inputs[k] for k in INPUT_NAMES])
    compiled_grads = _grads(out, inputs, grad_out)
    eager_out, eager_grads = run_gtnorm(inputs, layout, grad_out, True)
    assert torch.equal(out, eager_out)
    for name in eager_grads:
        assert torch.equal(compiled_grads[name], eager_grads[name]), name


def _bad_inputs():
    """(description, change to the valid call's kwargs, exception type, message fragment)."""
    return [
        ("query rank", lambda kw: kw.update(query=kw["query"][0]), ValueError, "query must have shape"),
        ("key heads", lambda kw: kw.update(key=kw["key"][:, :1]), ValueError, "key has 1 heads"),
        ("value channels", lambda kw: kw.update(value=kw["value"][..., :3]), ValueError, "value has"),
        ("edge_attr rows", lambda kw: kw.update(edge_attr=kw["edge_attr"][1:]), ValueError, "edge_attr has"),
        ("key/value nodes", lambda kw: kw.update(value=kw["value"][1:]), ValueError, "value has"),
        ("query nodes", lambda kw: kw.update(query=kw["query"][1:]), ValueError, "destination nodes"),
        ("unsupported dtype", lambda kw: kw.update({k: kw[k].double() for k in ("query", "key", "value", "edge_attr")}),
         TypeError, "query must be float16, bfloat16 or float32"),
        ("float64 edge_attr", lambda kw: kw.update(edge_attr=kw["edge_attr"].double()), TypeError,
         "edge_attr must be float16, bfloat16 or float32"),
        ("unknown norm kind", lambda kw: kw.update(qk_norm="batch"), ValueError, "qk_norm must be False, True"),
        ("norm kind 1", lambda kw: kw.update(qk_norm=1), ValueError, "qk_norm must be False, True"),
        ("bias with rms", lambda kw: kw.update(q_norm_bias=torch.zeros(8, device=DEVICE)), ValueError,
         "only LayerNorm"),
        ("bias size", lambda kw: kw.update(qk_norm="layer", k_norm_bias=torch.zeros(3, device=DEVICE)), ValueError,
         "k_norm_bias must have shape"),
        ("bias dtype", lambda kw: kw.update(qk_norm="layer", k_norm_bias=torch.zeros(8, device=DEVICE).double()),
         TypeError, "k_norm_bias must be float16"),
        ("negative eps", lambda kw: kw.update(eps=-1e-6), ValueError, "eps must be non-negative"),
        ("negative eps_k", lambda kw: kw.update(eps=(1e-6, -1.0)), ValueError, "eps_k"),
        ("eps triple", lambda kw: kw.update(eps=(1e-6, 1e-6, 1e-6)), ValueError, "pair"),
        ("eps string", lambda kw: kw.update(eps="1e-6"), TypeError, "eps must be a number"),
        ("weight size", lambda kw: kw.update(q_norm_weight=torch.ones(3, device=DEVICE)), ValueError,
         "q_norm_weight must have shape"),
        ("weight without norm", lambda kw: kw.update(qk_norm=False), ValueError, "qk_norm=False"),
        ("weight type", lambda kw: kw.update(k_norm_weight=[1.0] * 8), TypeError, "k_norm_weight must be"),
        ("query type", lambda kw: kw.update(query=kw["query"].tolist()), TypeError, "query must be a torch.Tensor"),
        ("layout type", lambda kw: kw.update(layout="graph"), TypeError, "layout must be"),
    ]


@pytest.mark.parametrize("case", _bad_inputs(), ids=lambda c: c[0])
def test_bad_input_raises_before_launch(case, monkeypatch):
    _, change, exc, fragment = case
    graph = make_graph("encoder_like", scale=1)
    inputs = {k: v for k, v in leaf_copies(make_inputs(graph, 2, 8, torch.float32), torch.float32, DEVICE).items()}
    kwargs = dict(inputs, layout=layout_of(graph), qk_norm=True)
    change(kwargs)
    launched = []
    monkeypatch.setattr(ops.graph_attention_forward_kernel, "run", lambda *a, **k: launched.append(1))
    with pytest.raises(exc, match=fragment):
        gtnorm.graph_transformer_attention(
            kwargs.pop("query"), kwargs.pop("key"), kwargs.pop("value"), kwargs.pop("edge_attr"),
            kwargs.pop("layout"), **kwargs,
        )  # fmt: skip
    assert not launched


def test_devices_must_match():
    graph = make_graph("decoder_like", scale=1)
    inputs = leaf_copies(make_inputs(graph, 2, 8, torch.float32), torch.float32, DEVICE)
    with pytest.raises(ValueError, match="key is on meta"):
        gtnorm.graph_transformer_attention(inputs["query"], inputs["key"].to("meta"), inputs["value"],
                                           inputs["edge_attr"], layout_of(graph), qk_norm=True)


@pytest.mark.gpu
def test_layout_on_another_device_raises():
    graph = make_graph("decoder_like", scale=1)
    inputs = leaf_copies(make_inputs(graph, 2, 8, torch.float32), torch.float32, DEVICE)
    with pytest.raises(ValueError, match="layout is on cpu"):
        gtnorm.graph_transformer_attention(inputs["query"], inputs["key"], inputs["value"], inputs["edge_attr"],
                                           layout_of(graph, "cpu"), qk_norm=True)


@pytest.mark.skipif(HAS_CUDA, reason="checks the error on a machine without CUDA")
def test_cpu_tensors_without_interpreter_raise(monkeypatch):
    graph = make_graph("decoder_like", scale=1)
    inputs = leaf_copies(make_inputs(graph, 2, 8, torch.float32), torch.float32, "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        gtnorm.graph_transformer_attention(inputs["query"], inputs["key"], inputs["value"], inputs["edge_attr"],
                                           layout_of(graph, "cpu"))
