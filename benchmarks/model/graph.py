"""The model's graph as anemoi-graphs would hand it to anemoi-models: a HeteroData with the data and hidden node
sets (``x``: latitude, longitude in radians) and the encoder, processor and decoder edges carrying the default
config's attributes ``edge_length`` [M, 1] and ``edge_dirs`` [M, 2].

Edges come from benchmarks/graphs (the cached catalog graphs: cutoff encoder, multi-scale processor, 3-nearest
decoder), their hidden nodes renumbered in the order anemoi-graphs gives them (latitude_order; before v31 of
benchmarks/NOTES.md the model's rows ran on the refinement's order, in which a mapper chunk spans the globe).
The attributes follow anemoi-graphs' definitions as its default graph config sets them up: the great-circle
length of each edge scaled to a maximum of 1 ("unit-max"), and the direction from the destination to the source
in the destination's local east/north frame scaled to unit standard deviation ("unit-std"). Their values do not
change what a step costs; their widths (1 + 2, plus the trainable parameters) do.
"""

from __future__ import annotations

import numpy as np
import torch
from torch_geometric.data import HeteroData

from benchmarks.graphs import grids
from benchmarks.graphs.catalog import GRAPH_SPECS, BenchGraph, GraphSpec, load_graph, load_spec_graph

# Model graph -> (N of the data grid O_N, refinement level r of the hidden icosahedron). O800 -> 7 is the
# resolution of Anemoi's own Triton pull request's training run; O1280 (9 km) is where users are going.
MODEL_GRAPHS = {
    "o1280_r7": (1280, 7),
    "o800_r7": (800, 7),
    "o320_r6": (320, 6),
    "o96_r5": (96, 5),
    "o2_r0": (2, 0),  # tests: small enough for the Triton interpreter
}


def _latlon(xyz: np.ndarray) -> np.ndarray:  # [N, 3] -> [N, 2] radians
    return np.stack([np.arcsin(np.clip(xyz[:, 2], -1.0, 1.0)), np.arctan2(xyz[:, 1], xyz[:, 0])], axis=1)


def edge_attributes(src_xyz: np.ndarray, dst_xyz: np.ndarray, edge_index: np.ndarray) -> dict[str, torch.Tensor]:
    """edge_length [M, 1] and edge_dirs [M, 2] (float32) of edges ``edge_index`` [2, M] (row 0 = source)."""
    src, dst = src_xyz[edge_index[0]], dst_xyz[edge_index[1]]
    length = np.arccos(np.clip((src * dst).sum(axis=1), -1.0, 1.0))
    length = length / max(length.max(), 1e-12)
    # The destination's local frame: east = z x dst (normalised), north = dst x east.
    east = np.cross(np.array([0.0, 0.0, 1.0]), dst)
    east_norm = np.linalg.norm(east, axis=1, keepdims=True)
    east = np.where(east_norm > 1e-12, east / np.maximum(east_norm, 1e-12), np.array([1.0, 0.0, 0.0]))
    north = np.cross(dst, east)
    offset = src - dst
    dirs = np.stack([(offset * east).sum(axis=1), (offset * north).sum(axis=1)], axis=1)
    dirs = dirs / max(dirs.std(), 1e-12)
    return {
        "edge_length": torch.from_numpy(length[:, None].astype(np.float32)),
        "edge_dirs": torch.from_numpy(dirs.astype(np.float32)),
    }


def build_model_graph(name: str, verbose: bool = False) -> HeteroData:
    """The HeteroData of ``name`` (a MODEL_GRAPHS key): nodes "data" and "hidden", edges data->hidden,
    hidden->hidden, hidden->data."""
    grid, level = MODEL_GRAPHS[name]
    data_xyz = grids.octahedral_grid(grid)
    refinement_xyz = grids.icosahedral_mesh(level).vertices
    hidden_order = latitude_order(_latlon(refinement_xyz))
    hidden_xyz = refinement_xyz[hidden_order]
    hidden_id = np.empty(len(hidden_order), dtype=np.int64)  # refinement order -> the graph's numbering
    hidden_id[hidden_order] = np.arange(len(hidden_order))
    graph = HeteroData()
    graph["data"].x = torch.from_numpy(_latlon(data_xyz).astype(np.float32))
    graph["hidden"].x = torch.from_numpy(_latlon(hidden_xyz).astype(np.float32))
    nodes = {"data": data_xyz, "hidden": hidden_xyz}
    parts = {
        ("data", "hidden"): GraphSpec(kind="encoder", grid=grid, level=level),
        ("hidden", "hidden"): GraphSpec(kind="processor", level=level),
        ("hidden", "data"): GraphSpec(kind="decoder", grid=grid, level=level),
    }
    for (src, dst), spec in parts.items():
        edge_index = _edges(spec, verbose).edge_index.numpy().copy()  # the loaded graph may be cached
        for row, side in enumerate((src, dst)):
            if side == "hidden":
                edge_index[row] = hidden_id[edge_index[row]]
        edge_index = edge_index[:, np.lexsort((edge_index[0], edge_index[1]))]  # by destination, then source
        edges = graph[(src, "to", dst)]
        edges.edge_index = torch.from_numpy(np.ascontiguousarray(edge_index))
        for key, value in edge_attributes(nodes[src], nodes[dst], edge_index).items():
            edges[key] = value
    return graph


def latitude_order(latlon: np.ndarray) -> np.ndarray:  # [N, 2] radians -> [N]
    """The order anemoi-graphs gives a refined icosahedron's nodes: north to south, then by longitude, descending.
    It decides what a mapper chunk holds: a chunk is a range of destinations, so in refinement order an encoder
    chunk's hidden nodes lie all over the globe and reach 34-39 % of the grid's nodes each (1.4x the grid over 4
    chunks), in this order a latitude band reaches 25 % (benchmarks/NOTES.md v31)."""
    return np.lexsort((-latlon[:, 1], -latlon[:, 0]))


def _edges(spec: GraphSpec, verbose: bool) -> BenchGraph:
    """The cached graph of that definition (the catalog's name where it has one), built and stored on a miss: the
    O1280 parts take minutes to build, and benchmarks that run each variant in its own process read them again."""
    for name, catalog_spec in GRAPH_SPECS.items():
        if catalog_spec == spec:
            return load_graph(name, verbose=verbose)
    return load_spec_graph(f"model-{spec.kind}", spec, verbose=verbose)
