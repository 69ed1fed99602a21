"""Layouts reused by graph content: a new edge_index tensor that holds a graph seen before gets its layout.

Models hand the attention a new edge_index tensor every step (Anemoi expands its graph into batch copies with a
fresh ``torch.cat``, clones it per mapper chunk, and runs again under checkpoint recompute or
``torch.inference_mode``), so a cache keyed on tensor identity alone misses every time. Here a lookup is:

1. identity: a tensor seen (or registered, below) before, with the same memory, shape, strides and dtype, its
   memory still held: a hit with no host sync. A normal tensor must also have the same version counter (an
   in-place write misses). An inference tensor has no version counter: its hit enqueues a device-side check that
   its content still is the cached graph's (``torch._assert_async``, no host sync; a mismatch raises a
   RuntimeError, on the CPU at once, on CUDA as a device-side assertion at the next synchronisation, which ends
   the CUDA context: an in-place write into an inference tensor already used as a graph is never served silently);
2. content: compared element for element on the device with every cached graph of matching size, and with
   B disjoint copies of every cached graph (Anemoi's batch expansion): one host sync, then a hit;
3. a new graph: kept, and its layout built (with the visiting-order search, once per graph) when a layer asks.

Code that knows how it made a tensor can say so instead of having it compared: :func:`register_batch_copies`
(B copies of a base graph, as Anemoi's graph providers expand it). A registered tensor is then found by identity
from its first lookup on: no compare, no host sync (gtnorm/anemoi/graph_provider.py registers Anemoi's). Values
derived from a graph's content (Anemoi's mapper chunks, gtnorm/anemoi/mapper.py) are kept beside its layouts:
:func:`cached_graph_value`.

B copies of a cached graph get :meth:`GraphLayout.repeat` of its layout: no new search. Content is compared
exactly, so a different graph of the same shape, or a tensor changed in place, never gets another's layout.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
from torch import Tensor

from gtnorm.triton.cached_graph import CachedGraph
from gtnorm.triton.layout import GraphLayout, _resolve_num_nodes, check_edge_index_format

_MISSING = object()  # a graph value not computed yet (None is a value)


@dataclass(eq=False)
class _Provenance:
    """How a registered tensor was made from another (its source), until its first lookup resolves it."""

    source: weakref.ref  # the source tensor
    source_key: tuple  # the source's identity key when it was used: a write into it since shows as another key
    source_num_nodes: tuple[int, int]
    copies: int  # the tensor is this many copies of the source


@dataclass(eq=False)
class _Alias:
    """A tensor matched to a cached graph (or registered with its provenance), found again by identity."""

    storage: weakref.ref  # the tensor's memory: while it is alive, no other tensor can be handed that memory
    storage_ptr: int  # where that memory was (a resize_ moves it)
    graph: CachedGraph | None  # None until a provenance is resolved
    copies: int
    provenance: _Provenance | None = None

    def alive(self) -> bool:
        storage = self.storage()
        return storage is not None and storage.data_ptr() == self.storage_ptr


class LayoutCache:
    """An LRU of graph layouts, looked up by identity, provenance or the content of edge_index (module docstring).

    ``max_graphs`` bounds the memory: each graph keeps a copy of its edge_index and its layouts (about 40 bytes
    per edge, plus 24 per edge for each batch size of copies in use, and 16 per edge for each batch size that
    inference tensors are checked against). A model has a few graphs (processor, encoder, decoder); the graphs
    derived from one (each mapper chunk's: register_derived_graph) count as part of it, so that 32 leaves room for
    several models at any chunking. (Counted one by one, an O1280 model at 16 mapper chunks has 35 graphs: an LRU
    of 32 walked in the same order every step then missed every lookup and built every chunk's layout again.)
    """

    def __init__(self, max_graphs: int = 32):
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[int, CachedGraph] = OrderedDict()  # by id(), least recently used first
        self._aliases: dict[tuple, _Alias] = {}
        self._sweep_at = 64  # the number of aliases at which the dead ones are dropped next
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        with self._lock:
            self._graphs.clear()
            self._aliases.clear()

    def get(self, edge_index: Tensor, num_src: int, num_dst: int) -> GraphLayout:  # edge_index [2, M]
        """The layout of the graph in edge_index, with (num_src, num_dst) nodes; built on first sight."""
        graph, copies = self._find(edge_index, num_src, num_dst)
        with self._lock:
            return graph.layout(copies)

    def graph_value(
        self,
        edge_index: Tensor,  # [2, M]
        num_src: int,
        num_dst: int,
        derivation: Hashable,
        compute: Callable[[], object],
        is_current: Callable[[object], bool] | None = None,
    ):
        """What ``compute()`` returns for the graph in edge_index: computed the first time this graph (as the cache
        knows it: by identity, provenance or content, as a layout lookup) and ``derivation`` meet, and kept with
        the graph's layouts (dropped with them). ``compute`` must be a deterministic function of the graph's content
        and of ``derivation``, which names it and holds everything else it reads; what it returns is shared by every
        later call; ``is_current(value)``, if given, says whether a kept value may still be served (e.g. that a
        tensor in it has not been written to), else it is computed and kept again."""
        hash(derivation)
        graph, copies = self._find(edge_index, num_src, num_dst)
        key = (copies, derivation)
        with self._lock:
            value = graph.values.get(key, _MISSING)
        if value is not _MISSING and (is_current is None or is_current(value)):
            return value
        value = compute()
        with self._lock:
            graph.values[key] = value
        return value

    def register_batch_copies(
        self,
        edge_index: Tensor,  # [2, copies * M]
        base: Tensor,  # [2, M]
        base_num_nodes: tuple[int, int],
        copies: int,
    ) -> None:
        """Records that edge_index was made as ``copies`` copies of ``base`` (copy i: base + i * (N_src, N_dst),
        concatenated along the edges), so that its lookups, with ``copies`` times the base's node counts, find
        the layout by identity: no compare, no host sync. The base's graph is found (by identity once it has been
        seen, else by content) or built at the first lookup. The caller vouches for the content: nothing is
        compared (an inference tensor's lookups check it, as every identity hit of one does).

        Nothing is recorded (lookups then compare content) if the base has been written to before that first
        lookup, or if the base is an inference tensor and edge_index is not (its writes could not be seen).

        Shapes: edge_index [2, copies * M], base [2, M].
        """
        num_src, num_dst = _resolve_num_nodes(base_num_nodes, 0)
        check_edge_index_format(edge_index)
        check_edge_index_format(base)
        if not isinstance(copies, int) or isinstance(copies, bool) or copies < 1:
            raise ValueError(f"copies must be a positive int, got {copies!r}")
        if edge_index.shape[1] != copies * base.shape[1]:
            raise ValueError(
                f"edge_index must have copies * M = {copies * base.shape[1]} edges, got {edge_index.shape[1]}"
            )
        if edge_index.device != base.device:
            raise ValueError(f"edge_index is on {edge_index.device} but its source on {base.device}")
        if base.is_inference() and not edge_index.is_inference():
            return
        provenance = _Provenance(weakref.ref(base), _identity_key(base, num_src, num_dst), (num_src, num_dst), copies)
        key = _identity_key(edge_index, copies * num_src, copies * num_dst)
        self._remember(key, edge_index, None, 0, provenance)

    def register_derived_graph(
        self,
        edge_index: Tensor,  # [2, M_derived]
        num_src: int,
        num_dst: int,
        parent: Tensor,  # [2, M]
        parent_num_nodes: tuple[int, int],
    ) -> None:
        """Records that edge_index is a graph made from the graph in ``parent`` (a mapper's chunk, from its whole
        graph): its layout is kept in the parent's entry, found by identity (no compare, no host sync), and kept
        and evicted with the parent, so that a model's chunk graphs do not count against max_graphs. The parent's
        graph is found (by identity, provenance or content) or added. Later lookups of a clone of edge_index
        compare content as for any graph, and a write into edge_index (its version counter) makes it a graph of
        its own.

        edge_index itself is kept, not copied (at O1280 a mapper's chunks hold 30M edges: 475 MB a copy): it is
        only ever read through a lookup of its own identity, which a write into it ends, so what its layout is
        built from is what was registered.

        Shapes: edge_index [2, M_derived], parent [2, M].
        """
        check_edge_index_format(edge_index)
        check_edge_index_format(parent)
        if edge_index.is_inference():
            raise ValueError("a derived graph must not be an inference tensor (its writes could not be seen)")
        if edge_index.device != parent.device:
            raise ValueError(f"edge_index is on {edge_index.device} but its parent on {parent.device}")
        parent_graph, _ = self._find(parent, *_resolve_num_nodes(parent_num_nodes, 0))
        graph = CachedGraph(edge_index, num_src, num_dst, parent=parent_graph.entry)
        self._remember(_identity_key(edge_index, num_src, num_dst), edge_index, graph, 1)

    def _find(self, edge_index: Tensor, num_src: int, num_dst: int) -> tuple[CachedGraph, int]:
        key = _identity_key(edge_index, num_src, num_dst)
        found = self._find_by_identity(key)
        if found is not None:
            if edge_index.is_inference():
                found[0].check_content_async(edge_index, found[1])
            return found
        with self._lock:
            candidates = [
                (graph, copies)
                for graph in self._graphs.values()
                if graph.edge_index.device == edge_index.device
                and (copies := graph.copies_in(edge_index.shape[1], num_src, num_dst))
            ]
        found = _first_match(edge_index, candidates)
        if found is None:
            found = (self._add(edge_index, num_src, num_dst), 1)
        with self._lock:
            if self._graphs.get(id(found[0].entry)) is found[0].entry:
                self._graphs.move_to_end(id(found[0].entry))
        self._remember(key, edge_index, *found)
        return found

    def _find_by_identity(self, key: tuple) -> tuple[CachedGraph, int] | None:
        """(graph, copies) of the tensor with this identity key, or None."""
        with self._lock:
            alias = self._aliases.get(key)
            if alias is None:
                return None
            if not alias.alive():
                del self._aliases[key]
                return None
            if alias.graph is not None:
                self._graphs.move_to_end(id(alias.graph.entry))  # evicting a graph drops its aliases
                return alias.graph, alias.copies
            provenance = alias.provenance
        found = self._resolve(provenance)
        with self._lock:
            if found is None:
                if self._aliases.get(key) is alias:
                    del self._aliases[key]
            else:
                alias.graph, alias.copies, alias.provenance = *found, None
        return found

    def _resolve(self, provenance: _Provenance) -> tuple[CachedGraph, int] | None:
        """(graph, copies) of registered batch copies, from their source's graph; None if the source is gone or
        has been written to since."""
        source = provenance.source()
        if source is None or _identity_key(source, *provenance.source_num_nodes) != provenance.source_key:
            return None
        graph, copies = self._find(source, *provenance.source_num_nodes)
        return graph, copies * provenance.copies

    def _remember(
        self, key: tuple, edge_index: Tensor, graph: CachedGraph | None, copies: int, provenance=None
    ) -> None:
        storage = edge_index.untyped_storage()
        alias = _Alias(weakref.ref(storage), storage.data_ptr(), graph, copies, provenance)
        with self._lock:
            self._aliases[key] = alias
            if len(self._aliases) >= self._sweep_at:
                # Amortised: dead aliases go once their number has doubled, so that a hit stays a dict lookup.
                for k in [k for k, a in self._aliases.items() if not a.alive()]:
                    del self._aliases[k]
                self._sweep_at = max(64, 2 * len(self._aliases))

    def _add(self, edge_index: Tensor, num_src: int, num_dst: int) -> CachedGraph:
        # The copy is a normal tensor, so that a graph first met during inference serves training later.
        with torch.inference_mode(False):
            graph = CachedGraph(edge_index.clone(), num_src, num_dst)
        with self._lock:
            self._graphs[id(graph)] = graph
            while len(self._graphs) > self.max_graphs:
                _, evicted = self._graphs.popitem(last=False)
                for k in [k for k, alias in self._aliases.items() if alias.graph and alias.graph.entry is evicted]:
                    del self._aliases[k]
        return graph


def _identity_key(edge_index: Tensor, num_src: int, num_dst: int) -> tuple:
    """What identifies a tensor as one seen before: its memory, shape, strides and dtype, and its version
    counter (None for an inference tensor, which has none: its identity hits are checked on the device).

    While the memory an alias names is held (its storage alive at the same place), it cannot be handed to another
    tensor, so these name the same content; a dead alias is never hit. Views share their base's version counter,
    so a view of the same elements (Anemoi's shard_tensor returns one) hits its base's alias."""
    return (
        edge_index.data_ptr(), tuple(edge_index.shape), edge_index.stride(), edge_index.dtype, edge_index.device,
        None if edge_index.is_inference() else edge_index._version, num_src, num_dst,
    )  # fmt: skip


def _first_match(edge_index: Tensor, candidates: list[tuple[CachedGraph, int]]) -> tuple[CachedGraph, int] | None:
    """The first (graph, copies) whose content edge_index holds: all compared on the device, one host sync."""
    if not candidates:
        return None
    found = torch.stack([graph.holds(edge_index, copies) for graph, copies in candidates]).tolist()
    return next((c for c, hit in zip(candidates, found, strict=True) if hit), None)


_SHARED_CACHE = LayoutCache()


def cached_layout(
    edge_index: Tensor,  # [2, M] int64/int32: row 0 = source, row 1 = destination
    num_nodes: tuple[int, int],  # (N_src, N_dst)
) -> GraphLayout | LayoutOfEdgeIndex:
    """The layout of a graph from the cache that every :class:`gtnorm.GraphTransformerConv` shares, built on
    first sight of the graph (including its visiting-order search) and found again by identity (no host sync),
    by registered provenance (no host sync) or by content (one host sync per new tensor). Call it once with a
    model's base graph (e.g. at construction) so that later calls with batch copies of it, clones of it or
    inference tensors holding it reuse that layout; register per-step tensors made from it
    (:func:`register_batch_copies`) to have them found without a sync.

    Under torch.compile it returns a :class:`LayoutOfEdgeIndex`: the attention op looks the layout up when it runs.

    Shapes: edge_index [2, M].
    """
    check_edge_index_format(edge_index)
    num_src, num_dst = _resolve_num_nodes(num_nodes, 0)
    if torch.compiler.is_compiling():
        return LayoutOfEdgeIndex(edge_index, num_src, num_dst)
    return layout_of_edge_index(edge_index, num_src, num_dst)


@dataclass(frozen=True, eq=False)
class LayoutOfEdgeIndex:
    """A graph whose layout the attention op finds in the shared cache when it runs, from the edge_index it is
    handed (gtnorm/triton/attention_launch.py, layout_tensors): what a layer passes under torch.compile. The
    lookup (data_ptr, weak references, a content compare for a new tensor) is opaque to the tracer, and a layout's
    shapes depend on the graph's content (its nodes without edges): as op outputs they would end the traced graph.
    Inside the op they cost the graph nothing, and a new graph of the same shape runs the same compiled graph.

    Shapes: edge_index [2, M].
    """

    edge_index: Tensor  # [2, M]
    num_src: int
    num_dst: int

    @property
    def num_edges(self) -> int:
        return self.edge_index.shape[1]

    @property
    def device(self) -> torch.device:
        return self.edge_index.device

    def tensors(self) -> tuple[Tensor]:
        """What the attention ops take in place of the layout's index tensors."""
        return (self.edge_index,)


def layout_of_edge_index(edge_index: Tensor, num_src: int, num_dst: int) -> GraphLayout:  # edge_index [2, M]
    """The shared cache's layout of the graph in edge_index (:func:`cached_layout` outside torch.compile)."""
    return _SHARED_CACHE.get(edge_index, num_src, num_dst)


def register_batch_copies(
    edge_index: Tensor,  # [2, copies * M]: copy i is base + i * (N_src, N_dst), concatenated along the edges
    base: Tensor,  # [2, M]
    base_num_nodes: tuple[int, int],  # (N_src, N_dst) of the base graph
    copies: int,
) -> None:
    """Tells the shared cache that edge_index was made as ``copies`` copies of ``base`` (Anemoi's batch expansion),
    so that the layers find its layout by identity: no content compare, no host sync. See
    :meth:`LayoutCache.register_batch_copies`.

    Shapes: edge_index [2, copies * M], base [2, M].
    """
    _SHARED_CACHE.register_batch_copies(edge_index, base, base_num_nodes, copies)


def register_derived_graph(
    edge_index: Tensor,  # [2, M_derived]
    num_nodes: tuple[int, int],  # (N_src, N_dst) of the derived graph, as its lookups will name them
    parent: Tensor,  # [2, M]
    parent_num_nodes: tuple[int, int],
) -> None:
    """Tells the shared cache that edge_index was made from the graph in ``parent`` (e.g. a mapper chunk's graph from
    the mapper's): its layout is then kept with the parent's, found by identity, and not counted against the
    cache's bound on graphs. See :meth:`LayoutCache.register_derived_graph`.

    Shapes: edge_index [2, M_derived], parent [2, M].
    """
    num_src, num_dst = _resolve_num_nodes(num_nodes, 0)
    _SHARED_CACHE.register_derived_graph(edge_index, num_src, num_dst, parent, parent_num_nodes)


def cached_graph_value(
    edge_index: Tensor,  # [2, M]
    num_nodes: tuple[int, int],  # (N_src, N_dst)
    derivation: Hashable,  # names compute and holds everything it reads besides the graph's content
    compute: Callable[[], object],
    is_current: Callable[[object], bool] | None = None,  # whether a kept value may still be served
):
    """A value derived from the graph in edge_index (e.g. Anemoi's mapper chunks, gtnorm/anemoi/mapper.py), computed
    once per graph and derivation and found again as a layout is: by identity or registered provenance with no host
    sync, by content with one. See :meth:`LayoutCache.graph_value`.

    Shapes: edge_index [2, M].
    """
    check_edge_index_format(edge_index)
    num_src, num_dst = _resolve_num_nodes(num_nodes, 0)
    return _SHARED_CACHE.graph_value(edge_index, num_src, num_dst, derivation, compute, is_current)


def clear_layout_cache() -> None:
    """Drop every cached layout (e.g. after writing to an edge_index behind torch's version counter)."""
    _SHARED_CACHE.clear()
