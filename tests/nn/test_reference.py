"""The PyG reference against a dense computation written out edge by edge (float64, CPU).

The dense version loops over destination nodes, gathers their incoming edges, and takes torch.softmax over
them: no PyG, no scatter. Both run in float64, so they agree to rounding (tolerance 1e-12 relative), for the
output and for the gradients of every input and norm weight.
"""

from __future__ import annotations

import math

import pytest
import torch

from gtnorm.nn.reference import GraphTransformerMessagePassing, reference_graph_transformer_attention
from tests.graphs import GRAPH_BUILDERS, SmallGraph, make_graph, random_inputs

TOLERANCE = 1e-12
EPS = 1e-6


def dense_rms_norm(x, weight, eps):  # x [N, H, C], weight [C]
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight


def dense_attention(query, key, value, edge_attr, edge_index, num_dst):
    """softmax_j(<q_i, k_j + e_ij> / sqrt(C)) weighted sum of (v_j + e_ij), one destination i at a time."""
    src, dst = edge_index
    heads, channels = query.shape[1:]
    rows = []
    for i in range(num_dst):
        incoming = (dst == i).nonzero().flatten()  # [deg]
        if incoming.numel() == 0:
            rows.append(query.new_zeros(heads, channels))
            continue
        k = key[src[incoming]]  # [deg, H, C]
        v = value[src[incoming]]  # [deg, H, C]
        if edge_attr is not None:
            k = k + edge_attr[incoming]
            v = v + edge_attr[incoming]
        scores = torch.einsum("hc,ehc->eh", query[i], k) / math.sqrt(channels)  # [deg, H]
        alpha = torch.softmax(scores, dim=0)
        rows.append(torch.einsum("eh,ehc->hc", alpha, v))
    return torch.stack(rows) if rows else query.new_zeros(0, heads, channels)


def make_leaves(graph: SmallGraph, heads, channels, edge_attr=True, norm_weights=True):
    tensors = random_inputs(graph, heads, channels, edge_attr=edge_attr, norm_weights=norm_weights)
    names = {"q_norm_weight": "q_weight", "k_norm_weight": "k_weight"}
    return {names.get(k, k): v.requires_grad_() for k, v in tensors.items() if v is not None}


def rms_norm_module(weight, channels):
    """torch.nn.RMSNorm whose weight IS the given leaf (so gradients reach it)."""
    norm = torch.nn.RMSNorm(channels, eps=EPS, dtype=torch.float64)
    del norm.weight  # replace the parameter by the leaf tensor itself
    norm.weight = weight
    return norm


def grads_of(out, leaves, grad_out):
    names = list(leaves)
    return dict(zip(names, torch.autograd.grad(out, [leaves[n] for n in names], grad_out), strict=True))


def rel_error(actual, expected):
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-300)).item()


@pytest.mark.parametrize("graph_name", list(GRAPH_BUILDERS))
@pytest.mark.parametrize("heads_channels", [(1, 4), (3, 5)], ids=lambda hc: f"H{hc[0]}C{hc[1]}")
@pytest.mark.parametrize("qk_norm", [True, False], ids=["qk_norm", "no_norm"])
@pytest.mark.parametrize("edge_attr", [True, False], ids=["edge_attr", "no_edge_attr"])
def test_reference_matches_dense(graph_name, heads_channels, qk_norm, edge_attr):
    graph = make_graph(graph_name, seed=0, scale=1)
    leaves = make_leaves(graph, *heads_channels, edge_attr=edge_attr, norm_weights=qk_norm)
    q_norm = rms_norm_module(leaves["q_weight"], heads_channels[1]) if qk_norm else None
    k_norm = rms_norm_module(leaves["k_weight"], heads_channels[1]) if qk_norm else None
    out = reference_graph_transformer_attention(
        leaves["query"], leaves["key"], leaves["value"], leaves.get("edge_attr"), graph.edge_index,
        size=(graph.num_src, graph.num_dst), q_norm=q_norm, k_norm=k_norm,
    )  # fmt: skip

    query, key = leaves["query"], leaves["key"]
    if qk_norm:
        query = dense_rms_norm(query, leaves["q_weight"], EPS)
        key = dense_rms_norm(key, leaves["k_weight"], EPS)
    expected = dense_attention(query, key, leaves["value"], leaves.get("edge_attr"), graph.edge_index, graph.num_dst)

    assert out.dtype == torch.float64 and out.shape == (graph.num_dst, *heads_channels)
    assert rel_error(out, expected) < TOLERANCE
    grad_out = torch.randn_like(out)
    grads, expected_grads = grads_of(out, leaves, grad_out), grads_of(expected, leaves, grad_out)
    for name in leaves:
        assert rel_error(grads[name], expected_grads[name]) < TOLERANCE, name


