"""Anemoi's graph-transformer encoder and decoder (forward / backward mappers) with gtnorm's fused attention.

Every step (and again at each checkpoint recompute) Anemoi's mappers prepare their graph on the device: a
partition of the destinations into chunks, whose edge counts are read to the host (a degree count and a host sync
per partition), then per chunk a clone of its edges, destinations relabelled, and the connected sources found
(``torch.unique``: a sort and a host sync) and relabelled. All of it depends on the graph's content only, so
gtnorm's mappers compute it once per graph and keep it with the graph's layouts
(gtnorm.triton.layout_cache.cached_graph_value): the graph is found by identity or registered provenance (no host
sync; use_gtnorm_attention's graph providers register each step's edges) or by content (one sync per new tensor),
and a step only slices its features. A chunk's edge_index is then the same tensor every step, so the layers find
its layout by identity too (a caller's in-place write into it is seen by its version counter, and the chunk made
again). When every source of a chunk has edges, its source features are the mapper's own tensor, not a gathered
copy.

On one GPU the prepared partition also holds the destinations split once, before the chunk loop, so that each
chunk's checkpoint takes its own rows and their gradient is their size (_SplitDestinations); sliced inside each
chunk, as Anemoi does, every chunk's backward makes a zero-filled gradient of all the destinations (at O1280's
decoder, 5.1 GiB per chunk). The results are bitwise those of Anemoi's slicing.

On one GPU the decoder runs its last chunk outside a checkpoint (_chunks_with_the_last_kept): the backward starts
there, so keeping its activations costs no memory at the step's peak and saves recomputing it (O800: -39 ms a step,
the same peak; benchmarks/NOTES.md v34).

Under torch.compile the preparation is one call the tracer skips (a graph break where Anemoi's own preparation
breaks too, at its ``.item()``); the chunk loop after it slices tensors only and is traced, blocks included.

Under a model group of several GPUs, and with ANEMOI_DEBUG_SHARDING set, the mappers prepare their graphs as
Anemoi's do. There the decoder's edge-sharded forward runs outside torch.compile: traced by dynamo (any backend,
torch 2.11, NCCL), Anemoi's decoder returns a zero gradient for its sharded sources, the hidden state, while its
output and parameter gradients are right; Anemoi's own decoder does the same (benchmarks/NOTES.md v22).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from anemoi.models.distributed import khop_edges
from anemoi.models.distributed.graph import gather_tensor
from anemoi.models.distributed.khop_edges import GraphPartition, build_graph_partition, ensure_edges_are_dst_sorted
from anemoi.models.distributed.utils import model_is_distributed
from anemoi.models.layers import mapper as anemoi_mapper
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from gtnorm.anemoi.block import GraphTransformerMapperBlock, convert_blocks
from gtnorm.anemoi.grad_columns import split_rows
from gtnorm.anemoi.output_head import fits_output_head, output_head
from gtnorm.anemoi.row_parts import in_checkpointed_parts
from gtnorm.anemoi.source_rows import gather_source_rows, source_positions
from gtnorm.triton.layout_cache import cached_graph_value, register_derived_graph


@dataclass(frozen=True)
class _Chunk:
    """A chunk of a mapper's graph, made once per graph (the sources numbered within the chunk)."""

    edge_index: Tensor  # [2, M_chunk], destinations and sources relabelled to the chunk's
    edge_version: int  # edge_index's version counter when made: a write into it since, and it is made again
    src_ids: Tensor | None  # [N_src_chunk]: the chunk's sources in the mapper's numbering; None: all, in order
    src_positions: Tensor | None  # [N_src]: each source's row in the chunk (source_rows.py); None with src_ids

    def unwritten(self) -> bool:
        """Whether edge_index still holds what was made (a caller's in-place write would bump its version)."""
        return self.edge_index._version == self.edge_version


def _fields(partition: GraphPartition) -> tuple:
    """A partition's fields, in order and hashable."""
    return (
        tuple(partition.num_nodes), partition.num_edges, partition.num_parts, tuple(partition.dst_splits),
        tuple(partition.edge_splits),
    )  # fmt: skip


