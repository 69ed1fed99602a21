"""graph_transformer_attention (fused QK-RMSNorm Triton kernels) against the PyG reference.

Tolerances (relative Frobenius error against the PyG reference run in float64 on the same inputs):
- float32 kernels: 1e-5 for the output and every gradient (measured about 1e-7 to 5e-7);
- bfloat16 kernels: no more than the PyG path's own bfloat16 error (times 1.5, plus 1e-3 for the final
  rounding of very small tensors), both measured against the float64 reference.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

import gtnorm
from gtnorm import _runtime
from gtnorm.nn.reference import reference_graph_transformer_attention
from gtnorm.triton import ops
from gtnorm.triton.config import attention_launch_config
from gtnorm.triton.launcher import Launcher
from tests.conftest import DEVICE, HAS_CUDA
from tests.graphs import GRAPH_BUILDERS, SmallGraph, key_bias_error, make_graph, random_inputs, rel_error

HEADS_CHANNELS = [(1, 4), (2, 8), (3, 5)] + ([(16, 64), (8, 32), (5, 24)] if HAS_CUDA else [])
PARAM_NAMES = ("q_norm_weight", "q_norm_bias", "k_norm_weight", "k_norm_bias")
INPUT_NAMES = ("query", "key", "value", "edge_attr", *PARAM_NAMES)
NORM_KINDS = [True, "layer", False]
NORM_IDS = ["rms", "layer", "no_norm"]
EPS = 1e-6


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    monkeypatch.setattr(_runtime, "POISON_OUTPUTS", True)


def make_inputs(graph: SmallGraph, heads, channels, dtype, *, edge_attr=True, qk_norm=True, weights=True, biases=True):
    """Fresh random inputs (float64 on the CPU; cast per use). Norm weights are far from 1 and biases far from 0 on
    purpose; biases only with LayerNorm."""
    inputs = dict.fromkeys(INPUT_NAMES)
    inputs.update(
        random_inputs(
            graph, heads, channels, edge_attr=edge_attr, norm_weights=bool(qk_norm) and weights,
            norm_biases=qk_norm == "layer" and biases,
        )
    )  # fmt: skip
    return {k: v.to(dtype) if v is not None else None for k, v in inputs.items()}


def leaf_copies(inputs, dtype, device):
    return {
        k: v.to(device=device, dtype=dtype).requires_grad_() if v is not None else None for k, v in inputs.items()
    }


def run_gtnorm(inputs, layout, grad_out, qk_norm, eps=EPS, launch=None):
    out = gtnorm.graph_transformer_attention(
        inputs["query"], inputs["key"], inputs["value"], inputs["edge_attr"], layout, qk_norm=qk_norm,
        **{name: inputs[name] for name in PARAM_NAMES}, eps=eps, launch=launch,
    )  # fmt: skip
    return out, _grads(out, inputs, grad_out)


def torch_norm(qk_norm, channels, weight, bias, eps) -> torch.nn.Module | None:
    """torch's own norm module of the kind, its parameters swapped for the given leaves (or none)."""
    if not qk_norm:
        return None
    if qk_norm == "layer":
        norm = torch.nn.LayerNorm(channels, eps=eps, elementwise_affine=weight is not None, bias=bias is not None)
    else:
        norm = torch.nn.RMSNorm(channels, eps=eps, elementwise_affine=weight is not None)
    # The module's forward reads self.weight / self.bias: swap the parameters for the leaves we differentiate.
    for name, leaf in (("weight", weight), ("bias", bias)):
        if leaf is not None:
            delattr(norm, name)
            setattr(norm, name, leaf)
    return norm


def run_reference(inputs, graph, grad_out, qk_norm, eps=EPS):
    """The PyG path: torch.nn.RMSNorm / LayerNorm modules on q and k, then the MessagePassing reference."""
    channels = inputs["query"].shape[-1]
    eps_q, eps_k = eps if isinstance(eps, tuple) else (eps, eps)
    q_norm = torch_norm(qk_norm, channels, inputs["q_norm_weight"], inputs["q_norm_bias"], eps_q)
    k_norm = torch_norm(qk_norm, channels, inputs["k_norm_weight"], inputs["k_norm_bias"], eps_k)
    out = reference_graph_transformer_attention(
        inputs["query"], inputs["key"], inputs["value"], inputs["edge_attr"],
        graph.edge_index.to(inputs["query"].device), size=(graph.num_src, graph.num_dst),
        q_norm=q_norm, k_norm=k_norm,
    )  # fmt: skip
    return out, _grads(out, inputs, grad_out)


