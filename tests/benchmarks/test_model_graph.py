"""The model benchmark's graph (benchmarks/model/graph.py) numbers its hidden nodes as anemoi-graphs numbers a refined
icosahedron's (north to south, then by longitude descending), so that a mapper chunk, a range of destinations, is
the latitude band it is in Anemoi's graphs; the edges stay the same edges, sorted by destination."""

from __future__ import annotations

import numpy as np
import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

import torch  # noqa: E402
from anemoi.models.distributed.khop_edges import build_graph_partition  # noqa: E402

from benchmarks.graphs import grids  # noqa: E402
from benchmarks.graphs.catalog import GraphSpec  # noqa: E402
from benchmarks.model import graph as model_graph  # noqa: E402

PARTS = {  # edge type -> the catalog definition of its edges (hidden nodes in refinement order)
    ("data", "hidden"): GraphSpec(kind="encoder", grid=96, level=5),
    ("hidden", "hidden"): GraphSpec(kind="processor", level=5),
    ("hidden", "data"): GraphSpec(kind="decoder", grid=96, level=5),
}


@pytest.fixture(scope="module")
def graph():
    return model_graph.build_model_graph("o96_r5")


def test_latitude_order_is_north_to_south_then_longitude_descending():
    latlon = np.array([[0.0, 1.0], [0.5, -2.0], [-0.5, 0.0], [0.5, 3.0], [0.0, -1.0]])
    assert model_graph.latitude_order(latlon).tolist() == [3, 1, 0, 4, 2]


def test_hidden_nodes_in_latitude_order(graph):
    latitude = graph["hidden"].x[:, 0]  # float32 of the order's float64: ties may fall either way
    assert (latitude[1:] <= latitude[:-1]).all() and latitude[0] > latitude[-1]


@pytest.mark.parametrize("edge_type", list(PARTS))
def test_the_same_edges_relabelled_and_sorted_by_destination(graph, edge_type):
    src, dst = edge_type
    edge_index = graph[(src, "to", dst)].edge_index
    key = edge_index[1] * (edge_index[0].max() + 1) + edge_index[0]
    assert (key[1:] > key[:-1]).all(), "sorted by destination, then source, no duplicates"
    points = {"data": graph["data"].x.numpy(), "hidden": graph["hidden"].x.numpy()}
    refinement = {**points, "hidden": model_graph._latlon(grids.icosahedral_mesh(5).vertices).astype(np.float32)}

    def endpoint_pairs(index, nodes):  # every edge as (source lat, lon, destination lat, lon), sorted
        pairs = np.concatenate([nodes[src][index[0]], nodes[dst][index[1]]], axis=1)
        return pairs[np.lexsort(pairs.T[::-1])]

    original = model_graph._edges(PARTS[edge_type], verbose=False).edge_index.numpy()
    assert np.array_equal(endpoint_pairs(edge_index.numpy(), points), endpoint_pairs(original, refinement))


def test_encoder_chunks_are_latitude_bands(graph):
    edge_index = graph[("data", "to", "hidden")].edge_index
    num_src, num_dst = graph["data"].x.shape[0], graph["hidden"].x.shape[0]
    partition = build_graph_partition(edge_index, num_parts=4, num_nodes=(num_src, num_dst))
    reached = sum(torch.unique(edge_index[0, partition._get_edge_range(i)]).numel() for i in range(4))
    assert reached < 1.05 * num_src  # in refinement order 1.40x: 34-39 % of the grid a chunk
