"""Anemoi's StaticGraphProvider with its per-step batch expansion registered in gtnorm's layout cache.

Anemoi's models make their edges every step with ``StaticGraphProvider.get_edges(batch_size)``: B copies of the
provider's dst-sorted base graph (copy i: ``edge_index_base + i * edge_inc``), a new tensor each time. Found by
content, each costs gtnorm's layout cache a compare and a host sync per step. The subclass here makes the same
expansion and registers it as B copies of the base (gtnorm.triton.layout_cache.register_batch_copies): the layers
then find its layout by identity, with no compare and no host sync. The base is the provider's own buffer, found
by identity from its second use on; Anemoi's sharding hands on a view of the same memory, which hits too.

Anemoi's ``get_edges`` also reads the node counts to the host at every call (``edge_inc.tolist()``, to size the
edge shards), a host sync per graph and step, three in a model's forward: at O320 each left the GPU idle ~1 ms
while the host launched the next module's first kernels (benchmarks.model.idle,
benchmarks/NOTES.md v45). The subclass takes the counts it holds instead.

Under inference mode the expansion is still made a normal tensor (from the provider's normal buffers): the cache
sees a write into a normal tensor by its version counter, while an inference tensor has none, so each of its
lookups found by identity enqueues a compare of its content on the device (layout_cache.py): three kernels per
lookup, one lookup per processor layer and mapper a call (at O320 54 launches an inference call, 16 + 2 lookups;
counted on the CPU).

It adds no parameters, buffers or state_dict keys: :func:`gtnorm.anemoi.use_gtnorm_attention` re-classes the
providers of a built model in place. The node counts (``edge_inc``) are read to the host once per buffer, when a
provider is converted (or when the buffer has been replaced or written to since), not per step.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING

import torch
from anemoi.models.layers import graph_provider as anemoi_graph_provider
from torch import Tensor

from gtnorm.triton.layout_cache import register_batch_copies

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

# id(edge_inc) -> (a weak reference to it, its version counter, its (N_src, N_dst)), read once per buffer. Kept
# out of the providers, so that a provider pickles and deep-copies as Anemoi's does.
_NODE_COUNTS: dict[int, tuple[weakref.ref, int, tuple[int, int]]] = {}


class StaticGraphProvider(anemoi_graph_provider.StaticGraphProvider):
    """Anemoi's StaticGraphProvider (same arguments, state and edges) whose per-step expansion into batch copies
    is registered in gtnorm's layout cache, and whose edge shards are sized from the node counts it holds (module
    docstring)."""

    def _get_edges_impl(self, batch_size: int, shard_edges: bool, model_comm_group: ProcessGroup | None):
        node_counts = base_node_counts(self.edge_inc)
        if not shard_edges or node_counts is None:
            return super()._get_edges_impl(batch_size, shard_edges, model_comm_group)
        # Anemoi's steps with the node counts held, not read from edge_inc (module docstring).
        edge_attr = self.trainable(self.edge_attr, batch_size)
        edge_index = self._expand_edges(self.edge_index_base, self.edge_inc, batch_size)
        num_src, num_dst = node_counts
        return anemoi_graph_provider.shard_edges_1hop(
            edge_attr, edge_index, num_src * batch_size, num_dst * batch_size, model_comm_group
        )

    def _expand_edges(self, edge_index: Tensor, edge_inc: Tensor, batch_size: int) -> Tensor:  # [2, B * M]
        # Made here (the expansion Anemoi's own makes: copy i = edge_index + i * edge_inc, concatenated along the
        # edges) so that what is registered is, by construction, what the tensor holds. Made a normal tensor under
        # inference mode too (module docstring).
        normal = not (edge_index.is_inference() or edge_inc.is_inference())
        with torch.inference_mode(False) if normal else contextlib.nullcontext():
            expanded = torch.cat([edge_index + i * edge_inc for i in range(batch_size)], dim=1)
        node_counts = base_node_counts(edge_inc)
        if node_counts is not None and batch_size >= 1:
            register_batch_copies(expanded, edge_index, node_counts, batch_size)
        return expanded


def base_node_counts(edge_inc: Tensor) -> tuple[int, int] | None:  # edge_inc [2, 1]
    """(N_src, N_dst) of a provider's base graph: edge_inc's values, read to the host (one sync) the first time
    this tensor is seen and again only after a write into it. None for an inference tensor (its writes could not
    be seen): its expansions are then found by content."""
    if edge_inc.is_inference() or tuple(edge_inc.shape) != (2, 1):
        return None
    entry = _NODE_COUNTS.get(id(edge_inc))
    if entry is not None and entry[0]() is edge_inc and entry[1] == edge_inc._version:
        return entry[2]
    counts = tuple(int(n) for n in edge_inc[:, 0].tolist())
    key = id(edge_inc)

    def forget(ref: weakref.ref) -> None:  # the tensor is gone: its id may be given to another
        if _NODE_COUNTS.get(key, (None,))[0] is ref:
            del _NODE_COUNTS[key]

    _NODE_COUNTS[key] = (weakref.ref(edge_inc, forget), edge_inc._version, counts)
    return counts