def _make_chunk(partition: GraphPartition, partition_id: int, edge_index: Tensor, num_src: int) -> _Chunk:
    """Anemoi's GraphPartition.materialise on edge_index alone: the chunk's edges, destinations relabelled, the
    sources that have edges kept (sorted) and relabelled. The chunk's graph is registered as derived from the
    mapper's (layout_cache.register_derived_graph): its layout is kept with the mapper's graph, which a model's
    chunks then do not crowd out of the cache, however many there are."""
    with torch.inference_mode(False):  # kept for later steps, training ones included
        edges = partition._get_edge_range(partition_id)
        dst_range = partition._get_dst_range(partition_id)
        src_ids, src_local = torch.unique(edge_index[0, edges], sorted=True, return_inverse=True)
        chunk = torch.stack([src_local.to(edge_index.dtype), edge_index[1, edges] - dst_range.start])
        # The sizes the chunk's blocks look its layout up with: its sources' rows and its destinations'.
        chunk_nodes = (src_ids.numel(), dst_range.stop - dst_range.start)
        register_derived_graph(chunk, chunk_nodes, edge_index, (num_src, partition.num_nodes[1]))
        # Sorted distinct ids in [0, num_src): all of them only if they are 0, 1, ..., num_src - 1.
        if src_ids.numel() == num_src:
            return _Chunk(chunk, chunk._version, None, None)
        return _Chunk(chunk, chunk._version, src_ids, source_positions(src_ids, num_src))


@dataclass(frozen=True)
class _CachedChunkPartition(GraphPartition):
    """Anemoi's GraphPartition whose chunks' graphs are made once per graph (module docstring)."""

    # Made with the partition, once per graph, on one GPU (_prepared_partition). None: each made when first asked
    # for (a partition from Anemoi's own preparation, on several GPUs).
    chunks: tuple[_Chunk, ...] | None = None

    @classmethod
    def of(cls, partition: GraphPartition, chunks: tuple[_Chunk, ...] | None = None) -> _CachedChunkPartition:
        num_nodes, num_edges, num_parts, dst_splits, edge_splits = _fields(partition)
        return cls(num_nodes, num_edges, num_parts, list(dst_splits), list(edge_splits), chunks)

    def unwritten(self) -> bool:
        return all(chunk.unwritten() for chunk in self.chunks)

    def materialise(self, partition_id, x, edge_attr, edge_index, cond=None):
        x_src, x_dst = x
        return self.materialise_rows(partition_id, x_src, x_dst[self._get_dst_range(partition_id)], edge_attr,
                                     edge_index, cond)  # fmt: skip

    def materialise_rows(self, partition_id, x_src, x_dst_chunk, edge_attr, edge_index, cond=None):
        """materialise with the chunk's destination rows given (x_dst_chunk: [N_dst_chunk, C])."""
        # Tensor slicing alone where the chunks were made with the partition: torch.compile traces it.
        chunk = self.chunks[partition_id] if self.chunks is not None else _chunk(self, partition_id, edge_index, x_src)
        x_src_chunk = _chunk_sources(x_src, chunk)
        cond_chunk = None
        if cond is not None:
            cond_src, cond_dst = cond
            cond_dst_chunk = cond_dst[self._get_dst_range(partition_id)]
            cond_chunk = (_chunk_sources(cond_src, chunk), cond_dst_chunk)
        edge_attr_chunk = edge_attr[self._get_edge_range(partition_id)]
        sizes_vary_by_chunk(edge_attr_chunk, 0)
        sizes_vary_by_chunk(chunk.edge_index, 1)
        return (x_src_chunk, x_dst_chunk), edge_attr_chunk, chunk.edge_index, cond_chunk


def sizes_vary_by_chunk(tensor: Tensor, dim: int) -> Tensor:
    """Marks ``tensor``'s ``dim`` as a size that differs from chunk to chunk, for torch.compile, before a compiled
    block first sees it. Unmarked, the block compiles with that size static at the first chunk and again with it
    dynamic at the second; the backward then recomputes the first chunk (under its checkpoint) with the dynamic
    graph, whose saved tensors can differ from what the static one saved: a CheckpointError ("Recomputed values
    ... have different metadata"), which stopped the O96 training step with the blocks compiled (H200;
    benchmarks/NOTES.md v33; torch issue 166926). Marked, one graph serves every chunk. A no-op while tracing (the
    marks are for the compiled block's inputs, made eagerly) and for sizes the block's code makes static."""
    if not torch.compiler.is_compiling():
        torch._dynamo.maybe_mark_dynamic(tensor, dim)
    return tensor


