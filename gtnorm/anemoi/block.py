"""Anemoi's graph-transformer blocks with gtnorm's fused attention: the QK norm runs inside the kernels.

Anemoi's blocks normalise query and key (``_apply_qk_norm``) and then call their attention backend once per
edge chunk (``apply_gt``). The subclasses here change only those two steps: the norm is no longer applied on
its own, and each chunk goes through the block's ``conv``, an instance of Anemoi's GraphTransformerConv class
that runs :class:`gtnorm.GraphTransformerConv` with the block's own ``q_norm`` / ``k_norm`` modules, applied inside
the kernels (gtnorm/anemoi/conv.py). Where the block projects its raw edge
attributes with ``lin_edge`` alone (no ``edge_pre_mlp``) and shards by edges, the conv is handed ``lin_edge`` too:
the edge features are then computed inside the kernels and never stored (``get_qkve`` passes the raw attributes
on). Everything else (the other projections, shard strategies, inference chunks, MLPs, checkpointing around the
block) is Anemoi's code, unchanged.
"""

from __future__ import annotations

import torch
from anemoi.models.layers import block as anemoi_block
from torch import Tensor, nn

from gtnorm.anemoi.conv import FusedGraphTransformerConv
from gtnorm.anemoi.mlp_parts import fits_mlp_op, mlp_in_parts
from gtnorm.anemoi.row_parts import in_checkpointed_parts

# Anemoi's graph_attention_backend -> GraphTransformerConv's backend. "triton" runs gtnorm's kernels wherever
# they can run (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1) and the PyG path elsewhere, as
# Anemoi's blocks fall back to PyG without CUDA.
_BACKENDS = {"triton": "auto", "pyg": "pyg"}
# Whether blocks built from now on run lin_edge inside the kernels where they can (see _fuses_edge_projection).
# On: inside Anemoi's blocks on an H100 the training step ran 1.02-1.09x as fast as with lin_edge materialised on
# the level-6 processor and the O320 encoder (one bf16 row 0.98x) and 0.98-1.00x on the decoder (3 edges per node),
# with 10-24 % less extra memory everywhere (benchmarks/NOTES.md, v10). Set it to False before building a model to
# materialise the edge features instead.
FUSE_EDGE_PROJECTION = True


