"""GraphLayout: the edge orderings the attention kernels walk, built once per graph.

The forward and the first backward pass run one destination node at a time over its incoming edges
(CSC, by destination); the second backward pass runs one source node at a time over its outgoing edges.
Both orders point back into the caller's edge order, so edge features are read and their gradient written
in place, never copied into a sorted order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, eq=False)
class GraphLayout:
    """Both edge orders of one graph, on the graph's device.

    Destination nodes are visited in ``slot`` order (a permutation of the nodes, ``dst_by_slot``): the incoming
    edges of the node in slot s sit at positions ``dst_offsets[s]:dst_offsets[s + 1]`` of the ``csc_*`` arrays,
    so a run of consecutive slots is one contiguous run of edges, which one kernel program walks without
    restarting at every node. Nodes without edges take the last slots, so kernels launch over the busy slots
    only and never branch on an empty one. Sources likewise with ``src_offsets`` and the ``csr_*`` arrays.
    """

    num_src: int
    num_dst: int
    num_edges: int
    max_in_degree: int
    max_out_degree: int
    dst_offsets: torch.Tensor  # [N_dst + 1] int32, by slot
    dst_by_slot: torch.Tensor  # [N_dst] int32: the destination node in each slot
    csc_dst: torch.Tensor  # [M] int32: destination of each edge, by destination slot
    csc_src: torch.Tensor  # [M] int32: source of each edge, by destination slot
    csc_edge_id: torch.Tensor  # [M] int32: caller's index of each edge, by destination slot
    dst_without_edges: torch.Tensor  # [K_dst] int64: destinations with no incoming edge (their output is 0)
    src_offsets: torch.Tensor  # [N_src + 1] int32, by slot
    csr_src: torch.Tensor  # [M] int32: source of each edge, by source slot
    csr_dst: torch.Tensor  # [M] int32: destination of each edge, by source slot
    csr_edge_id: torch.Tensor  # [M] int32: caller's index of each edge, by source slot
    src_without_edges: torch.Tensor  # [K_src] int64: sources with no outgoing edge (their gradients are 0)

    @property
    def device(self) -> torch.device:
        return self.csc_src.device

    @property
    def dst_with_edges(self) -> int:
        """Destinations with at least one incoming edge: they hold slots 0 .. dst_with_edges - 1."""
        return self.num_dst - self.dst_without_edges.numel()

    @property
    def mean_in_degree(self) -> float:
        return self.num_edges / max(self.num_dst, 1)

    @property
    def mean_out_degree(self) -> float:
        return self.num_edges / max(self.num_src, 1)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The index tensors in the order the attention ops take them."""
        return (
            self.dst_offsets, self.dst_by_slot, self.csc_dst, self.csc_src, self.csc_edge_id, self.dst_without_edges,
            self.src_offsets, self.csr_src, self.csr_dst, self.csr_edge_id, self.src_without_edges,
        )  # fmt: skip

    def index_bytes(self) -> int:
        """Bytes of the index arrays the kernels read: part of the traffic floor of every pass."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    @classmethod
    def from_edge_index(
        cls,
        edge_index: torch.Tensor,  # [2, M]: row 0 = source, row 1 = destination (PyG convention)
        num_nodes: int | Sequence[int] | None = None,
        *,
        dst_order: torch.Tensor | None = None,  # [N_dst] a permutation of the destination nodes
        src_order: torch.Tensor | None = None,  # [N_src] a permutation of the source nodes
    ) -> GraphLayout:
        """Validates ``edge_index`` and builds both orders (stable sorts, so the layout is deterministic).

        ``num_nodes`` is ``(num_src, num_dst)`` for a bipartite graph, one int for a square one, or None to
        take ``max index + 1`` over both rows (PyG's rule for square graphs). ``dst_order``/``src_order`` set
        the order the kernels visit the nodes in (e.g. along a space-filling curve of the node positions, so
        that nodes visited together share neighbours); by default :func:`visiting_order` picks one. Results do
        not depend on the orders, only the speed does.
        """
        num_src, num_dst = check_edge_index(edge_index, num_nodes)
        src, dst = edge_index[0].long(), edge_index[1].long()
        in_degree = torch.bincount(dst, minlength=num_dst)
        out_degree = torch.bincount(src, minlength=num_src)
        dst_order = _checked_order(dst_order, num_dst, "dst_order", dst.device)
        src_order = _checked_order(src_order, num_src, "src_order", src.device)
        # Sources and destinations may be one node set (a processor graph): then one smoothed order serves both
        # walks. If they are not, the model simply scores that candidate low. Skipped when the caller gave both.
        to_pick = dst_order is None or src_order is None
        smoothed = (smoothed_order(src, dst, num_dst),) if to_pick and num_src == num_dst and src.numel() else ()
        if dst_order is None:
            dst_order = visiting_order(dst, src, num_dst, smoothed)
        if src_order is None:
            src_order = visiting_order(src, dst, num_src, smoothed)
        by_dst = _edge_walk(dst, src, dst_order, in_degree)
        by_src = _edge_walk(src, dst, src_order, out_degree)
        return cls(
            num_src=num_src,
            num_dst=num_dst,
            num_edges=src.numel(),
            max_in_degree=int(in_degree.max()) if num_dst else 0,
            max_out_degree=int(out_degree.max()) if num_src else 0,
            dst_offsets=by_dst[0],
            dst_by_slot=by_dst[1],
            csc_dst=by_dst[2],
            csc_src=by_dst[3],
            csc_edge_id=by_dst[4],
            dst_without_edges=by_dst[5],
            src_offsets=by_src[0],
            csr_src=by_src[2],
            csr_dst=by_src[3],
            csr_edge_id=by_src[4],
            src_without_edges=by_src[5],
        )


# Edges between two uses of a gathered row for which the row is assumed to still be in L2: an H100's 50 MB
# over what an edge brings in (its e row plus ~0.6 new k and v rows: ~4.5 KiB at H * C = 1024 in bf16) is
# about 12k edges. A window of 4k rejected the mean-neighbour order of the largest encoder, which measured
# 20 % faster in the forward (benchmarks/NOTES.md, v4); 8k-16k pick the same orders on all benchmark graphs.
_CACHE_WINDOW_EDGES = 12288
# A reordering must save this share of the modelled misses to replace the caller's own node order.
_MIN_GAIN = 0.05
# Smoothing moves a node's rank about one hop per sweep, so a mesh needs sweeps on the order of its diameter,
# ~sqrt(nodes), to settle (the benchmark's processor: 0.16 modelled misses after 50, 0.13 after 200).
_MIN_SMOOTHING_SWEEPS = 32


def visiting_order(
    node: torch.Tensor,  # [M] int64: the node each edge belongs to in this walk
    neighbour: torch.Tensor,  # [M] int64: the node at the edge's other end, whose rows the walk gathers
    num_nodes: int,
    candidates: Sequence[torch.Tensor] = (),  # more [num_nodes] orders to score
) -> torch.Tensor:  # [num_nodes] int64: the nodes in visiting order
    """The order in which the kernels walk the nodes, chosen so that gathered rows are reused while cached.

    Candidates: the caller's node order, the nodes sorted by the mean or by the smallest index of their
    neighbours (nodes that share neighbours become adjacent, e.g. hidden nodes of an encoder whose data nodes
    are numbered row by row), and ``candidates``. Each is scored by a reuse-distance model: a gather misses
    unless the same row was gathered at most _CACHE_WINDOW_EDGES steps before. Measured (benchmarks/NOTES.md,
    v2, v4 and v5), the model ranks the orders as the kernels' times do on the benchmark graphs.
    """
    identity = torch.arange(num_nodes, device=node.device)
    if node.numel() == 0:
        return identity
    degree = torch.bincount(node, minlength=num_nodes).clamp_min(1)
    mean_neighbour = torch.zeros(num_nodes, dtype=torch.float64, device=node.device)
    mean_neighbour.index_add_(0, node, neighbour.double())
    mean_neighbour /= degree
    min_neighbour = torch.full((num_nodes,), neighbour.numel(), dtype=torch.int64, device=node.device)
    min_neighbour.scatter_reduce_(0, node, neighbour, reduce="amin")
    best, best_misses = identity, _modelled_misses(node, neighbour, identity)
    for order in (torch.argsort(mean_neighbour, stable=True), torch.argsort(min_neighbour, stable=True), *candidates):
        misses = _modelled_misses(node, neighbour, order)
        if misses < (1 - _MIN_GAIN) * best_misses:
            best, best_misses = order, misses
    return best


def smoothed_order(
    src: torch.Tensor,  # [M] int64
    dst: torch.Tensor,  # [M] int64
    num_nodes: int,
) -> torch.Tensor:  # [num_nodes] int64
    """The nodes of a graph whose sources and destinations are one node set, sorted by where repeated
    smoothing puts them: each sweep moves every node to the mean rank of its neighbours and ranks again.

    Nodes end up near their neighbours, as along a space-filling curve of the node positions, which the layout
    does not have. It refines the caller's order: ids with coarse structure (a mesh numbered by refinement
    level, grid rows in any order) settle in ~sqrt(nodes) sweeps, while from random ids it finds little and the
    model then keeps another candidate. On the benchmark's processor graph the modelled misses fall from 0.45
    (best of the other candidates) to 0.13, against 0.125 compulsory and 0.14 for a Morton order of the real
    coordinates. Ranks are summed as integers, so the order is the same on every run and device.
    """
    node, neighbour = torch.cat([dst, src]), torch.cat([src, dst])
    degree = torch.bincount(node, minlength=num_nodes).clamp_min(1).double()
    order = torch.arange(num_nodes, device=src.device)
    rank = torch.empty_like(order)
    for _ in range(max(_MIN_SMOOTHING_SWEEPS, math.isqrt(num_nodes))):
        rank[order] = torch.arange(num_nodes, device=src.device)
        rank_sum = torch.zeros_like(order).index_add_(0, node, rank[neighbour])
        order = torch.argsort(rank_sum.double() / degree, stable=True)
    return order


def _modelled_misses(node, neighbour, order) -> int:
    stream = neighbour[_walk_positions(node, order)]
    by_row = torch.argsort(stream, stable=True)  # positions of each row's uses, in walk order
    same_row = stream[by_row[1:]] == stream[by_row[:-1]]
    reused = same_row & (by_row[1:] - by_row[:-1] <= _CACHE_WINDOW_EDGES)
    return stream.numel() - int(reused.sum())


def _walk_positions(node, order):
    """Edge indices sorted by the visiting slot of their node (stable: caller's order within a node)."""
    slot_of_node = torch.empty_like(order)
    slot_of_node[order] = torch.arange(order.numel(), device=order.device)
    return torch.argsort(slot_of_node[node], stable=True)


def _checked_order(order, num_nodes: int, name: str, device) -> torch.Tensor | None:
    if order is None:
        return None
    if not isinstance(order, torch.Tensor) or order.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be an int64 or int32 tensor")
    order = order.to(device=device, dtype=torch.int64)
    if order.shape != (num_nodes,) or not torch.equal(torch.sort(order).values, torch.arange(num_nodes, device=device)):
        raise ValueError(f"{name} must be a permutation of the {num_nodes} nodes")
    return order


def _edge_walk(node, neighbour, order, degree):
    """(offsets by slot, node by slot, node, neighbour and caller's edge id of every position, nodes without
    edges); the nodes without edges move to the last slots."""
    has_edges = degree[order] > 0
    order = torch.cat([order[has_edges], order[~has_edges]])
    positions = _walk_positions(node, order)
    return (
        _offsets(degree[order]),
        order.int(),
        node[positions].int(),
        neighbour[positions].int(),
        positions.int(),
        torch.nonzero(degree == 0).flatten(),
    )


def check_edge_index(
    edge_index: torch.Tensor,  # [2, M]: row 0 = source, row 1 = destination
    num_nodes: int | Sequence[int] | None = None,
) -> tuple[int, int]:
    """Checks type, shape and index range of ``edge_index`` (one device sync) and returns (num_src, num_dst),
    resolving ``num_nodes`` as :meth:`GraphLayout.from_edge_index` documents."""
    check_edge_index_format(edge_index)
    if edge_index.shape[1] > 0:
        src, dst = edge_index[0], edge_index[1]
        lo_src, hi_src, lo_dst, hi_dst = torch.stack([src.min(), src.max(), dst.min(), dst.max()]).tolist()
    else:
        lo_src = lo_dst = 0
        hi_src = hi_dst = -1
    num_src, num_dst = _resolve_num_nodes(num_nodes, max(hi_src, hi_dst) + 1)
    if min(lo_src, lo_dst) < 0:
        raise ValueError("edge_index holds negative node indices")
    if hi_src >= num_src:
        raise ValueError(f"edge_index[0] (source) holds index {hi_src}, but there are {num_src} source nodes")
    if hi_dst >= num_dst:
        raise ValueError(f"edge_index[1] (destination) holds index {hi_dst}, but there are {num_dst} destination nodes")
    return num_src, num_dst


def check_edge_index_format(edge_index: torch.Tensor) -> None:  # [2, M]
    """The checks that need no device sync: a tensor, shape [2, M], an integer type the kernels read."""
    if not isinstance(edge_index, torch.Tensor):
        raise TypeError(f"edge_index must be a torch.Tensor, got {type(edge_index).__name__}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, num_edges], got {list(edge_index.shape)}")
    if edge_index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"edge_index must be int64 or int32, got {edge_index.dtype}")
    if edge_index.shape[1] > _INT32_MAX:
        raise ValueError(f"edge_index has {edge_index.shape[1]} edges; at most 2**31 - 1 are supported")


def _resolve_num_nodes(num_nodes, inferred: int) -> tuple[int, int]:
    if num_nodes is None:
        return inferred, inferred
    if isinstance(num_nodes, int):
        pair = (num_nodes, num_nodes)
    else:
        pair = tuple(num_nodes)
        if len(pair) != 2:
            raise ValueError(f"num_nodes must be an int or (num_src, num_dst), got {num_nodes!r}")
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= _INT32_MAX for n in pair):
        raise ValueError(f"num_nodes must hold non-negative ints below 2**31, got {num_nodes!r}")
    return pair


def _offsets(degree: torch.Tensor) -> torch.Tensor:
    offsets = torch.zeros(degree.numel() + 1, dtype=torch.int32, device=degree.device)
    offsets[1:] = torch.cumsum(degree, dim=0)
    return offsets
