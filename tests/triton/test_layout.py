"""GraphLayout: both edge orders, their pointers back to the caller's order, and input validation."""

import pytest
import torch

from gtnorm import GraphLayout
from tests.conftest import DEVICE
from tests.graphs import GRAPH_BUILDERS, make_graph


@pytest.mark.parametrize("graph_name", list(GRAPH_BUILDERS))
def test_orders_cover_every_edge_once(graph_name):
    graph = make_graph(graph_name, scale=1)
    src, dst = graph.edge_index
    layout = GraphLayout.from_edge_index(graph.edge_index.to(DEVICE), (graph.num_src, graph.num_dst))
    assert (layout.num_src, layout.num_dst, layout.num_edges) == (graph.num_src, graph.num_dst, src.numel())

    csc_edge_id = layout.csc_edge_id.long().cpu()
    assert torch.equal(torch.sort(csc_edge_id).values, torch.arange(src.numel()))
    assert torch.equal(layout.csc_src.long().cpu(), src[csc_edge_id])
    dst_offsets = layout.dst_offsets.long().cpu()
    for node in range(graph.num_dst):
        incoming = csc_edge_id[dst_offsets[node] : dst_offsets[node + 1]]
        assert (dst[incoming] == node).all()
        assert torch.equal(incoming, torch.sort(incoming).values)  # stable: caller's order within a node

    csr_edge_id = layout.csr_edge_id.long().cpu()
    assert torch.equal(torch.sort(csr_edge_id).values, torch.arange(src.numel()))
    assert torch.equal(layout.csr_dst.long().cpu(), dst[csr_edge_id])
    src_offsets = layout.src_offsets.long().cpu()
    for node in range(graph.num_src):
        assert (src[csr_edge_id[src_offsets[node] : src_offsets[node + 1]]] == node).all()

    assert layout.max_in_degree == int(torch.bincount(dst, minlength=graph.num_dst).max())
    assert layout.max_out_degree == int(torch.bincount(src, minlength=graph.num_src).max())


def test_num_nodes_forms():
    edge_index = torch.tensor([[0, 3, 1], [2, 0, 2]])
    assert (GraphLayout.from_edge_index(edge_index).num_src, GraphLayout.from_edge_index(edge_index).num_dst) == (4, 4)
    layout = GraphLayout.from_edge_index(edge_index, 6)
    assert (layout.num_src, layout.num_dst) == (6, 6)
    layout = GraphLayout.from_edge_index(edge_index.int(), (4, 3))
    assert (layout.num_src, layout.num_dst) == (4, 3)
    empty = GraphLayout.from_edge_index(torch.zeros(2, 0, dtype=torch.long), (2, 3))
    assert empty.num_edges == 0 and empty.dst_offsets.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize(
    "edge_index, num_nodes, exc, fragment",
    [
        (torch.tensor([[0, 1, 2]]), None, ValueError, r"shape \[2, num_edges\]"),
        (torch.zeros(2, 3, 1, dtype=torch.long), None, ValueError, r"shape \[2, num_edges\]"),
        (torch.tensor([[0.0, 1.0], [1.0, 0.0]]), None, TypeError, "int64 or int32"),
        ([[0, 1], [1, 0]], None, TypeError, "must be a torch.Tensor"),
        (torch.tensor([[0, -1], [1, 0]]), None, ValueError, "negative"),
        (torch.tensor([[0, 5], [1, 0]]), (5, 3), ValueError, r"edge_index\[0\] \(source\) holds index 5"),
        (torch.tensor([[0, 1], [3, 0]]), (5, 3), ValueError, r"edge_index\[1\] \(destination\) holds index 3"),
        (torch.tensor([[0, 1], [1, 0]]), (2, 2, 2), ValueError, "num_nodes must be"),
        (torch.tensor([[0, 1], [1, 0]]), (2, -1), ValueError, "num_nodes must hold"),
        (torch.tensor([[0, 1], [1, 0]]), (2.0, 2), ValueError, "num_nodes must hold"),
    ],
)
def test_bad_edge_index_raises(edge_index, num_nodes, exc, fragment):
    with pytest.raises(exc, match=fragment):
        GraphLayout.from_edge_index(edge_index, num_nodes)
