"""Layouts reused by graph content: a new edge_index tensor that holds a graph seen before gets its layout.

Models hand the attention a new edge_index tensor every step (Anemoi expands its graph into batch copies with a
fresh ``torch.cat``, clones it per mapper chunk, and runs again under checkpoint recompute or
``torch.inference_mode``), so a cache keyed on tensor identity alone misses every time. Here a lookup is:

1. identity: the same tensor (memory, shape, strides, dtype, version counter, alive) as an earlier call: a hit
   with no host sync;
2. content: compared element for element on the device with every cached graph of matching size, and with
   B disjoint copies of every cached graph (Anemoi's batch expansion): one host sync, then a hit;
3. a new graph: its layout is built (with the visiting-order search, once per graph) and cached.

B copies of a cached graph get :meth:`GraphLayout.repeat` of its layout: no new search. Content is compared
exactly, so a different graph of the same shape, or a tensor changed in place, never gets another's layout.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from torch import Tensor

from gtnorm.triton.layout import EdgeWalk, GraphLayout, _resolve_num_nodes, check_edge_index_format


@dataclass(eq=False)
class _CachedGraph:
    edge_index: Tensor  # [2, M]: a private copy of the content, to compare new tensors with
    num_src: int
    num_dst: int
    layouts: dict[int, GraphLayout] = field(default_factory=dict)  # by number of copies; 1: the graph itself

    @property
    def num_edges(self) -> int:
        return self.edge_index.shape[1]

    def copies_in(self, num_edges: int, num_src: int, num_dst: int) -> int:
        """How many copies of this graph a graph of these sizes would be; 0 if it cannot be copies of it."""
        if self.num_edges == 0:
            return 1 if (num_edges, num_src, num_dst) == (0, self.num_src, self.num_dst) else 0
        copies, rest = divmod(num_edges, self.num_edges)
        if rest or copies == 0 or (num_src, num_dst) != (copies * self.num_src, copies * self.num_dst):
            return 0
        return copies

    def holds(self, edge_index: Tensor, copies: int) -> Tensor:  # [] bool on the device
        """Whether edge_index is ``copies`` copies of this graph, concatenated with per-copy node offsets."""
        if self.num_edges == 0:
            return torch.ones((), dtype=torch.bool, device=edge_index.device)
        step = torch.tensor([self.num_src, self.num_dst], device=edge_index.device)
        offsets = step[:, None, None] * torch.arange(copies, device=edge_index.device)[None, :, None]
        return (edge_index.reshape(2, copies, self.num_edges) == self.edge_index[:, None, :] + offsets).all()

    def layout(self, copies: int) -> GraphLayout:
        if copies not in self.layouts:
            self.layouts[copies] = self.layouts[1].repeat(copies)
        return self.layouts[copies]


@dataclass(eq=False)
class _Alias:
    """A tensor already matched to a cached graph, found again by identity."""

    edge_index: weakref.ref
    graph: _CachedGraph
    copies: int


class LayoutCache:
    """An LRU of graph layouts, looked up by the content of edge_index (module docstring).

    ``max_graphs`` bounds the memory: each graph keeps a copy of its edge_index and its layouts (about 40 bytes
    per edge, plus 24 per edge for each batch size of copies in use). A model has a few graphs (processor,
    encoder, decoder, each mapper chunk); 32 leaves room for several models.
    """

    def __init__(self, max_graphs: int = 32):
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[int, _CachedGraph] = OrderedDict()  # by id(), least recently used first
        self._aliases: dict[tuple, _Alias] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        with self._lock:
            self._graphs.clear()
            self._aliases.clear()

    def get(self, edge_index: Tensor, num_src: int, num_dst: int) -> GraphLayout:  # edge_index [2, M]
        """The layout of the graph in edge_index, with (num_src, num_dst) nodes; built on first sight."""
        key = _identity_key(edge_index, num_src, num_dst)
        if key is not None:
            with self._lock:
                alias = self._aliases.get(key)
                if alias is not None and alias.edge_index() is not None:
                    self._graphs.move_to_end(id(alias.graph))
                    return alias.graph.layout(alias.copies)

        with self._lock:
            self._drop_dead_aliases()
            candidates = [
                (graph, copies)
                for graph in self._graphs.values()
                if graph.edge_index.device == edge_index.device
                and (copies := graph.copies_in(edge_index.shape[1], num_src, num_dst))
            ]
        match = _first_match(edge_index, candidates)
        if match is None:
            match = (self._add(edge_index, num_src, num_dst), 1)
        graph, copies = match
        with self._lock:
            layout = graph.layout(copies)
            if id(graph) in self._graphs:
                self._graphs.move_to_end(id(graph))
            if key is not None:
                self._aliases[key] = _Alias(weakref.ref(edge_index), graph, copies)
        return layout

    def _add(self, edge_index: Tensor, num_src: int, num_dst: int) -> _CachedGraph:
        # Built outside inference mode, so that a layout first met during inference serves training later (the
        # autograd of the attention saves its index tensors, which inference tensors cannot be).
        with torch.inference_mode(False):
            layout = GraphLayout.from_edge_index(edge_index, (num_src, num_dst))
            graph = _CachedGraph(edge_index.clone(), num_src, num_dst, {1: layout})
        with self._lock:
            self._graphs[id(graph)] = graph
            while len(self._graphs) > self.max_graphs:
                _, evicted = self._graphs.popitem(last=False)
                for k in [k for k, alias in self._aliases.items() if alias.graph is evicted]:
                    del self._aliases[k]
        return graph

    def _drop_dead_aliases(self) -> None:
        # Done on the content path only (once per new tensor), so that the identity hit stays a dict lookup.
        for k in [k for k, alias in self._aliases.items() if alias.edge_index() is None]:
            del self._aliases[k]


def _identity_key(edge_index: Tensor, num_src: int, num_dst: int) -> tuple | None:
    """What identifies a tensor as one seen before, or None for inference tensors: they have no version counter,
    so an in-place change would go unseen, and are compared by content on every call.

    While the tensor an alias holds is alive, its memory cannot be handed to another tensor, so data_ptr with
    shape, strides and version names the same content; a dead one's alias is never hit."""
    if edge_index.is_inference():
        return None
    return (
        edge_index.data_ptr(), tuple(edge_index.shape), edge_index.stride(), edge_index.dtype, edge_index.device,
        edge_index._version, num_src, num_dst,
    )  # fmt: skip