class _FusedAttention:
    """What gtnorm's blocks override in Anemoi's GraphTransformerBaseBlock (mixed in before it).

    ``conv`` is a submodule where Anemoi has its own, of Anemoi's class and without parameters
    (FusedGraphTransformerConv); the norms and ``lin_edge`` it uses stay registered where Anemoi registered them.
    So the module tree and the state_dict keys are exactly Anemoi's, and ``.to()`` / ``.half()`` reach the norms
    through the block.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Anemoi's __init__ sets up the attention before it records the shard strategy, which decides whether
        # lin_edge can be fused: set it up again now that the block is complete.
        self.set_attention_function()

    def set_attention_function(self) -> None:
        # The backend override Anemoi reads from ANEMOI_INFERENCE_GRAPHTRANSFORMER_ATTENTION_BACKEND.
        if anemoi_block.ATTENTION_BACKEND != "":
            self.graph_attention_backend = anemoi_block.ATTENTION_BACKEND
        if self.graph_attention_backend not in _BACKENDS:
            raise ValueError(
                f"graph_attention_backend must be one of {sorted(_BACKENDS)}, got {self.graph_attention_backend!r}"
            )
        self.conv = FusedGraphTransformerConv(
            self.out_channels_conv,
            backend=_BACKENDS[self.graph_attention_backend],
            q_norm=self.q_norm if self.qk_norm else None,
            k_norm=self.k_norm if self.qk_norm else None,
            lin_edge=self.lin_edge if self._fuses_edge_projection() else None,
        )

    def _fuses_edge_projection(self) -> bool:
        """Whether lin_edge runs inside the kernels: the edge features are lin_edge(raw attributes) alone, and the
        raw attributes reach the attention unchanged (sharding by heads splits the projected features instead)."""
        return (
            FUSE_EDGE_PROJECTION
            and self.graph_attention_backend == "triton"
            and isinstance(self.edge_pre_mlp, nn.Identity)
            and isinstance(self.lin_edge, nn.Linear)
            and getattr(self, "shard_strategy", "edges") == "edges"
        )

    def get_qkve(self, x, edge_attr: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if self.conv.lin_edge is None:
            return super().get_qkve(x, edge_attr)
        x_src, x_dst = x if isinstance(x, tuple) else (x, x)
        # The raw attributes [M, D] go on: the conv's kernels apply lin_edge.
        return self.lin_query(x_dst), self.lin_key(x_src), self.lin_value(x_src), edge_attr

    def prepare_qkve_edge_sharding(self, query, key, value, edges) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if self.conv.lin_edge is None:
            return super().prepare_qkve_edge_sharding(query, key, value, edges)
        query, key, value = (t.unflatten(-1, (self.num_heads, self.out_channels_conv)) for t in (query, key, value))
        return query, key, value, edges  # raw attributes [M, D], not per head

    def _apply_qk_norm(self, query: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
        return query, key  # applied inside the attention kernels, by apply_gt

    def apply_gt(
        self,
        query: Tensor,  # [N_dst, H, C]
        key: Tensor,  # [N_src, H, C]
        value: Tensor,  # [N_src, H, C]
        edges: Tensor,  # [M, H, C], in edge_index's order; [M, D] raw attributes where lin_edge is fused
        edge_index: Tensor,  # [2, M]: row 0 = source, row 1 = destination
        size: int | tuple[int, int],
        edges_are_dst_sorted: bool = True,  # gtnorm takes edges in any order
    ) -> Tensor:  # [N_dst, H, C]; 0 for destinations without edges (Anemoi's inference chunks sum these)
        if anemoi_block.ATTENTION_BACKEND != "" and not self._attention_backend_applied:
            # A block unpickled from a whole-model checkpoint did not run __init__: apply the override now.
            self.set_attention_function()
            self._attention_backend_applied = True
        # The sizes from the tensors, not from ``size``: a mapper hands its blocks each chunk's sizes as ints, and
        # an int a compiled block reads is a guard, whose change compiles the block again (see
        # mapper.sizes_vary_by_chunk for why a chunk must not). Anemoi makes ``size`` from the same tensors.
        conv_size = (key.shape[0], query.shape[0])
        if not torch.compiler.is_compiling() and conv_size != ((size, size) if isinstance(size, int) else tuple(size)):
            raise ValueError(f"size {size} does not match {key.shape[0]} sources and {query.shape[0]} destinations")
        return self.conv(query, key, value, edges, edge_index, size=conv_size)


class GraphTransformerProcessorBlock(_FusedAttention, anemoi_block.GraphTransformerProcessorBlock):
    """Anemoi's processor block (same arguments, same state_dict) with gtnorm's fused attention + QK norm."""


class GraphTransformerMapperBlock(_FusedAttention, anemoi_block.GraphTransformerMapperBlock):
    """Anemoi's mapper block (same arguments, same state_dict) with gtnorm's fused attention + QK norm.

    ``node_chunk_rows``: when gradients are taken, the destinations' MLP (LayerNorm, Linear, GELU, Linear) runs in
    checkpointed parts of at most this many rows (gtnorm/anemoi/row_parts.py; compiled, as one op whose backward
    runs the parts one after another: gtnorm/anemoi/mlp_parts.py); None (the default): in one call, as Anemoi's
    block makes it. Set by gtnorm's mappers (their ``node_chunk_rows``).
    """

    node_chunk_rows: int | None = None

    def run_node_dst_mlp(self, x: Tensor, **layer_kwargs) -> Tensor:  # x: [N_dst, C]
        if layer_kwargs.keys() - {"cond"}:  # none in anemoi-models 0.19: cond alone is split with the rows
            return super().run_node_dst_mlp(x, **layer_kwargs)
        rows = self.node_chunk_rows
        in_parts = rows is not None and torch.is_grad_enabled() and x.shape[0] > rows
        if in_parts and not layer_kwargs and torch.compiler.is_compiling():
            if fits_mlp_op(self.layer_norm_mlp_dst, self.node_dst_mlp):
                return mlp_in_parts(x, self.layer_norm_mlp_dst, self.node_dst_mlp, rows)
        return in_checkpointed_parts(super().run_node_dst_mlp, x, rows, layer_kwargs.get("cond"))


_GTNORM_BLOCKS = {
    anemoi_block.GraphTransformerProcessorBlock: GraphTransformerProcessorBlock,
    anemoi_block.GraphTransformerMapperBlock: GraphTransformerMapperBlock,
}


def convert_blocks(module: nn.Module, graph_attention_backend: str | None = None) -> None:
    """Re-class, in place, every Anemoi graph-transformer block inside ``module`` (itself included) to gtnorm's
    and set its attention up; the rest of :func:`gtnorm.anemoi.use_gtnorm_attention` (arguments: there)."""
    for block in list(module.modules()):  # a list: set_attention_function edits the blocks' _modules
        gtnorm_class = _GTNORM_BLOCKS.get(type(block))
        if gtnorm_class is None:
            continue
        # gtnorm's blocks add methods only, no state of their own: re-classing a built block is complete once
        # its attention is set up again.
        block.__class__ = gtnorm_class
        if graph_attention_backend is not None:
            block.graph_attention_backend = graph_attention_backend
        block.set_attention_function()