def _grads(out, inputs, grad_out):
    names = [k for k in INPUT_NAMES if inputs[k] is not None]
    grads = torch.autograd.grad(out, [inputs[k] for k in names], grad_out.to(out.dtype))
    return dict(zip(names, grads, strict=True))


def grad_error(name, grads, ref_grads) -> float:
    """rel_error, except for k_norm_bias, whose exact gradient is 0 (tests/graphs.py: key_bias_error)."""
    if name == "k_norm_bias":
        return key_bias_error(grads[name], ref_grads[name], ref_grads["key"])
    return rel_error(grads[name], ref_grads[name])


def assert_matches(out, grads, ref_out, ref_grads, tolerance):
    assert out.shape == ref_out.shape
    assert rel_error(out, ref_out) < tolerance
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        assert grad.shape == ref_grads[name].shape, name
        assert grad_error(name, grads, ref_grads) < tolerance, name


def layout_of(graph: SmallGraph, device=DEVICE):
    return gtnorm.GraphLayout.from_edge_index(graph.edge_index.to(device), (graph.num_src, graph.num_dst))


@pytest.mark.parametrize("graph_name", list(GRAPH_BUILDERS))
@pytest.mark.parametrize("heads_channels", HEADS_CHANNELS, ids=lambda hc: f"H{hc[0]}C{hc[1]}")
@pytest.mark.parametrize("qk_norm", NORM_KINDS, ids=NORM_IDS)
@pytest.mark.parametrize("edge_attr", [True, False], ids=["edge_attr", "no_edge_attr"])
def test_matches_reference_float32(graph_name, heads_channels, qk_norm, edge_attr):
    graph = make_graph(graph_name)
    inputs = make_inputs(graph, *heads_channels, torch.float64, edge_attr=edge_attr, qk_norm=qk_norm)
    grad_out = torch.randn(graph.num_dst, *heads_channels, dtype=torch.float64)
    ref_out, ref_grads = run_reference(leaf_copies(inputs, torch.float64, "cpu"), graph, grad_out, qk_norm)
    out, grads = run_gtnorm(
        leaf_copies(inputs, torch.float32, DEVICE), layout_of(graph), grad_out.to(DEVICE), qk_norm
    )
    assert out.dtype == torch.float32
    assert_matches(out, grads, ref_out, ref_grads, 1e-5)


def _affine_cases():
    cases = [("rms", False, False)]
    cases += [("layer", weights, biases) for weights in (True, False) for biases in (True, False)]
    return cases


@pytest.mark.parametrize("heads_channels", [(2, 8), (3, 100)], ids=lambda hc: f"H{hc[0]}C{hc[1]}")
@pytest.mark.parametrize("case", _affine_cases(), ids=lambda c: f"{c[0]}-weight{int(c[1])}-bias{int(c[2])}")
def test_norm_with_and_without_affine_parameters(heads_channels, case):
    """Every combination of weight and bias; also several head groups per row (C = 100 pads to 128: fewer heads
    fit one program, and 28 padding lanes per head must stay out of LayerNorm's mean and variance)."""
    qk_norm, weights, biases = case
    graph = make_graph("processor_like")
    inputs = make_inputs(graph, *heads_channels, torch.float64, qk_norm=qk_norm, weights=weights, biases=biases)
    assert (inputs["q_norm_weight"] is not None, inputs["q_norm_bias"] is not None) == (weights, biases)
    grad_out = torch.randn(graph.num_dst, *heads_channels, dtype=torch.float64)
    ref_out, ref_grads = run_reference(leaf_copies(inputs, torch.float64, "cpu"), graph, grad_out, qk_norm)
    out, grads = run_gtnorm(
        leaf_copies(inputs, torch.float32, DEVICE), layout_of(graph), grad_out.to(DEVICE), qk_norm
    )
    assert_matches(out, grads, ref_out, ref_grads, 1e-5)


