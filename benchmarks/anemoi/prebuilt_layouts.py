"""Benchmark-only: the layer's layout lookup swapped, inside a ``with``, for one that hands over layouts prebuilt
for a module's graphs, without looking at the edge_index it is given beyond its size.

:class:`gtnorm.GraphTransformerConv` finds its layout with ``gtnorm.nn.conv.cached_layout`` (by identity, else by
content: a device compare and a host sync per new tensor). :meth:`PrebuiltLayouts.recording` wraps that lookup and
keeps what it returns, keyed by the graph's sizes; :meth:`PrebuiltLayouts.serving` then replaces it with a dict
lookup on those sizes, as if each layout had been handed to the attention. The library is untouched outside the
``with``; a module whose graphs share sizes cannot be served this way (recording raises).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

import gtnorm.nn.conv
from gtnorm.triton.layout import GraphLayout

GraphSizes = tuple[int, int, int]  # (M, N_src, N_dst)


@dataclass
class PrebuiltLayouts:
    """The layouts a module's convs looked up while recording, by graph sizes, and how many lookups there were."""

    layouts: dict[GraphSizes, GraphLayout] = field(default_factory=dict)
    graphs: dict[GraphSizes, torch.Tensor] = field(default_factory=dict)  # [2, M]: the content each was built for
    lookups: int = 0  # calls of the lookup since the last reset, recording or serving

    @contextmanager
    def recording(self) -> Iterator[PrebuiltLayouts]:
        """The shipped lookup, with every layout it returns kept (and its lookups counted)."""
        shipped = gtnorm.nn.conv.cached_layout

        def record(edge_index: torch.Tensor, num_nodes: tuple[int, int]) -> GraphLayout:  # edge_index [2, M]
            layout = shipped(edge_index, num_nodes)
            sizes = (edge_index.shape[1], *num_nodes)
            known = self.graphs.get(sizes)
            if known is None:
                self.layouts[sizes], self.graphs[sizes] = layout, edge_index.detach().clone()
            elif not torch.equal(known, edge_index):
                raise ValueError(f"two graphs of sizes (M, N_src, N_dst) = {sizes}: sizes cannot tell them apart")
            self.lookups += 1
            return layout

        with _lookup_replaced_by(record):
            yield self

    @contextmanager
    def serving(self, check: bool = False) -> Iterator[PrebuiltLayouts]:
        """The recorded layouts handed over by graph sizes: no content compared, no host sync. ``check``: compare
        each edge_index with the graph its layout was built for (a host sync: for verifying, not for timing)."""

        def serve(edge_index: torch.Tensor, num_nodes: tuple[int, int]) -> GraphLayout:  # edge_index [2, M]
            sizes = (edge_index.shape[1], *num_nodes)
            if check and not torch.equal(self.graphs[sizes], edge_index):
                raise ValueError(f"the edge_index of sizes {sizes} is not the graph whose layout was recorded")
            self.lookups += 1
            return self.layouts[sizes]

        with _lookup_replaced_by(serve):
            yield self


@contextmanager
def _lookup_replaced_by(lookup) -> Iterator[None]:
    shipped = gtnorm.nn.conv.cached_layout  # AttributeError if the layer finds its layouts another way
    gtnorm.nn.conv.cached_layout = lookup
    try:
        yield
    finally:
        gtnorm.nn.conv.cached_layout = shipped