def test_graph_kinds_cover_the_corner_cases():
    """The graphs above include zero in-degree destinations, self loops and duplicate edges."""
    bipartite = make_graph("random_bipartite", seed=0, scale=1)
    assert (torch.bincount(bipartite.edge_index[1], minlength=bipartite.num_dst) == 0).any()
    square = make_graph("processor_like", seed=0, scale=1)
    assert (square.edge_index[0] == square.edge_index[1]).any()
    assert torch.unique(square.edge_index, dim=1).shape[1] < square.edge_index.shape[1]


def test_zero_in_degree_destinations_get_zero():
    graph = make_graph("random_bipartite", seed=1, scale=1)
    leaves = make_leaves(graph, 2, 8, norm_weights=False)
    out = reference_graph_transformer_attention(
        leaves["query"], leaves["key"], leaves["value"], leaves["edge_attr"], graph.edge_index,
        size=(graph.num_src, graph.num_dst),
    )  # fmt: skip
    no_incoming = torch.bincount(graph.edge_index[1], minlength=graph.num_dst) == 0
    assert torch.equal(out[no_incoming], torch.zeros_like(out[no_incoming]))
    assert (out[~no_incoming] != 0).any(dim=(1, 2)).all()


def test_graph_without_edges_gives_zeros():
    edge_index = torch.zeros(2, 0, dtype=torch.long)
    query, key, value = torch.randn(4, 2, 3), torch.randn(5, 2, 3), torch.randn(5, 2, 3)
    out = reference_graph_transformer_attention(query, key, value, torch.randn(0, 2, 3), edge_index, size=(5, 4))
    assert torch.equal(out, torch.zeros(4, 2, 3))


def test_single_edge_passes_value_plus_edge_through():
    """One incoming edge: softmax weight 1, so out = v + e whatever the scores."""
    query, key, value, edge_attr = (torch.randn(n, 2, 4, dtype=torch.float64) for n in (1, 3, 3, 1))
    edge_index = torch.tensor([[2], [0]])
    out = reference_graph_transformer_attention(query, key, value, edge_attr, edge_index, size=(3, 1))
    torch.testing.assert_close(out[0], value[2] + edge_attr[0], rtol=1e-15, atol=1e-15)


def test_size_defaults_to_the_tensor_shapes():
    graph = make_graph("encoder_like", seed=2, scale=1)
    leaves = make_leaves(graph, 2, 4, norm_weights=False)
    args = (leaves["query"], leaves["key"], leaves["value"], leaves["edge_attr"], graph.edge_index)
    explicit = reference_graph_transformer_attention(*args, size=(graph.num_src, graph.num_dst))
    assert torch.equal(reference_graph_transformer_attention(*args), explicit)


def test_int32_edge_index():
    graph = make_graph("decoder_like", seed=3, scale=1)
    leaves = make_leaves(graph, 2, 4, norm_weights=False)
    args = (leaves["query"], leaves["key"], leaves["value"], leaves["edge_attr"])
    size = (graph.num_src, graph.num_dst)
    assert torch.equal(
        reference_graph_transformer_attention(*args, graph.edge_index.int(), size=size),
        reference_graph_transformer_attention(*args, graph.edge_index, size=size),
    )


def test_message_passing_module_is_stateless():
    module = GraphTransformerMessagePassing()
    assert module.state_dict() == {} and list(module.parameters()) == []
    assert module.node_dim == 0 and module.flow == "source_to_target"
