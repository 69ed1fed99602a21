"""GraphLayout: the edge orderings the attention kernels walk, built once per graph.

The forward and the first backward pass run one destination node at a time over its incoming edges
(by destination); the second backward pass runs one source node at a time over its outgoing edges (by
source). Both walks point back into the caller's edge order, so edge features are read and their gradient
written in place, never copied into a sorted order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, eq=False)
class EdgeWalk:
    """All edges, grouped by the node at one end (the walk's node), nodes taken in a visiting order.

    The edges of the node in slot s sit at positions ``offsets[s]:offsets[s + 1]``, so a run of consecutive
    slots is one contiguous run of positions, which one kernel program walks without restarting at every
    node. Nodes without edges take the last slots, so kernels launch over the busy slots only and never branch
    on an empty one. Within a node, edges keep the caller's order.

    Shapes: N nodes on the walk's side, M edges, K nodes without edges.
    """

    offsets: torch.Tensor  # [N + 1] int32, by slot
    node_by_slot: torch.Tensor  # [N] int32: the node in each slot
    node: torch.Tensor  # [M] int32: the walk's node of each position
    neighbour: torch.Tensor  # [M] int32: the node at the edge's other end
    edge_id: torch.Tensor  # [M] int32: caller's index of the edge at each position
    without_edges: torch.Tensor  # [K] int64, ascending: nodes without edges (their rows are zero-filled)

    @property
    def num_busy(self) -> int:
        """Nodes with at least one edge: they hold slots 0 .. num_busy - 1."""
        return self.node_by_slot.numel() - self.without_edges.numel()

    def repeat(self, copies: int, num_nodes: int, num_neighbours: int) -> EdgeWalk:
        """The walk of ``copies`` disjoint copies of the graph, copy b's nodes, neighbours and edges offset by
        b times the counts (the layout of Anemoi's batch expansion ``cat([edge_index + b * inc])``). Copies are
        visited one after another in this walk's order; the nodes without edges of all copies come last."""
        num_edges, busy = self.node.numel(), self.num_busy
        copy = torch.arange(copies, device=self.node.device)[:, None]  # [copies, 1]

        def shifted(t, step):  # [n] -> [copies * n]: copy b's values plus b * step
            return (t[None, :].long() + copy * step).flatten()

        by_slot = self.node_by_slot
        node_by_slot = torch.cat([shifted(by_slot[:busy], num_nodes), shifted(by_slot[busy:], num_nodes)])
        busy_offsets = shifted(self.offsets[1 : busy + 1], num_edges)
        empty_offsets = busy_offsets.new_full((copies * (num_nodes - busy),), copies * num_edges)
        return EdgeWalk(
            offsets=torch.cat([self.offsets[:1].long(), busy_offsets, empty_offsets]).int(),
            node_by_slot=node_by_slot.int(),
            node=shifted(self.node, num_nodes).int(),
            neighbour=shifted(self.neighbour, num_neighbours).int(),
            edge_id=shifted(self.edge_id, num_edges).int(),
            without_edges=shifted(self.without_edges, num_nodes),
        )

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.offsets, self.node_by_slot, self.node, self.neighbour, self.edge_id, self.without_edges


@dataclass(frozen=True, eq=False)
class GraphLayout:
    """Both edge walks of one graph, on the graph's device: by destination (forward, first backward pass) and
    by source (second backward pass).

    Build one with :meth:`from_edge_index`; B disjoint copies of a graph (a batch) with :meth:`repeat`.
    """

    num_src: int
    num_dst: int
    num_edges: int
    by_dst: EdgeWalk  # node = destination, neighbour = source
    by_src: EdgeWalk  # node = source, neighbour = destination

    @property
    def device(self) -> torch.device:
        return self.by_dst.edge_id.device

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The index tensors in the order the attention ops take them (the by-source walk's node_by_slot is not
        one: no kernel reads it)."""
        src_offsets, _, *src_rest = self.by_src.tensors()
        return (*self.by_dst.tensors(), src_offsets, *src_rest)

    def index_bytes(self) -> int:
        """Bytes of the index arrays the kernels read: part of the traffic floor of every pass."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def edge_index(self) -> torch.Tensor:  # [2, M] int64, in the caller's edge order
        """The edge_index the layout was built from."""
        walk = self.by_dst
        edge_index = torch.empty((2, self.num_edges), dtype=torch.int64, device=self.device)
        edge_index[0, walk.edge_id.long()] = walk.neighbour.long()
        edge_index[1, walk.edge_id.long()] = walk.node.long()
        return edge_index

    def repeat(self, copies: int) -> GraphLayout:
        """The layout of ``copies`` disjoint copies of this graph, concatenated as Anemoi's batch expansion does:
        copy b's edges follow copy b - 1's, its sources are offset by b * num_src and its destinations by
        b * num_dst. Made from this layout's walks with offsets (no order search, no host sync); equal to
        the layout :meth:`from_edge_index` builds from the expanded edge_index with this layout's orders."""
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
            raise ValueError(f"copies must be a positive int, got {copies!r}")
        if copies == 1:
            return self
        # The walks hold int32 ids and offsets (EdgeWalk.repeat casts its int64 sums): past these limits they would
        # wrap. The same limits as from_edge_index's.
        largest = copies * max(self.num_src, self.num_dst, self.num_edges)
        if largest > _INT32_MAX:
            raise ValueError(
                f"{copies} copies of a graph of {self.num_src} -> {self.num_dst} nodes and {self.num_edges} edges "
                f"would have {largest} nodes or edges; at most 2**31 - 1 of each are supported"
            )
        return GraphLayout(
            num_src=copies * self.num_src,
            num_dst=copies * self.num_dst,
            num_edges=copies * self.num_edges,
            by_dst=self.by_dst.repeat(copies, self.num_dst, self.num_src),
            by_src=self.by_src.repeat(copies, self.num_src, self.num_dst),
        )

    @classmethod
    def from_edge_index(
        cls,
        edge_index: torch.Tensor,  # [2, M]: row 0 = source, row 1 = destination (PyG convention)
        num_nodes: int | Sequence[int] | None = None,
        *,
        dst_order: torch.Tensor | None = None,  # [N_dst] a permutation of the destination nodes
        src_order: torch.Tensor | None = None,  # [N_src] a permutation of the source nodes
        search_order: bool = True,
    ) -> GraphLayout:
        """Validates ``edge_index`` and builds both walks (stable sorts, so the layout is deterministic).

        ``num_nodes`` is ``(num_src, num_dst)`` for a bipartite graph, one int for a square one, or None to
        take ``max index + 1`` over both rows (PyG's rule for square graphs). ``dst_order``/``src_order`` set
        the order the kernels visit the nodes in (e.g. along a space-filling curve of the node positions, so
        that nodes visited together share neighbours). Without them, ``search_order=True`` picks one with
        :func:`visiting_order` (tens of ms on a 40k-node mesh: do it once per graph), and
        ``search_order=False`` keeps the caller's numbering (a few sorts, one host sync). Results do not depend
        on the orders, only the speed does.

        Shapes: edge_index [2, M]; dst_order [N_dst]; src_order [N_src].
        """
        check_edge_index_format(edge_index)
        num_edges = edge_index.shape[1]
        to_search = search_order and (dst_order is None or src_order is None) and num_edges > 0
        # Node ids are checked first (one sync) where an order indexes with them; the plain build needs no such
        # index and checks them with the one sync it makes anyway, at the end.
        checked = num_nodes is None or to_search or dst_order is not None or src_order is not None
        if checked:
            num_src, num_dst = check_edge_index(edge_index, num_nodes)
        else:
            num_src, num_dst = _resolve_num_nodes(num_nodes, 0)
        dst_order = _checked_order(dst_order, num_dst, "dst_order", edge_index.device)
        src_order = _checked_order(src_order, num_src, "src_order", edge_index.device)
        if checked:  # an order indexes with the ids: int64 (views of an int64 edge_index)
            src, dst = edge_index[0].long(), edge_index[1].long()
        if to_search:
            # Sources and destinations may be one node set (a processor graph): then one smoothed order serves
            # both walks. If they are not, the model simply scores that candidate low.
            smoothed = (smoothed_order(src, dst, num_dst),) if num_src == num_dst else ()
            if dst_order is None:
                dst_order = visiting_order(dst, src, num_dst, smoothed)
            if src_order is None:
                src_order = visiting_order(src, dst, num_src, smoothed)
        # A walk in the caller's numbering sorts int32 ids: half the radix passes of int64 keys, and its arrays
        # come out in the kernels' int32 with no conversions (both rows converted in one op).
        src32, dst32 = edge_index.int() if dst_order is None or src_order is None else (None, None)
        if dst_order is None:
            by_dst = _SortedEdges.of(dst32, src32, num_dst)
        else:
            by_dst = _SortedEdges.of_order(dst, src, dst_order)
        if src_order is None:
            by_src = _SortedEdges.of(src32, dst32, num_src)
        else:
            by_src = _SortedEdges.of_order(src, dst, src_order)
        counts = [by_dst.num_busy.view(1), by_src.num_busy.view(1)]
        if not checked and num_edges:
            # The range check reads the ids as given (an int64 id past int32 would wrap in the sorted copy).
            lowest, highest = torch.aminmax(edge_index, dim=1)  # [2]: source, destination
            counts += [lowest.long(), highest.long()]
        counts = torch.cat(counts).tolist()  # the build's one host sync
        if not checked and num_edges:
            lo_src, lo_dst, hi_src, hi_dst = counts[2:]
            _check_index_range(lo_src, hi_src, lo_dst, hi_dst, num_src, num_dst)
        return cls(
            num_src=num_src,
            num_dst=num_dst,
            num_edges=num_edges,
            by_dst=by_dst.walk(counts[0]),
            by_src=by_src.walk(counts[1]),
        )


@dataclass(frozen=True)
class _SortedEdges:
    """An EdgeWalk before the host knows how many nodes have edges (the one number that needs a sync)."""

    order: torch.Tensor | None  # [N] int64: the visiting order; None: the caller's numbering
    degree: torch.Tensor  # [N] int64 (int32 in the caller's numbering), by node
    positions: torch.Tensor  # [M] int64: edge ids in walk order
    node: torch.Tensor  # [M] int64 (int32 in the caller's numbering): the walk's node at each position
    neighbour: torch.Tensor  # [M]: the other end at each position, as node
    num_busy: torch.Tensor  # [] int64 on the device
    node_offsets: torch.Tensor | None  # [N + 1] int32: the offsets by node (order None only)

    @classmethod
    def of(cls, node, neighbour, num_nodes: int) -> _SortedEdges:
        """The walk in the caller's numbering, from int32 ids. Node ids need not be checked yet: nothing is
        gathered with them, and ids out of range only leave the walk (the caller raises before using it)."""
        # Sorting by node is sorting by slot when every node has edges (the common case, settled in walk()),
        # so one stable sort gives the walk, and the offsets and degrees with it.
        walk_node, positions = torch.sort(node, stable=True)
        slots = torch.arange(num_nodes + 1, dtype=torch.int32, device=node.device)
        node_offsets = torch.searchsorted(walk_node, slots, out_int32=True)
        degree = node_offsets.diff()
        num_busy = torch.count_nonzero(degree)
        return cls(None, degree, positions, walk_node, neighbour[positions], num_busy, node_offsets)

    @classmethod
    def of_order(cls, node, neighbour, order) -> _SortedEdges:
        """The walk in a visiting order (int64 ids, checked)."""
        degree = torch.zeros(order.numel(), dtype=torch.int64, device=node.device)
        degree.index_add_(0, node, torch.ones_like(node))  # integer sums: the same on every run
        positions = _walk_positions(node, order)
        num_busy = torch.count_nonzero(degree)
        return cls(order, degree, positions, node[positions], neighbour[positions], num_busy, None)

    def walk(self, num_busy: int) -> EdgeWalk:
        num_nodes = self.degree.numel()
        device = self.degree.device
        if self.order is None and num_busy == num_nodes:  # the caller's numbering, every slot busy
            offsets = self.node_offsets
            order = torch.arange(num_nodes, dtype=torch.int32, device=device)
            without_edges = torch.empty(0, dtype=torch.int64, device=device)
        else:
            order = self.order if self.order is not None else torch.arange(num_nodes, device=device)
            # Nodes without edges to the last slots; a stable sort keeps the visiting order of the rest. Within
            # a node the edges stay as sorted, so positions need no change.
            order = order[torch.argsort((self.degree[order] == 0).to(torch.int8), stable=True)]
            offsets = torch.cumsum(torch.cat([self.degree.new_zeros(1), self.degree[order]]), dim=0)
            without_edges = torch.sort(order[num_busy:]).values.long()
        return EdgeWalk(
            offsets=offsets.int(),
            node_by_slot=order.int(),
            node=self.node.int(),
            neighbour=self.neighbour.int(),
            edge_id=self.positions.int(),
            without_edges=without_edges,
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
    _check_index_range(lo_src, hi_src, lo_dst, hi_dst, num_src, num_dst)
    return num_src, num_dst


def _check_index_range(lo_src: int, hi_src: int, lo_dst: int, hi_dst: int, num_src: int, num_dst: int) -> None:
    if min(lo_src, lo_dst) < 0:
        raise ValueError("edge_index holds negative node indices")
    if hi_src >= num_src:
        raise ValueError(f"edge_index[0] (source) holds index {hi_src}, but there are {num_src} source nodes")
    if hi_dst >= num_dst:
        raise ValueError(f"edge_index[1] (destination) holds index {hi_dst}, but there are {num_dst} destination nodes")


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
