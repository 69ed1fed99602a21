"""GraphLayout: both edge orders, their pointers back to the caller's order, and input validation."""

import pytest
import torch

from gtnorm import GraphLayout
from gtnorm.triton.layout import (
    _CACHE_WINDOW_EDGES,
    check_edge_index,
    check_edge_index_format,
    smoothed_order,
    visiting_order,
)
from tests.conftest import DEVICE
from tests.graphs import GRAPH_BUILDERS, make_graph


def _check_walk(offsets, walk_node, walk_neighbour, edge_id, without_edges, node, neighbour, num_nodes):
    """One walk of the layout: slots cover every node once, a slot's positions hold exactly that node's edges
    in the caller's order, and every position points back at its edge."""
    offsets, walk_node, edge_id = offsets.long().cpu(), walk_node.long().cpu(), edge_id.long().cpu()
    assert torch.equal(torch.sort(edge_id).values, torch.arange(node.numel()))
    assert torch.equal(walk_node, node[edge_id])
    assert torch.equal(walk_neighbour.long().cpu(), neighbour[edge_id])
    degree = torch.bincount(node, minlength=num_nodes)
    visited = []
    for slot in range(num_nodes):
        edges = edge_id[offsets[slot] : offsets[slot + 1]]
        if edges.numel():
            assert (node[edges] == node[edges[0]]).all()
            assert edges.numel() == degree[node[edges[0]]]
            assert torch.equal(edges, torch.sort(edges).values)  # stable: caller's order within a node
            visited.append(int(node[edges[0]]))
    assert len(set(visited)) == len(visited)
    assert sorted(visited + without_edges.cpu().tolist()) == list(range(num_nodes))
    assert torch.equal(without_edges.cpu(), torch.nonzero(degree == 0).flatten())


@pytest.mark.parametrize("graph_name", list(GRAPH_BUILDERS))
@pytest.mark.parametrize("order_kind", ["searched", "caller", "given"])
def test_walks_cover_every_edge_once(graph_name, order_kind):
    graph = make_graph(graph_name, scale=1)
    src, dst = graph.edge_index
    given_order = order_kind == "given"
    orders = {}
    if given_order:
        orders = dict(dst_order=torch.randperm(graph.num_dst), src_order=torch.randperm(graph.num_src))
    layout = GraphLayout.from_edge_index(
        graph.edge_index.to(DEVICE), (graph.num_src, graph.num_dst), search_order=order_kind == "searched", **orders
    )
    assert (layout.num_src, layout.num_dst, layout.num_edges) == (graph.num_src, graph.num_dst, src.numel())
    for walk, node, neighbour, num_nodes, order in (
        (layout.by_dst, dst, src, graph.num_dst, orders.get("dst_order")),
        (layout.by_src, src, dst, graph.num_src, orders.get("src_order")),
    ):
        _check_walk(walk.offsets, walk.node, walk.neighbour, walk.edge_id, walk.without_edges, node, neighbour,
                    num_nodes)  # fmt: skip
        # node_by_slot names each slot's node: the busy slots come first, in the given order when there is one.
        by_slot = walk.node_by_slot.long().cpu()
        offsets = walk.offsets.long().cpu()
        busy = walk.num_busy
        assert torch.equal(torch.sort(by_slot).values, torch.arange(num_nodes))
        assert torch.equal(walk.node.long().cpu()[offsets[:busy]], by_slot[:busy])
        assert (offsets[1 : busy + 1] > offsets[:busy]).all() and (offsets[busy:] == src.numel()).all()
        if given_order:
            has_edges = torch.bincount(node, minlength=num_nodes)[order] > 0
            assert torch.equal(by_slot[:busy], order[has_edges])
        if order_kind == "caller":
            assert torch.equal(by_slot[:busy], torch.unique(node))
    assert torch.equal(layout.edge_index().cpu(), graph.edge_index)


def test_visiting_order_groups_nodes_that_share_neighbours():
    # Destination d reads sources 4 * (d % half) ... + 3: in the caller's order, nodes sharing sources are
    # 4 * half edges apart (past the cache window of the model); sorted by their neighbours they become adjacent.
    half = _CACHE_WINDOW_EDGES // 2
    num_dst = 2 * half
    dst = torch.arange(num_dst).repeat_interleave(4)
    src = 4 * (dst % half) + torch.arange(4).repeat(num_dst)
    order = visiting_order(dst, src, num_dst)
    slot = torch.empty_like(order)
    slot[order] = torch.arange(num_dst)
    assert ((slot[:half] - slot[half:]).abs() == 1).all()
    # Already local: the caller's order is kept.
    assert torch.equal(visiting_order(src, dst, int(src.max()) + 1), torch.arange(int(src.max()) + 1))


