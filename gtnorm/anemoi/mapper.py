"""Anemoi's graph-transformer encoder and decoder (forward / backward mappers) with gtnorm's fused attention.

Anemoi's mappers cut their graph into chunks of destinations every step (``GraphPartition.materialise``: a clone
of a range of edges, destinations and sources relabelled, unconnected sources dropped), so the attention gets a
new edge_index tensor per chunk, per step and per checkpoint recompute. gtnorm's mappers register each chunk as
derived from the mapper's edge_index (gtnorm.triton.layout_cache.register_derived_graph): a chunk's layout is
found by identity, with no compare and no host sync, wherever that edge_index is the one of an earlier step or is
registered (Anemoi's graph provider converted by use_gtnorm_attention registers its expansion); a new, unregistered
edge_index costs one content compare per step, not one per chunk.
"""

from __future__ import annotations

from dataclasses import fields

from anemoi.models.distributed.khop_edges import GraphPartition
from anemoi.models.layers import mapper as anemoi_mapper

from gtnorm.anemoi.block import convert_blocks
from gtnorm.triton.layout_cache import register_derived_graph


class _RegisteredChunkPartition(GraphPartition):
    """Anemoi's GraphPartition whose materialised chunks are registered as derived from the partitioned graph."""

    def materialise(self, partition_id, x, edge_attr, edge_index, cond=None):
        chunk = super().materialise(partition_id, x, edge_attr, edge_index, cond=cond)
        (x_src, x_dst), _, chunk_edge_index, _ = chunk
        # Everything materialise reads besides edge_index's content: the partition and the chunk's number.
        derivation = (
            "anemoi.GraphPartition.materialise", self.num_nodes, self.num_edges, self.num_parts,
            tuple(self.dst_splits), tuple(self.edge_splits), partition_id,
        )  # fmt: skip
        register_derived_graph(
            chunk_edge_index, (x_src.shape[0], x_dst.shape[0]), edge_index, tuple(self.num_nodes), derivation
        )
        return chunk


class _RegisteredChunks:
    """What gtnorm's mappers override in Anemoi's GraphTransformerBaseMapper (mixed in before it): no state."""

    def run_processor_chunk(self, chunk_partition: GraphPartition, *args, **kwargs):
        if type(chunk_partition) is GraphPartition:
            chunk_partition = _RegisteredChunkPartition(
                **{f.name: getattr(chunk_partition, f.name) for f in fields(chunk_partition)}
            )
        return super().run_processor_chunk(chunk_partition, *args, **kwargs)


class GraphTransformerForwardMapper(_RegisteredChunks, anemoi_mapper.GraphTransformerForwardMapper):
    """A drop-in for ``anemoi.models.layers.mapper.GraphTransformerForwardMapper`` (the encoder, data -> hidden):
    the same keyword arguments, state_dict keys and forward, with gtnorm's fused attention + QK norm. In a model
    config: ``_target_: gtnorm.anemoi.GraphTransformerForwardMapper``.
    """

    def __init__(self, *, graph_attention_backend: str = "triton", **kwargs) -> None:
        super().__init__(graph_attention_backend=graph_attention_backend, **kwargs)
        convert_blocks(self, graph_attention_backend)


class GraphTransformerBackwardMapper(_RegisteredChunks, anemoi_mapper.GraphTransformerBackwardMapper):
    """A drop-in for ``anemoi.models.layers.mapper.GraphTransformerBackwardMapper`` (the decoder, hidden -> data):
    the same keyword arguments, state_dict keys and forward, with gtnorm's fused attention + QK norm. In a model
    config: ``_target_: gtnorm.anemoi.GraphTransformerBackwardMapper``.
    """

    def __init__(self, *, graph_attention_backend: str = "triton", **kwargs) -> None:
        super().__init__(graph_attention_backend=graph_attention_backend, **kwargs)
        convert_blocks(self, graph_attention_backend)