def _chunk_sources(x_src: Tensor, chunk: _Chunk) -> Tensor:  # [N_src, ...] -> [N_src_chunk, ...]
    return x_src if chunk.src_ids is None else gather_source_rows(x_src, chunk.src_ids, chunk.src_positions)


class _SplitDestinations:
    """A prepared partition for one forward, with the destinations split once, outside the chunks' checkpoints:
    each chunk then takes its own rows, whose gradient is their size. Sliced inside each chunk, as Anemoi's
    partition does, every chunk's backward makes a zero-filled gradient of all the destinations and adds it into
    the one before (at O1280's decoder, whose grid input is fp32 and 208 wide: 5.1 GiB per chunk, and a 5.1 GiB
    buffer held through the last three chunks' backward, at the step's peak; benchmarks/NOTES.md v29). Split so,
    the gradients of chunks done wait for the last; of a marked input (grad_columns.py) only the columns that reach
    a parameter wait (at O800 the step's peak 1.07 GiB lower, NOTES v41). What
    Anemoi's chunk loop asks of a partition: num_parts, _get_dst_range, materialise (whose x_dst it ignores)."""

    def __init__(self, partition: _CachedChunkPartition, x_dst: Tensor):  # x_dst: [N_dst, C]
        self.partition = partition
        self.num_parts = partition.num_parts
        self.x_dst_rows = split_rows(x_dst, list(partition.dst_splits))  # [N_dst_chunk, C] each

    def _get_dst_range(self, partition_id: int) -> slice:
        return self.partition._get_dst_range(partition_id)

    def materialise(self, partition_id, x, edge_attr, edge_index, cond=None):
        return self.partition.materialise_rows(
            partition_id, x[0], self.x_dst_rows.chunk(partition_id), edge_attr, edge_index, cond
        )


@torch.compiler.disable
def _chunk(partition: _CachedChunkPartition, partition_id: int, edge_index: Tensor, x_src: Tensor) -> _Chunk:
    """A chunk of a partition from Anemoi's own preparation (several GPUs), made once per graph and found again by
    the graph's content (one host sync). Opaque to torch.compile, as Anemoi's materialise is not traceable either
    (its ``torch.unique``): one graph break for one."""
    num_src = x_src.shape[0]
    derivation = ("gtnorm.anemoi.mapper._make_chunk", _fields(partition), partition_id, num_src)

    def make() -> _Chunk:
        return _make_chunk(partition, partition_id, edge_index, num_src)

    num_nodes = (num_src, partition.num_nodes[1])
    return cached_graph_value(edge_index, num_nodes, derivation, make, _Chunk.unwritten)


@torch.compiler.disable
def _prepared_partition(edge_index: Tensor, num_parts: int, num_nodes: tuple[int, int]) -> _CachedChunkPartition:
    """Anemoi's build_graph_partition (its edge counts read to the host; one part needs no reading) and every chunk's
    graph, made once per graph and found again as a layout is. Opaque to torch.compile (a graph break, where
    Anemoi's own preparation breaks at its ``.item()``): what it returns is the same object while the graph is, so
    a compiled mapper's chunk loop slices tensors only."""

    def make() -> _CachedChunkPartition:
        if num_parts == 1:
            partition = GraphPartition(num_nodes, edge_index.shape[1], 1, [num_nodes[1]], [edge_index.shape[1]])
        else:
            partition = build_graph_partition(edge_index, num_parts=num_parts, num_nodes=num_nodes)
        chunks = tuple(_make_chunk(partition, part, edge_index, num_nodes[0]) for part in range(num_parts))
        return _CachedChunkPartition.of(partition, chunks)

    derivation = ("gtnorm.anemoi.mapper._prepared_partition", num_parts)
    return cached_graph_value(edge_index, num_nodes, derivation, make, _CachedChunkPartition.unwritten)