# (norm, q weight, q bias, k weight, k bias): each parameter on or off on its own (RMSNorm has no bias).
NORM_PARAMETER_CASES = [("rms", qw, False, kw, False) for qw, kw in itertools.product((True, False), repeat=2)]
NORM_PARAMETER_CASES += [("layer", *present) for present in itertools.product((True, False), repeat=4)]


def norm_parameter_id(case) -> str:
    norm, *present = case
    return norm + "-" + "".join(f"{name[0]}{name[7]}" for name, on in zip(PARAM_NAMES, present, strict=True) if on)


def with_norm_parameters(inputs: dict, case) -> dict:
    """The inputs with exactly the case's norm parameters (the others None)."""
    _, *present = case
    for name, on in zip(PARAM_NAMES, present, strict=True):
        assert (inputs[name] is not None) or not on, name
        inputs[name] = inputs[name] if on else None
    return inputs


@pytest.mark.parametrize("edge_attr", [True, False], ids=["edge_attr", "no_edge_attr"])
@pytest.mark.parametrize("case", NORM_PARAMETER_CASES, ids=norm_parameter_id)
def test_norm_parameters_are_independent(case, edge_attr):
    """q's and k's weight and bias each on or off on its own: the kernels take separate flags (HAS_Q_WEIGHT,
    HAS_Q_BIAS, HAS_K_WEIGHT; the key bias leaves the kernels, ops._norm_flags), and a kernel that read one
    parameter's flag for another's, or one side's parameters for the other's, fails here."""
    qk_norm = case[0]
    graph = make_graph("processor_like")
    inputs = with_norm_parameters(make_inputs(graph, 2, 8, torch.float64, edge_attr=edge_attr, qk_norm=qk_norm), case)
    grad_out = torch.randn(graph.num_dst, 2, 8, dtype=torch.float64)
    ref_out, ref_grads = run_reference(leaf_copies(inputs, torch.float64, "cpu"), graph, grad_out, qk_norm)
    out, grads = run_gtnorm(leaf_copies(inputs, torch.float32, DEVICE), layout_of(graph), grad_out.to(DEVICE), qk_norm)
    assert_matches(out, grads, ref_out, ref_grads, 1e-5)


@pytest.mark.parametrize("qk_norm", ["rms", "layer"])
def test_separate_eps_for_query_and_key(qk_norm):
    """Large, different eps (a visible part of the variance) on inputs scaled so that each one matters: a kernel
    that swapped them, or used one for both, fails."""
    graph = make_graph("encoder_like")
    inputs = make_inputs(graph, 2, 8, torch.float64, qk_norm=qk_norm)
    inputs["query"] = 0.3 * inputs["query"]
    eps = (0.05, 0.7)
    grad_out = torch.randn(graph.num_dst, 2, 8, dtype=torch.float64)
    ref_out, ref_grads = run_reference(leaf_copies(inputs, torch.float64, "cpu"), graph, grad_out, qk_norm, eps)
    out, grads = run_gtnorm(
        leaf_copies(inputs, torch.float32, DEVICE), layout_of(graph), grad_out.to(DEVICE), qk_norm, eps
    )
    assert_matches(out, grads, ref_out, ref_grads, 1e-5)
    swapped, _ = run_reference(leaf_copies(inputs, torch.float64, "cpu"), graph, grad_out, qk_norm, eps[::-1])
    assert rel_error(swapped, ref_out) > 1e-3  # the test can tell the two apart