def _grid_graph_with_shuffled_rows(side: int):
    """A side x side grid with 4 neighbours (both directions), its rows numbered in a random order: node ids
    keep some structure (a row is contiguous), but neighbouring rows are far apart. Returns src, dst, nodes."""
    row_label = torch.randperm(side, generator=torch.Generator().manual_seed(0))
    ids = row_label[:, None] * side + torch.arange(side)[None, :]
    pairs = torch.cat([torch.stack([ids[:, :-1].flatten(), ids[:, 1:].flatten()]),
                       torch.stack([ids[:-1].flatten(), ids[1:].flatten()])], dim=1)  # fmt: skip
    return torch.cat([pairs[0], pairs[1]]), torch.cat([pairs[1], pairs[0]]), side * side


def test_smoothed_order_brings_neighbours_together():
    src, dst, num_nodes = _grid_graph_with_shuffled_rows(128)
    order = smoothed_order(src, dst, num_nodes)
    assert torch.equal(torch.sort(order).values, torch.arange(num_nodes))
    assert torch.equal(smoothed_order(src, dst, num_nodes), order)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(num_nodes)
    # Neighbours are ~side^2 / 3 apart in the given ids (64 in row-major order).
    assert (src - dst).abs().double().mean() > 2000
    assert (rank[src] - rank[dst]).abs().double().mean() < 400
    # The layout takes it: the graph has more edges than the model's cache window, so the order matters.
    assert src.numel() > 2 * _CACHE_WINDOW_EDGES
    layout = GraphLayout.from_edge_index(torch.stack([src, dst]), num_nodes)
    assert torch.equal(layout.by_dst.node_by_slot.long(), order)


def test_bad_order_raises():
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(ValueError, match="permutation"):
        GraphLayout.from_edge_index(edge_index, 3, dst_order=torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="permutation"):
        GraphLayout.from_edge_index(edge_index, 3, src_order=torch.arange(4))
    with pytest.raises(TypeError, match="int64 or int32"):
        GraphLayout.from_edge_index(edge_index, 3, src_order=torch.arange(3.0))


def test_num_nodes_forms():
    edge_index = torch.tensor([[0, 3, 1], [2, 0, 2]])
    assert (GraphLayout.from_edge_index(edge_index).num_src, GraphLayout.from_edge_index(edge_index).num_dst) == (4, 4)
    layout = GraphLayout.from_edge_index(edge_index, 6)
    assert (layout.num_src, layout.num_dst) == (6, 6)
    layout = GraphLayout.from_edge_index(edge_index.int(), (4, 3))
    assert (layout.num_src, layout.num_dst) == (4, 3)
    empty = GraphLayout.from_edge_index(torch.zeros(2, 0, dtype=torch.long), (2, 3))
    assert empty.num_edges == 0 and empty.by_dst.offsets.tolist() == [0, 0, 0, 0]


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
        # An int64 id that would wrap into range as int32 (the plain build sorts int32 copies of the ids).
        (torch.tensor([[0, 2**32 + 1], [1, 0]]), (5, 3), ValueError, r"holds index 4294967297"),
        (torch.tensor([[0, 1], [1, -(2**32) + 2]]), (5, 3), ValueError, "negative"),
        (torch.tensor([[0, 1], [1, 0]]), (2, 2, 2), ValueError, "num_nodes must be"),
        (torch.tensor([[0, 1], [1, 0]]), (2, -1), ValueError, "num_nodes must hold"),
        (torch.tensor([[0, 1], [1, 0]]), (2.0, 2), ValueError, "num_nodes must hold"),
    ],
)
@pytest.mark.parametrize("search_order", [True, False])
def test_bad_edge_index_raises(edge_index, num_nodes, exc, fragment, search_order):
    # Without the search, ids are checked after the build's work (clamped until then): the same errors.
    with pytest.raises(exc, match=fragment):
        GraphLayout.from_edge_index(edge_index, num_nodes, search_order=search_order)