def _first_match(edge_index: Tensor, candidates: list[tuple[_CachedGraph, int]]) -> tuple[_CachedGraph, int] | None:
    """The first (graph, copies) whose content edge_index holds: all compared on the device, one host sync."""
    if not candidates:
        return None
    found = torch.stack([graph.holds(edge_index, copies) for graph, copies in candidates]).tolist()
    return next((c for c, hit in zip(candidates, found, strict=True) if hit), None)


_SHARED_CACHE = LayoutCache()


def cached_layout(
    edge_index: Tensor,  # [2, M] int64/int32: row 0 = source, row 1 = destination
    num_nodes: tuple[int, int],  # (N_src, N_dst)
) -> GraphLayout:
    """The layout of a graph from the cache that every :class:`gtnorm.GraphTransformerConv` shares, built on
    first sight of the graph (including its visiting-order search) and found again by content. Call it once
    with a model's base graph (e.g. at construction) so that later calls with batch copies of it, clones of it
    or inference tensors holding it reuse that layout.

    Shapes: edge_index [2, M].
    """
    check_edge_index_format(edge_index)
    num_src, num_dst = _resolve_num_nodes(num_nodes, 0)
    if torch.compiler.is_compiling():
        # The lookup (data_ptr, weakrefs, a sync on a new graph) is opaque to the tracer: an op of its own
        # whose outputs are the layout's tensors, so that a compiled layer has no graph break.
        walks = torch.ops.gtnorm.cached_layout(edge_index, num_src, num_dst)
        return GraphLayout(num_src, num_dst, edge_index.shape[1], EdgeWalk(*walks[:6]), EdgeWalk(*walks[6:]))
    return _SHARED_CACHE.get(edge_index, num_src, num_dst)


# A CUDA graph replays the op's copy kernels, not its Python lookup: captured (torch.compile's
# mode="reduce-overhead"), it would hand a new graph of the same shape the layout of the one recorded. Tagged
# unsafe, the capture is split around it (torch >= 2.9 knows the tag).
_NOT_IN_CUDA_GRAPHS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


@torch.library.custom_op("gtnorm::cached_layout", mutates_args=(), tags=_NOT_IN_CUDA_GRAPHS)
def _cached_layout_op(edge_index: Tensor, num_src: int, num_dst: int) -> list[Tensor]:
    """Both walks' tensors (EdgeWalk field order, by destination then by source), fresh tensors (an op's outputs
    may not be shared with earlier calls): a few index arrays, copied on the device, no sync on a hit."""
    layout = _SHARED_CACHE.get(edge_index, num_src, num_dst)
    return [t.clone() for t in layout.by_dst.tensors() + layout.by_src.tensors()]


@_cached_layout_op.register_fake
def _(edge_index, num_src, num_dst):
    num_edges = edge_index.shape[1]
    ctx = torch.library.get_ctx()

    def walk(num_nodes):
        int32 = [edge_index.new_empty(n, dtype=torch.int32) for n in (num_nodes + 1, num_nodes, *[num_edges] * 3)]
        return [*int32, edge_index.new_empty(ctx.new_dynamic_size(), dtype=torch.int64)]

    return walk(num_dst) + walk(num_src)


def clear_layout_cache() -> None:
    """Drop every cached layout (e.g. after writing to an edge_index behind torch's version counter)."""
    _SHARED_CACHE.clear()