class _CachedChunks:
    """What gtnorm's mappers override in Anemoi's GraphTransformerBaseMapper (mixed in before it): no state."""

    def prepare_edge_sharding_wrapper(
        self, x, shard_info, batch_size, edge_attr, edge_index, model_comm_group=None, cond=None,
        edges_are_dst_sorted=True,
    ):  # fmt: skip
        if model_is_distributed(model_comm_group) or khop_edges.ANEMOI_DEBUG_SHARDING:
            return super().prepare_edge_sharding_wrapper(
                x, shard_info, batch_size, edge_attr, edge_index, model_comm_group, cond, edges_are_dst_sorted
            )
        # On one GPU, Anemoi's shard partition and its move to the local rank change nothing: only the chunks.
        x_src, x_dst = x
        num_dst = sum(shard_info.dst_nodes) if shard_info.dst_is_sharded() else x_dst.shape[0]
        edge_attr, edge_index = ensure_edges_are_dst_sorted(
            edge_attr, edge_index, num_dst=num_dst, edges_are_sharded=shard_info.edges_are_sharded(),
            model_comm_group=model_comm_group, edges_are_dst_sorted=edges_are_dst_sorted,
        )  # fmt: skip
        num_chunks = max(self.num_chunks, anemoi_mapper.NUM_CHUNKS_INFERENCE_MAPPER)
        partition = _prepared_partition(edge_index, num_chunks, (x_src.shape[0], x_dst.shape[0]))
        return x_src, x_dst, edge_attr, edge_index, shard_info, cond, _SplitDestinations(partition, x_dst)

    def pre_process(self, x: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:  # each chunk's [N_src, C], [N_dst, C]
        x_src, x_dst = super().pre_process(x)
        return sizes_vary_by_chunk(x_src, 0), sizes_vary_by_chunk(x_dst, 0)

    def run_processor_chunk(self, chunk_partition: GraphPartition, *args, **kwargs):
        if type(chunk_partition) is GraphPartition:  # made by Anemoi's own preparation (several GPUs)
            chunk_partition = _CachedChunkPartition.of(chunk_partition)
        return super().run_processor_chunk(chunk_partition, *args, **kwargs)


class _NodeChunkRows:
    """``node_chunk_rows`` of gtnorm's mappers (mixed in before Anemoi's): when gradients are taken, the row-wise
    work on each chunk's destinations (the blocks' MLP; the decoder's output head too) runs in checkpointed parts
    of at most this many rows (gtnorm/anemoi/row_parts.py). None (the default): Anemoi's one call per chunk.
    At O1280 with the yaml's 4 chunks a decoder chunk is 1.65M grid nodes, whose MLP activations are what the step
    peaks on (benchmarks/NOTES.md, v27-v28)."""

    _node_chunk_rows: int | None = None

    @property
    def node_chunk_rows(self) -> int | None:
        return self._node_chunk_rows

    @node_chunk_rows.setter
    def node_chunk_rows(self, rows: int | None) -> None:
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
            raise ValueError(f"node_chunk_rows must be a positive int or None, got {rows!r}")
        self._node_chunk_rows = rows
        for block in self.modules():
            if isinstance(block, GraphTransformerMapperBlock):
                block.node_chunk_rows = rows


class GraphTransformerForwardMapper(_NodeChunkRows, _CachedChunks, anemoi_mapper.GraphTransformerForwardMapper):
    """A drop-in for ``anemoi.models.layers.mapper.GraphTransformerForwardMapper`` (the encoder, data -> hidden):
    the same keyword arguments, state_dict keys and forward, with gtnorm's fused attention + QK norm. In a model
    config: ``_target_: gtnorm.anemoi.GraphTransformerForwardMapper``; ``node_chunk_rows``: see _NodeChunkRows.
    """

    def __init__(
        self, *, graph_attention_backend: str = "triton", node_chunk_rows: int | None = None, **kwargs
    ) -> None:
        super().__init__(graph_attention_backend=graph_attention_backend, **kwargs)
        convert_blocks(self, graph_attention_backend)
        self.node_chunk_rows = node_chunk_rows


class GraphTransformerBackwardMapper(_NodeChunkRows, _CachedChunks, anemoi_mapper.GraphTransformerBackwardMapper):
    """A drop-in for ``anemoi.models.layers.mapper.GraphTransformerBackwardMapper`` (the decoder, hidden -> data):
    the same keyword arguments, state_dict keys and forward, with gtnorm's fused attention + QK norm and its output
    head (LayerNorm, Linear) as one op (output_head.py), and its last chunk kept rather than checkpointed when
    gradient checkpointing is on (_chunks_with_the_last_kept). In a model config:
    ``_target_: gtnorm.anemoi.GraphTransformerBackwardMapper``; ``node_chunk_rows``: see _NodeChunkRows.
    """

    def __init__(
        self, *, graph_attention_backend: str = "triton", node_chunk_rows: int | None = None, **kwargs
    ) -> None:
        super().__init__(graph_attention_backend=graph_attention_backend, **kwargs)
        convert_blocks(self, graph_attention_backend)
        self.node_chunk_rows = node_chunk_rows

    def post_process(self, x_dst: Tensor) -> Tensor:  # [N_dst_chunk, C] -> [N_dst_chunk, C_out]
        head = self.node_data_extractor
        fn = partial(output_head, head=head) if fits_output_head(head) else super().post_process
        return in_checkpointed_parts(fn, x_dst, self.node_chunk_rows)

    def mapper_forward_with_edge_sharding(
        self, x, batch_size, shard_info, edge_attr, edge_index, model_comm_group=None, keep_x_dst_sharded=False,
        cond=None, edges_are_dst_sorted=True, **kwargs,
    ):  # fmt: skip
        args = (x, batch_size, shard_info, edge_attr, edge_index, model_comm_group, keep_x_dst_sharded, cond,
                edges_are_dst_sorted)  # fmt: skip
        if model_is_distributed(model_comm_group):
            return _eager_edge_sharded_forward(self, *args, **kwargs)
        if khop_edges.ANEMOI_DEBUG_SHARDING or not (self.gradient_checkpointing and torch.is_grad_enabled()):
            return super().mapper_forward_with_edge_sharding(*args, **kwargs)
        return _chunks_with_the_last_kept(self, *args, **kwargs)


def _chunks_with_the_last_kept(
    mapper: GraphTransformerBackwardMapper, x, batch_size, shard_info, edge_attr, edge_index, model_comm_group,
    keep_x_dst_sharded, cond, edges_are_dst_sorted, **kwargs,
) -> Tensor:  # fmt: skip
    """Anemoi's chunk loop of the decoder on one GPU (mapper_forward_with_edge_sharding), its last chunk run outside
    a checkpoint. The decoder's last chunk is the forward's last work before the loss and the backward's first:
    checkpointed, its backward starts by running it again and holds the same activations the forward would have
    kept, from the same point on; kept, they live through the loss only (a [grid, variables] tensor or two). One
    chunk's recomputation less a step (a quarter of the decoder's forward at the config's 4 chunks) for about no
    memory, as torch's checkpoint_sequential keeps its last segment. Bitwise Anemoi's results: the kernels are
    deterministic, so a recomputed chunk and a kept one hold the same values."""
    x_src, x_dst, edge_attr, edge_index, shard_info, cond, partition = checkpoint(
        mapper.prepare_edge_sharding_wrapper, x, shard_info, batch_size, edge_attr, edge_index, model_comm_group,
        cond, edges_are_dst_sorted, use_reentrant=False,
    )  # fmt: skip
    out_channels = mapper.out_channels_dst if mapper.out_channels_dst is not None else mapper.hidden_dim
    out_type = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled() else x_dst.dtype
    out_dst = torch.empty((*x_dst.shape[:-1], out_channels), device=x_dst.device, dtype=out_type)
    last = partition.num_parts - 1
    for chunk_id in range(partition.num_parts):
        run = partial(
            mapper.run_processor_chunk, partition, chunk_id, (x_src, x_dst), edge_attr, edge_index, shard_info,
            batch_size, model_comm_group, cond, edges_are_dst_sorted=True, **kwargs,
        )  # fmt: skip
        chunk_out = run() if chunk_id == last else checkpoint(run, use_reentrant=False)
        out_dst[partition._get_dst_range(chunk_id)] = chunk_out.to(dtype=out_type)
    if not keep_x_dst_sharded:
        out_dst = gather_tensor(out_dst, 0, shard_info.dst_nodes, model_comm_group)
    return out_dst


@torch.compiler.disable
def _eager_edge_sharded_forward(mapper: GraphTransformerBackwardMapper, *args, **kwargs):
    """Anemoi's edge-sharded decoder forward, opaque to torch.compile (module docstring: why)."""
    return anemoi_mapper.GraphTransformerBaseMapper.mapper_forward_with_edge_sharding(mapper, *args, **kwargs)
