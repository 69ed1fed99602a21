"""graph_transformer_attention on large graphs: tensors past 2**31 elements (the kernels' int64 offsets), and
bitwise determinism with the layout rebuilt between runs.

The GPU sizes are marked ``gpu``; the same code runs at a tiny size through the interpreter on the CPU, which
checks the tests' own arithmetic (the selection, the references) where the large sizes cannot run.

Past 2**31: the loss reads only a few destinations (the last ones and a random sample), so that only their edges
and the sources those read get gradients; the reference, plain torch math in float64 independent of gtnorm,
runs on just that part of the graph. The bound, per tensor: the error of the same torch math run in bfloat16 on
the same part (x 1.5 + 1e-3, as in test_attention.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.utils import softmax as segment_softmax

import gtnorm
from tests.conftest import DEVICE
from tests.graphs import ROWS_PAST_INT32_AT_1024, Selection, last_and_random, rel_error, ring_with_tail
from tests.launches import attention_ran, count_launches

EPS = 1e-5


@dataclass(frozen=True)
class Size:
    name: str
    num_nodes: int  # sources and destinations (a square graph)
    heads: int
    channels: int
    tail: int  # the last destinations' extra edges from the last sources (ring_with_tail)


# Huge: q, k, v, out and e [2.2M, 16, 64] bfloat16, 4.5 GB each, and the gradients of q, k, v, e, and the output's
# (autograd's zero-filled [N, H, C] for the selection's backward): ~46 GB on the GPU, fp32 scratch [M, 16] x 2
# (0.3 GB) beside them; the references run on ~100 destinations. About 10-20 s per case on an H100, most of it
# filling the tensors.
LARGE_SIZES = [
    pytest.param(Size("tiny", 60, 2, 8, 4), id="tiny"),
    pytest.param(Size("past_int32", ROWS_PAST_INT32_AT_1024, 16, 64, 32), id="past_int32", marks=pytest.mark.gpu),
]


def torch_attention(query, key, value, edge_attr, edge_index, num_dst, qk_norm, params):
    """Per destination: softmax over its edges of <norm(q), norm(k) + e> / sqrt(C), summing v + e; torch math."""
    channels = query.shape[-1]
    q_weight, q_bias, k_weight, k_bias = params
    if qk_norm == "layer":
        query = F.layer_norm(query, (channels,), q_weight, q_bias, EPS)
        key = F.layer_norm(key, (channels,), k_weight, k_bias, EPS)
    else:
        query, key = F.rms_norm(query, (channels,), q_weight, EPS), F.rms_norm(key, (channels,), k_weight, EPS)
    src, dst = edge_index
    keys, values = key[src], value[src]
    if edge_attr is not None:
        keys, values = keys + edge_attr, values + edge_attr
    scores = (query[dst] * keys).sum(-1) / math.sqrt(channels)  # [E, H]
    weights = segment_softmax(scores, dst, num_nodes=num_dst)
    return torch.zeros_like(query).index_add_(0, dst, weights[..., None] * values)


@pytest.mark.parametrize("qk_norm", ["rms", "layer"])
@pytest.mark.parametrize("size", LARGE_SIZES)
def test_past_int32_elements_matches_reference_on_the_last_rows(size, qk_norm):
    num, heads, channels = size.num_nodes, size.heads, size.channels
    edge_index = ring_with_tail(num, num, size.tail, DEVICE)
    num_edges = edge_index.shape[1]
    if size.name == "past_int32":  # node and edge tensors pass 2**31 elements
        assert num * heads * channels > 2**31 and num_edges * heads * channels > 2**31
    bf16 = dict(device=DEVICE, dtype=torch.bfloat16)
    query, key, value = (torch.randn(num, heads, channels, **bf16).requires_grad_() for _ in range(3))
    edge_attr = torch.randn(num_edges, heads, channels, **bf16).requires_grad_()
    # q weight, q bias, k weight, k bias: four tensors, weights far from 1 and biases far from 0.
    params = [shift + 0.5 * torch.randn(channels, device=DEVICE) for _ in "qk" for shift in (1.0, 0.0)]
    if qk_norm == "rms":
        params[1] = params[3] = None
    params = [p.requires_grad_() if p is not None else None for p in params]
    layout = gtnorm.GraphLayout.from_edge_index(edge_index, (num, num), search_order=False)
    # The last destinations (their edges have the highest ids and come from the last sources) and a sample.
    selection = Selection.of(edge_index, num, last_and_random(num, size.tail, 32).to(DEVICE))
    weights = torch.randn(selection.dst.numel(), heads, channels, device=DEVICE)
    names = ("q_norm_weight", "q_norm_bias", "k_norm_weight", "k_norm_bias")
    with count_launches() as launches:
        out = gtnorm.graph_transformer_attention(
            query, key, value, edge_attr, layout, qk_norm=qk_norm, eps=EPS, **dict(zip(names, params, strict=True))
        )
        (out[selection.dst].float() * weights).sum().backward()
    assert attention_ran(launches) is None, attention_ran(launches)

    def on_selection(dtype):
        """(output, gradients) of torch_attention on the selection, its leaves copies in ``dtype``."""
        leaves = [
            query[selection.dst], key[selection.src], value[selection.src], edge_attr[selection.edges],
            *(p for p in params if p is not None),
        ]  # fmt: skip
        leaves = [t.detach().to(dtype).requires_grad_() for t in leaves]
        it = iter(leaves[4:])
        local_params = [next(it) if p is not None else None for p in params]
        result = torch_attention(
            *leaves[:4], selection.local_edge_index, selection.dst.numel(), qk_norm, local_params
        )
        grads = torch.autograd.grad((result.double() * weights.double()).sum(), leaves)
        return result, grads

    reference, ref_grads = on_selection(torch.float64)
    same_dtype, same_dtype_grads = on_selection(torch.bfloat16)
    actual_grads = [
        query.grad[selection.dst], key.grad[selection.src], value.grad[selection.src], edge_attr.grad[selection.edges],
        *(p.grad for p in params if p is not None),
    ]  # fmt: skip
    labels = ["query", "key", "value", "edge_attr", *(n for n, p in zip(names, params, strict=True) if p is not None)]
    checks = [("out", out[selection.dst], same_dtype, reference)]
    checks += list(zip(labels, actual_grads, same_dtype_grads, ref_grads, strict=True))
    for label, actual, torch_bf16, expected in checks:
        if label == "k_norm_bias":  # exactly 0: the softmax cancels it (test_attention.py)
            assert torch.equal(actual, torch.zeros_like(actual))
            continue
        bound = 1.5 * rel_error(torch_bf16, expected) + 1e-3
        assert rel_error(actual, expected) <= bound, f"{label}: {rel_error(actual, expected):.2e} > {bound:.2e}"


# Determinism: a destination set of 200k nodes receiving 1 to 40 edges each (mean ~20, 4.1M edges) from 400k
# sources, 16 heads x 64 channels in bfloat16: e [4.1M, 16, 64] 8.4 GB and its gradient, two runs' results kept:
# ~30 GB. About 10 s per case on an H100.
@dataclass(frozen=True)
class DeterminismSize:
    name: str
    num_src: int
    num_dst: int
    max_degree: int
    heads: int
    channels: int


DETERMINISM_SIZES = [
    pytest.param(DeterminismSize("tiny", 30, 12, 8, 2, 8), id="tiny"),
    pytest.param(DeterminismSize("large", 400_000, 200_000, 40, 16, 64), id="large", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("edges", ["edge_attr", "projection"])
@pytest.mark.parametrize("size", DETERMINISM_SIZES)
def test_bitwise_deterministic_with_the_layout_rebuilt(size, edges):
    """Two runs, each on a layout built anew (the visiting-order search included) from a new copy of the
    edge_index: the same output and gradients bit for bit. (On the interpreter programs run one after another,
    so the tiny size checks the test's code; what it guards against, an order that depends on timing, is GPU-only.)"""
    degree = torch.randint(1, size.max_degree + 1, (size.num_dst,))
    dst = torch.arange(size.num_dst).repeat_interleave(degree)
    edge_index = torch.stack([torch.randint(0, size.num_src, (dst.numel(),)), dst]).to(DEVICE)
    edge_index = edge_index[:, torch.randperm(dst.numel(), device=DEVICE)]  # in no order
    heads, channels = size.heads, size.channels
    bf16 = dict(device=DEVICE, dtype=torch.bfloat16)
    inputs = {
        "query": torch.randn(size.num_dst, heads, channels, **bf16),
        "key": torch.randn(size.num_src, heads, channels, **bf16),
        "value": torch.randn(size.num_src, heads, channels, **bf16),
        "q_norm_weight": 1.0 + 0.5 * torch.randn(channels, device=DEVICE),
        "q_norm_bias": 0.5 * torch.randn(channels, device=DEVICE),
        "k_norm_weight": 1.0 + 0.5 * torch.randn(channels, device=DEVICE),
    }
    if edges == "edge_attr":
        inputs["edge_attr"] = torch.randn(dst.numel(), heads, channels, **bf16)
    else:
        inputs["edge_features"] = torch.randn(dst.numel(), 11, device=DEVICE)
        inputs["edge_weight"] = torch.randn(11, heads * channels, device=DEVICE) / 11**0.5
        inputs["edge_bias"] = 0.5 * torch.randn(heads * channels, device=DEVICE)
    inputs = {name: t.requires_grad_() for name, t in inputs.items()}
    grad_out = torch.randn(size.num_dst, heads, channels, **bf16)

    def run():
        layout = gtnorm.GraphLayout.from_edge_index(edge_index.clone(), (size.num_src, size.num_dst))
        with count_launches() as launches:
            out = gtnorm.graph_transformer_attention(
                inputs["query"], inputs["key"], inputs["value"], inputs.get("edge_attr"), layout, qk_norm="layer",
                eps=EPS, **{k: v for k, v in inputs.items() if k not in ("query", "key", "value", "edge_attr")},
            )  # fmt: skip
            grads = torch.autograd.grad(out, list(inputs.values()), grad_out)
        assert attention_ran(launches) is None, attention_ran(launches)
        return out.detach(), dict(zip(inputs, grads, strict=True))

    first_out, first = run()
    out, again = run()
    assert torch.equal(out, first_out)
    for name in first:
        assert torch.equal(again[name], first[name]), name
