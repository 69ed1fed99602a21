"""What the layout cache (layout_cache.py) keeps of one graph: a private copy of its content, to compare new tensors
with, its layouts (built at the first lookup that needs one, B copies by offsetting the base layout), the values
derived from it; a graph registered as derived from another (a mapper's chunk) shares its parent's entry."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from gtnorm.triton.layout import GraphLayout


@dataclass(eq=False)
class CachedGraph:
    """One graph the layout cache keeps: a copy of its content, its layouts by number of batch copies, and values
    derived from it."""

    edge_index: Tensor  # [2, M]: a private copy of the content, to compare new tensors with (derived: the caller's)
    num_src: int
    num_dst: int
    # By number of copies; 1: the graph itself. Built at the first lookup that needs one: a graph kept only for
    # its values (a mapper's whole graph, whose chunks the layers see) never builds its own.
    layouts: dict[int, GraphLayout] = field(default_factory=dict)
    contents: dict[int, Tensor] = field(default_factory=dict)  # [2, B * M] by copies B > 1, for inference checks
    # (copies, derivation) -> a value computed from the content (LayoutCache.graph_value), e.g. a mapper chunk.
    values: dict[tuple, object] = field(default_factory=dict)
    # A graph made from another's content (LayoutCache.register_derived_graph, e.g. a mapper chunk's) lives in its
    # parent's entry: found by identity (its alias holds it), evicted with the parent, not counted against max_graphs.
    parent: CachedGraph | None = None

    @property
    def entry(self) -> CachedGraph:
        """The graph whose place in the LRU this one shares: its parent, or itself."""
        return self.parent if self.parent is not None else self

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

    def _copies(self, copies: int) -> Tensor:  # [2, copies, M]
        # Offsets from Python ints and a device arange: no host-to-device copy (a blocking one would sync).
        index = torch.arange(copies, device=self.edge_index.device)
        offsets = torch.stack([index * self.num_src, index * self.num_dst])  # [2, copies]
        return self.edge_index[:, None, :] + offsets[:, :, None]

    def holds(self, edge_index: Tensor, copies: int) -> Tensor:  # [] bool on the device
        """Whether edge_index is ``copies`` copies of this graph, concatenated with per-copy node offsets."""
        if self.num_edges == 0:
            return torch.ones((), dtype=torch.bool, device=edge_index.device)
        return (edge_index.reshape(2, copies, self.num_edges) == self._copies(copies)).all()

    def content(self, copies: int) -> Tensor:  # [2, copies * M]
        """The content of ``copies`` copies of this graph, kept (16 bytes per edge for each B > 1) so that an
        inference tensor's identity check is one compare."""
        if copies == 1:
            return self.edge_index
        if copies not in self.contents:
            with torch.inference_mode(False):
                self.contents[copies] = self._copies(copies).reshape(2, copies * self.num_edges)
        return self.contents[copies]

    def layout(self, copies: int) -> GraphLayout:
        if copies not in self.layouts:
            if copies == 1:
                # Outside inference mode, so that a layout first met during inference serves training later (the
                # autograd of the attention saves its index tensors, which inference tensors cannot be).
                with torch.inference_mode(False):
                    self.layouts[1] = GraphLayout.from_edge_index(self.edge_index, (self.num_src, self.num_dst))
            else:
                self.layouts[copies] = self.layout(1).repeat(copies)
        return self.layouts[copies]

    def check_content_async(self, edge_index: Tensor, copies: int) -> None:
        """Enqueues a check that edge_index still holds ``copies`` copies of this graph (no host sync): a
        RuntimeError on a mismatch, raised at once on the CPU and as a device-side assertion on CUDA (an inference
        tensor found by identity: layout_cache.py's module docstring)."""
        torch._assert_async(
            (edge_index == self.content(copies)).all(),
            "gtnorm: an inference tensor used as edge_index was changed in place after its graph layout was found",
        )