@pytest.mark.parametrize("graph_name", list(GRAPH_BUILDERS))
def test_plain_build_is_the_same_from_int32_and_int64_ids(graph_name):
    graph = make_graph(graph_name, scale=1)
    sizes = (graph.num_src, graph.num_dst)
    wide = GraphLayout.from_edge_index(graph.edge_index.to(DEVICE), sizes, search_order=False)
    narrow = GraphLayout.from_edge_index(graph.edge_index.int().to(DEVICE), sizes, search_order=False)
    for a, b in zip(wide.tensors(), narrow.tensors(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert [t.dtype for t in wide.by_dst.tensors()] == [torch.int32] * 5 + [torch.int64]


def _expanded(edge_index: torch.Tensor, num_src: int, num_dst: int, copies: int) -> torch.Tensor:
    """Anemoi's batch expansion: copies concatenated along the edges, node ids offset per copy."""
    increment = torch.tensor([[num_src], [num_dst]])
    return torch.cat([edge_index + b * increment for b in range(copies)], dim=1)


@pytest.mark.parametrize("graph_name", list(GRAPH_BUILDERS))
@pytest.mark.parametrize("copies", [1, 3])
def test_repeat_equals_layout_of_expanded_graph(graph_name, copies):
    graph = make_graph(graph_name, scale=1)
    base = GraphLayout.from_edge_index(graph.edge_index.to(DEVICE), (graph.num_src, graph.num_dst))
    repeated = base.repeat(copies)
    expanded = _expanded(graph.edge_index, graph.num_src, graph.num_dst, copies).to(DEVICE)

    def copied_order(walk, num_nodes):  # the base's visiting order, copy after copy
        return torch.cat([walk.node_by_slot.long().cpu() + b * num_nodes for b in range(copies)])

    built = GraphLayout.from_edge_index(
        expanded, (copies * graph.num_src, copies * graph.num_dst),
        dst_order=copied_order(base.by_dst, graph.num_dst), src_order=copied_order(base.by_src, graph.num_src),
    )  # fmt: skip
    assert (repeated.num_src, repeated.num_dst, repeated.num_edges) == (built.num_src, built.num_dst, built.num_edges)
    for got, want in zip(repeated.by_dst.tensors() + repeated.by_src.tensors(),
                         built.by_dst.tensors() + built.by_src.tensors(), strict=True):  # fmt: skip
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert torch.equal(repeated.edge_index(), expanded)


def test_repeat_rejects_bad_counts():
    layout = GraphLayout.from_edge_index(torch.tensor([[0, 1], [1, 0]]))
    for copies in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="copies must be a positive int"):
            layout.repeat(copies)


# The layout's size limits: ids and offsets are int32, so at most 2**31 - 1 edges and nodes per side. Checked
# without memory: an expanded [2, M] view holds one column.
LIMIT = 2**31 - 1


def test_edge_count_limit():
    at_limit = torch.zeros(2, 1, dtype=torch.long).expand(2, LIMIT)
    check_edge_index_format(at_limit)  # the format check reads only the shape
    with pytest.raises(ValueError, match=r"2147483648 edges; at most 2\*\*31 - 1"):
        GraphLayout.from_edge_index(torch.zeros(2, 1, dtype=torch.long).expand(2, LIMIT + 1), (1, 1))


@pytest.mark.parametrize("num_nodes", [(LIMIT + 1, 2), (2, LIMIT + 1), LIMIT + 1])
def test_node_count_limit(num_nodes):
    edge_index = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="below 2\\*\\*31"):
        GraphLayout.from_edge_index(edge_index, num_nodes, search_order=False)
    assert check_edge_index(edge_index, (LIMIT, 2)) == (LIMIT, 2)  # the largest count is taken


def test_repeat_limit():
    """A batch of copies past the limits raises instead of wrapping the int32 ids and offsets."""
    layout = GraphLayout.from_edge_index(torch.tensor([[0, 1, 1], [1, 0, 1]]), (2, 2), search_order=False)
    most = LIMIT // 3  # 3 edges per copy
    with pytest.raises(ValueError, match=r"at most 2\*\*31 - 1"):
        layout.repeat(most + 1)
    assert layout.repeat(4).num_edges == 12