def test_key_norm_bias_changes_nothing_and_gets_an_exact_zero_gradient():
    """The key norm's bias adds <q'_i, b_k> to every score of destination i alike, which the softmax cancels: the
    kernels leave it out (ops._norm_flags), so the output equals the one without it bitwise and its gradient is
    exactly 0 (the float64 reference's is rounding, tests/graphs.py: key_bias_error)."""
    graph = make_graph("processor_like")
    inputs = make_inputs(graph, 3, 5, torch.float64, qk_norm="layer")
    inputs["k_norm_bias"] = 10 * inputs["k_norm_bias"]  # large, so that a kernel that added it would round differently
    grad_out = torch.randn(graph.num_dst, 3, 5, dtype=torch.float64)
    out, grads = run_gtnorm(leaf_copies(inputs, torch.float32, DEVICE), layout_of(graph), grad_out.to(DEVICE), "layer")
    assert torch.equal(grads["k_norm_bias"], torch.zeros(5, device=DEVICE))
    without = leaf_copies({**inputs, "k_norm_bias": None}, torch.float32, DEVICE)
    out_without, grads_without = run_gtnorm(without, layout_of(graph), grad_out.to(DEVICE), "layer")
    assert torch.equal(out, out_without)
    assert all(torch.equal(grads[name], grads_without[name]) for name in grads_without)
    ref_out, _ = run_reference(leaf_copies(inputs, torch.float64, "cpu"), graph, grad_out, "layer")
    assert rel_error(out, ref_out) < 1e-5


@pytest.mark.parametrize("edge_attr", [True, False], ids=["edge_attr", "no_edge_attr"])
def test_layer_norm_rows_with_a_large_mean(edge_attr):
    """Query and key rows offset by +-10 times their spread: the two-pass statistics (gtnorm/layernorm/math.py)
    keep the float32 tolerance there (one pass lost 0.5-2e-5 on such rows). Without edge rows the by-source pass
    sums dS rstd (q - mean) and applies q's affine once per source (backward_kernels.py): the same tolerance."""
    graph = make_graph("encoder_like")
    inputs = make_inputs(graph, 2, 64, torch.float64, edge_attr=edge_attr, qk_norm="layer")
    for name in ("query", "key"):
        rows = inputs[name].shape[:2]
        inputs[name] = inputs[name] + 10 * torch.randn(*rows, 1, dtype=torch.float64).sign()
    grad_out = torch.randn(graph.num_dst, 2, 64, dtype=torch.float64)
    ref_out, ref_grads = run_reference(leaf_copies(inputs, torch.float64, "cpu"), graph, grad_out, "layer")
    out, grads = run_gtnorm(leaf_copies(inputs, torch.float32, DEVICE), layout_of(graph), grad_out.to(DEVICE), "layer")
    assert_matches(out, grads, ref_out, ref_grads, 1e-5)


@pytest.mark.parametrize("qk_norm", ["rms", "layer"])
def test_default_eps_is_torchs(qk_norm):
    """eps=None: float32's epsilon for RMSNorm, 1e-5 for LayerNorm (torch.nn.LayerNorm's default)."""
    graph = make_graph("decoder_like")
    inputs = make_inputs(graph, 2, 8, torch.float64, qk_norm=qk_norm)
    # Rows of tiny spread make eps a visible part of the variance.
    inputs["query"], inputs["key"] = 3e-3 * inputs["query"], 3e-3 * inputs["key"]
    eps = 1e-5 if qk_norm == "layer" else torch.finfo(torch.float32).eps
    grad_out = torch.randn(graph.num_dst, 2, 8, dtype=torch.float64)
    ref_out, _ = run_reference(leaf_copies(inputs, torch.float64, "cpu"), graph, grad_out, qk_norm, eps)
    leaves = leaf_copies(inputs, torch.float32, DEVICE)
    out, _ = run_gtnorm(leaves, layout_of(graph), grad_out.to(DEVICE), qk_norm, eps=None)
    assert rel_error(out, ref_out) < 1e-5


@pytest.mark.parametrize("graph_name", ["encoder_like", "processor_like", "decoder_like"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("qk_norm", ["rms", "layer"])
def test_low_precision_within_pyg_error(graph_name, dtype, qk_norm):
    heads, channels = (16, 64) if HAS_CUDA else (2, 16)
    graph = make_graph(graph_name)
    inputs = make_inputs(graph, heads, channels, torch.float64, qk_norm=qk_norm)
    grad_out = torch.randn(graph.num_dst, heads, channels, dtype=torch.float64)
    # Both paths see the same low-precision inputs; the float64 reference runs on those rounded values.
    rounded = {k: v.to(dtype).double() if v is not None else None for k, v in inputs.items()}
    grad_out = grad_out.to(dtype).double()
    ref_out, ref_grads = run_reference(leaf_copies(rounded, torch.float64, "cpu"), graph, grad_out, qk_norm)
    pyg_out, pyg_grads = run_reference(leaf_copies(rounded, dtype, DEVICE), graph, grad_out.to(DEVICE), qk_norm)
    out, grads = run_gtnorm(leaf_copies(rounded, dtype, DEVICE), layout_of(graph), grad_out.to(DEVICE), qk_norm)
    assert out.dtype == dtype
    assert rel_error(out, ref_out) <= 1.5 * rel_error(pyg_out, ref_out) + 1e-3
    for name, grad in grads.items():
        assert grad.dtype == dtype, name
        bound = 1.5 * grad_error(name, pyg_grads, ref_grads) + 1e-3
        assert grad_error(name, grads, ref_grads) <= bound, name


@pytest.mark.parametrize("operand_dtypes", [
    (torch.float16, torch.float16, torch.float16, torch.float32),
    (torch.bfloat16, torch.float32, torch.float16, torch.bfloat16),
    (torch.float32, torch.bfloat16, torch.bfloat16, torch.float16),
], ids=lambda d: "-".join(str(t).removeprefix("torch.") for t in d))
@pytest.mark.parametrize("qk_norm", ["rms", "layer"])
def test_mixed_operand_dtypes(operand_dtypes, qk_norm):
    """q, k, v, e in different dtypes (as autocast leaves them: 16-bit projections, fp32 edge features), fp32
    norm parameters: output in the query's dtype, each gradient in its input's dtype, values within the PyG path's
    own error with every operand in the narrowest of those dtypes (x 1.5 + 1e-3, as in
    test_low_precision_within_pyg_error; the float64 reference runs on the same rounded values)."""
    graph = make_graph("encoder_like")
    inputs = make_inputs(graph, 2, 16, torch.float64, qk_norm=qk_norm)
    dtypes = dict(zip(("query", "key", "value", "edge_attr"), operand_dtypes, strict=True))
    rounded = {k: v.to(dtypes.get(k, torch.float32)).double() if v is not None else None for k, v in inputs.items()}
    grad_out = torch.randn(graph.num_dst, 2, 16, dtype=torch.float64).to(dtypes["query"]).double()
    ref_out, ref_grads = run_reference(leaf_copies(rounded, torch.float64, "cpu"), graph, grad_out, qk_norm)
    leaves = {
        k: v.to(DEVICE, dtypes.get(k, torch.float32)).requires_grad_() if v is not None else None
        for k, v in rounded.items()
    }
    out, grads = run_gtnorm(leaves, layout_of(graph), grad_out.to(DEVICE), qk_norm)
    narrowest = torch.bfloat16 if torch.bfloat16 in operand_dtypes else torch.float16
    pyg_out, pyg_grads = run_reference(leaf_copies(rounded, narrowest, DEVICE), graph, grad_out.to(DEVICE), qk_norm)
    assert out.dtype == dtypes["query"]
    assert rel_error(out, ref_out) <= 1.5 * rel_error(pyg_out, ref_out) + 1e-3
    for name, grad in grads.items():
        assert grad.dtype == leaves[name].dtype, name
        assert grad_error(name, grads, ref_grads) <= 1.5 * grad_error(name, pyg_grads, ref_grads) + 1e-3, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("sharpness", [1e3, 1e4])
@pytest.mark.parametrize("qk_norm", NORM_KINDS, ids=NORM_IDS)
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
    inputs = dict(query=query, key=key, value=value, edge_attr=edge_attr)
    inputs.update(dict.fromkeys(PARAM_NAMES))
    if qk_norm:
        inputs["q_norm_weight"] = torch.full((channels,), sharpness)
    else:
        inputs["query"] = query * sharpness
    if qk_norm == "layer":
        inputs["q_norm_bias"] = torch.randn(channels)
        inputs["k_norm_bias"] = torch.randn(channels)
    inputs = leaf_copies(inputs, dtype, DEVICE)
    grad_out = torch.randn(1, heads, channels, device=DEVICE)
    _, grads = run_gtnorm(inputs, layout_of(graph), grad_out, qk_norm)
    dv_norm = grads["value"].float().norm()
    assert grads["query"].float().norm() / dv_norm < 1e-3
    assert grads["key"].float().norm() / dv_norm < 1e-3
    for name in PARAM_NAMES:
        if inputs[name] is not None:
            assert torch.isfinite(grads[name]).all(), name


@pytest.mark.parametrize("qk_norm", ["rms", "layer"])
def test_zero_degree_nodes_get_zeros(qk_norm):
    graph = make_graph("random_bipartite")
    inputs = leaf_copies(make_inputs(graph, 2, 8, torch.float32, qk_norm=qk_norm), torch.float32, DEVICE)
    out, grads = run_gtnorm(inputs, layout_of(graph), torch.randn(graph.num_dst, 2, 8, device=DEVICE), qk_norm)
    no_in = torch.bincount(graph.edge_index[1], minlength=graph.num_dst) == 0
    no_out = torch.bincount(graph.edge_index[0], minlength=graph.num_src) == 0
    assert no_in.any() and no_out.any()
    assert torch.equal(out[no_in.to(DEVICE)], torch.zeros_like(out[no_in.to(DEVICE)]))
    assert (grads["query"][no_in.to(DEVICE)] == 0).all()
    assert (grads["key"][no_out.to(DEVICE)] == 0).all()
    assert (grads["value"][no_out.to(DEVICE)] == 0).all()


@pytest.mark.parametrize("qk_norm", ["rms", "layer"])
def test_graph_without_edges(qk_norm):
    graph = SmallGraph("empty", torch.zeros(2, 0, dtype=torch.long), 5, 4)
    inputs = leaf_copies(make_inputs(graph, 2, 8, torch.float32, qk_norm=qk_norm), torch.float32, DEVICE)
    out, grads = run_gtnorm(inputs, layout_of(graph), torch.randn(4, 2, 8, device=DEVICE), qk_norm)
    assert torch.equal(out, torch.zeros_like(out))
    for name, grad in grads.items():
        assert torch.equal(grad, torch.zeros_like(grad)), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("qk_norm", ["rms", "layer"])
def test_backward_is_bitwise_deterministic(dtype, qk_norm):
    heads, channels = (16, 64) if HAS_CUDA else (2, 8)
    graph = make_graph("encoder_like")
    inputs = leaf_copies(make_inputs(graph, heads, channels, torch.float32, qk_norm=qk_norm), dtype, DEVICE)
    layout = layout_of(graph)
    grad_out = torch.randn(graph.num_dst, heads, channels, device=DEVICE)
    first_out, first = run_gtnorm(inputs, layout, grad_out, qk_norm)
    for _ in range(2):
        out, again = run_gtnorm(inputs, layout, grad_out, qk_norm)
        assert torch.equal(out, first_out)
        for name in first:
            assert torch.equal(again[name], first[name]), name


@pytest.mark.parametrize("qk_norm", ["rms", "layer"])
def test_under_activation_checkpointing(qk_norm):
    """Anemoi checkpoints its blocks: the saved tensors are packed and recomputed; the gradients are bitwise those
    of a plain call. The layout's index tensors are held on the autograd context, not saved: no pack hook runs
    for them (each is a Python call per tensor under checkpointing)."""
    heads, channels = (16, 64) if HAS_CUDA else (2, 8)
    graph = make_graph("processor_like")
    inputs = leaf_copies(make_inputs(graph, heads, channels, torch.float32, qk_norm=qk_norm), torch.float32, DEVICE)
    layout = layout_of(graph)
    grad_out = torch.randn(graph.num_dst, heads, channels, device=DEVICE)

    def forward(*args):
        named = dict(zip(INPUT_NAMES, args, strict=True))
        return gtnorm.graph_transformer_attention(
            *(named[name] for name in INPUT_NAMES[:4]), layout, qk_norm=qk_norm,
            **{name: named[name] for name in PARAM_NAMES}, eps=EPS,
        )  # fmt: skip

    args = [inputs[name] for name in INPUT_NAMES]
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward(*args)
    grads = _grads(out, inputs, grad_out)
    layout_storage = {t.untyped_storage().data_ptr() for t in layout.tensors() if t.numel()}
    assert packed and not any(t.untyped_storage().data_ptr() in layout_storage for t in packed)

    checkpointed = torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False)
    assert torch.equal(checkpointed, out)
    again = _grads(checkpointed, inputs, grad_out)
    for name in grads:
        assert torch.equal(again[name], grads[name]), name


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


@pytest.mark.parametrize("num_stages", [1, 3], ids=["range_loop", "pipelined_range_loop"])
@pytest.mark.parametrize("qk_norm", ["rms", "layer"])
def test_launch_plan_passed_in(num_stages, qk_norm):
    """A plan handed to the op is the one the kernels run: pipelined or not, several nodes per forward program
    (the pipelined form) or one, the same result."""
    default = attention_launch_config(3, 5)
    kernels = ("forward", "by_destination", "by_source")
    change = {k: dataclasses.replace(getattr(default, k), num_stages=num_stages) for k in kernels}
    launch = dataclasses.replace(default, **change)
    graph = make_graph("encoder_like")
    inputs = make_inputs(graph, 3, 5, torch.float64, qk_norm=qk_norm)
    grad_out = torch.randn(graph.num_dst, 3, 5, dtype=torch.float64)
    ref_out, ref_grads = run_reference(leaf_copies(inputs, torch.float64, "cpu"), graph, grad_out, qk_norm)
    out, grads = run_gtnorm(
        leaf_copies(inputs, torch.float32, DEVICE), layout_of(graph), grad_out.to(DEVICE), qk_norm, launch=launch
    )
    assert_matches(out, grads, ref_out, ref_grads, 1e-5)


def test_launch_plan_cannot_pass_through_compile():
    launch = attention_launch_config(1, 1)
    with pytest.raises(Exception, match="launch plan"):  # dynamo may wrap the ValueError
        torch.compile(lambda: ops.graph_attention(launch=launch), fullgraph=True)()


@pytest.mark.parametrize("graph_name", ["encoder_like", "decoder_like"])
def test_result_does_not_depend_on_visiting_order(graph_name):
    graph = make_graph(graph_name)
    inputs = make_inputs(graph, 3, 5, torch.float32, qk_norm="layer")
    grad_out = torch.randn(graph.num_dst, 3, 5, device=DEVICE)
    out, grads = run_gtnorm(leaf_copies(inputs, torch.float32, DEVICE), layout_of(graph), grad_out, "layer")
    shuffled = gtnorm.GraphLayout.from_edge_index(
        graph.edge_index.to(DEVICE), (graph.num_src, graph.num_dst),
        dst_order=torch.randperm(graph.num_dst), src_order=torch.randperm(graph.num_src),
    )  # fmt: skip
    out_s, grads_s = run_gtnorm(leaf_copies(inputs, torch.float32, DEVICE), shuffled, grad_out, "layer")
    # Every node's sums run over its edges in the same order: only the norm parameters' partial sums differ.
    assert torch.equal(out_s, out)
    for name in grads:
        if name in PARAM_NAMES:
            assert grad_error(name, grads_s, grads) < 1e-5, name
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


@pytest.mark.parametrize("graph_arg", ["layout", "edge_index"])
@pytest.mark.parametrize("qk_norm", ["rms", "layer", "none"])
def test_opcheck(qk_norm, graph_arg):
    """The ops take the layout's index tensors, or [edge_index] (what torch.compile's graphs pass: the op finds the
    layout in the shared cache when it runs)."""
    graph = make_graph("decoder_like", scale=1)
    inputs, layout_args = _op_args(graph, 2, 4, torch.float32, qk_norm=qk_norm if qk_norm != "none" else False)
    if graph_arg == "edge_index":
        layout_args = [graph.edge_index.to(DEVICE)]
    # The ops' tensors: q, k, v, edge_attr, then the edge projection's three (none here), then the norm parameters.
    tensors = [inputs[k] for k in INPUT_NAMES[:4]] + [None] * 3 + [inputs[k] for k in PARAM_NAMES]
    forward_args = (*tensors, list(layout_args), qk_norm, EPS, 2 * EPS)
    torch.library.opcheck(torch.ops.gtnorm.graph_attention_forward.default, forward_args)
    _, lse, query_proj = torch.ops.gtnorm.graph_attention_forward(*forward_args)
    detached = [t.detach() if t is not None else None for t in tensors]
    grad_out = torch.randn_like(detached[0])
    backward_args = (grad_out, *detached, lse, query_proj, list(layout_args), qk_norm, EPS, 2 * EPS, False)
    torch.library.opcheck(torch.ops.gtnorm.graph_attention_backward.default, backward_args)


@pytest.mark.gpu
@pytest.mark.parametrize("qk_norm", ["rms", "layer"])
def test_torch_compile_fullgraph(qk_norm):
    graph = make_graph("encoder_like")
    layout = layout_of(graph)
    inputs = leaf_copies(make_inputs(graph, 16, 64, torch.float32, qk_norm=qk_norm), torch.bfloat16, DEVICE)
    grad_out = torch.randn(graph.num_dst, 16, 64, device=DEVICE)

    def attention(query, key, value, edge_attr, q_norm_weight, q_norm_bias, k_norm_weight, k_norm_bias):
        return gtnorm.graph_transformer_attention(
            query, key, value, edge_attr, layout, qk_norm=qk_norm, q_norm_weight=q_norm_weight,
            q_norm_bias=q_norm_bias, k_norm_weight=k_norm_weight, k_norm_bias=k_norm_bias, eps=(EPS, 2 * EPS),
        )  # fmt: skip

    compiled = torch.compile(attention, fullgraph=True)
    out = compiled(*[inputs[k] for k in INPUT_NAMES])
    compiled_grads = _grads(out, inputs, grad_out)
    eager_out, eager_grads = run_gtnorm(inputs, layout, grad_out, qk_norm, (EPS, 2 * EPS))
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
    assert_refused_before_launch(kwargs, exc, fragment, monkeypatch)


def assert_refused_before_launch(kwargs: dict, exc, fragment: str, monkeypatch) -> None:
    """The op called with ``kwargs`` (its arguments by name) raises ``exc`` matching ``fragment``, and no kernel
    has launched by then."""
    launched = []
    monkeypatch.setattr(Launcher, "launch", lambda *a, **k: launched.append(1))
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


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_forward_backward_captured_in_a_cuda_graph():
    """With its layout prebuilt the op makes no host sync: forward+backward capture in a CUDA graph, and each
    replay gives what an eager call gives on the inputs copied in."""
    graph = make_graph("encoder_like")
    layout = layout_of(graph)
    inputs = leaf_copies(make_inputs(graph, 3, 8, torch.float32, qk_norm="rms"), torch.float32, DEVICE)
    grad_out = torch.randn(graph.num_dst, 3, 8, device=DEVICE)
    leaves = [t for t in inputs.values() if t is not None]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for t in leaves:
                t.grad = None
            run_gtnorm(inputs, layout, grad_out, "rms")
    torch.cuda.current_stream().wait_stream(side)
    for t in leaves:
        t.grad = None
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cuda_graph):
        out, grads = run_gtnorm(inputs, layout, grad_out, "rms")
    for _ in range(2):
        with torch.no_grad():
            for t in leaves:
                t.copy_(torch.randn_like(t))
        cuda_graph.replay()
        fresh = {name: t.detach().clone().requires_grad_() for name, t in inputs.items() if t is not None}
        fresh |= {name: None for name, t in inputs.items() if t is None}
        eager_out, eager_grads = run_gtnorm(fresh, layout, grad_out, "rms")
        assert torch.equal(out, eager_out)
        for name in eager_grads:
            assert torch.equal(grads[name], eager_grads[name]), name
