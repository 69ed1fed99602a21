"""The PyG reference: graph-transformer attention as Anemoi's ``GraphTransformerConv`` computes it.

This is the obviously-correct path the Triton kernels are tested against (run it in float64 for that), and
the fallback of :class:`gtnorm.GraphTransformerConv` where Triton cannot run. It is plain PyG message passing:
gather per edge, ``torch_geometric.utils.softmax`` over each destination's incoming edges, scatter-add.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import Tensor
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import softmax


class GraphTransformerMessagePassing(MessagePassing):
    """The message part of Anemoi's GraphTransformerConv (no projections, no norm, no dropout).

    For every destination i and head h, with e_ij = 0 when there are no edge features::

        alpha_ij = softmax_j( <q_i, k_j + e_ij> / sqrt(C) )      over the incoming edges j -> i of i
        out_i    = sum_j alpha_ij (v_j + e_ij)                    (0 where i has no incoming edge)

    Stateless: it holds no parameters and no buffers.
    """

    def __init__(self):
        # node_dim=0: node tensors are [N, H, C], so PyG gathers and scatters along the first axis.
        super().__init__(aggr="add", flow="source_to_target", node_dim=0)

    def forward(
        self,
        query: Tensor,  # [N_dst, H, C]
        key: Tensor,  # [N_src, H, C]
        value: Tensor,  # [N_src, H, C]
        edge_attr: Tensor | None,  # [M, H, C]
        edge_index: Tensor,  # [2, M] int64: row 0 = source, row 1 = destination
        size: tuple[int, int] | None = None,  # (N_src, N_dst); None: PyG takes them from key and query
    ) -> Tensor:  # [N_dst, H, C]
        # The _i / _j suffixes in message() make PyG gather query by destination, key and value by source,
        # and read N_dst from query and N_src from key, so bipartite graphs need no special casing.
        return self.propagate(edge_index, size=size, query=query, key=key, value=value, edge_attr=edge_attr)

    def message(
        self,
        query_i: Tensor,  # [M, H, C]: query of each edge's destination
        key_j: Tensor,  # [M, H, C]: key of each edge's source
        value_j: Tensor,  # [M, H, C]: value of each edge's source
        edge_attr: Tensor | None,  # [M, H, C]
        index: Tensor,  # [M]: destination of each edge
        ptr: Tensor | None,
        size_i: int | None,  # N_dst
    ) -> Tensor:  # [M, H, C]
        if edge_attr is not None:
            key_j = key_j + edge_attr
            value_j = value_j + edge_attr
        scores = (query_i * key_j).sum(dim=-1) / math.sqrt(query_i.shape[-1])  # [M, H]
        alpha = softmax(scores, index, ptr, size_i)  # [M, H], sums to 1 over each destination's edges
        return value_j * alpha.unsqueeze(-1)


# One shared instance (the module is stateless), built at import: building one inspects message()'s signature,
# which torch.compile cannot trace, so a lazily built one would break a compiled layer's graph.
_MESSAGE_PASSING = GraphTransformerMessagePassing()


def reference_graph_transformer_attention(
    query: Tensor,  # [N_dst, H, C]
    key: Tensor,  # [N_src, H, C]
    value: Tensor,  # [N_src, H, C]
    edge_attr: Tensor | None,  # [M, H, C], in edge_index's order
    edge_index: Tensor,  # [2, M]: row 0 = source, row 1 = destination (PyG convention)
    size: tuple[int, int] | None = None,  # (N_src, N_dst); None: taken from key and query
    q_norm: Callable[[Tensor], Tensor] | None = None,  # e.g. torch.nn.RMSNorm(C), applied to [N_dst, H, C]
    k_norm: Callable[[Tensor], Tensor] | None = None,  # e.g. torch.nn.RMSNorm(C), applied to [N_src, H, C]
    *,
    edge_features: Tensor | None = None,  # [M, D], in edge_index's order; instead of edge_attr
    edge_weight: Tensor | None = None,  # [D, H * C]
    edge_bias: Tensor | None = None,  # [H * C]
) -> Tensor:  # [N_dst, H, C]
    """The op gtnorm's kernels compute (docs/functional-op.md, "What it computes") in plain torch + PyG: optional
    norms on query and key (normalised over C, weight shared by the heads), then
    :class:`GraphTransformerMessagePassing`. Runs in any floating dtype, float64 included, on any device;
    differentiable in everything, norm weights included.

    With ``edge_features`` (and ``edge_weight``, optionally ``edge_bias``) the edge features are their projection
    edge_features @ edge_weight + edge_bias, viewed [M, H, C] (formed here; the fused kernels never form it)."""
    if edge_features is not None:
        if edge_attr is not None:
            raise ValueError("pass either edge_attr or edge_features with edge_weight, not both")
        edge_attr = project_edge_features(edge_features, edge_weight, edge_bias, query.shape[1])
    if q_norm is not None:
        query = q_norm(query)
    if k_norm is not None:
        key = k_norm(key)
    # PyG's scatter needs int64 indices.
    return _MESSAGE_PASSING(query, key, value, edge_attr, edge_index.long(), size=size)


def project_edge_features(
    edge_features: Tensor,  # [M, D]
    edge_weight: Tensor,  # [D, H * C]
    edge_bias: Tensor | None,  # [H * C]
    heads: int,
) -> Tensor:  # [M, H, C]
    """The edge features the fused edge projection stands for: edge_features @ edge_weight + edge_bias, per head."""
    edge_attr = edge_features @ edge_weight
    if edge_bias is not None:
        edge_attr = edge_attr + edge_bias
    return edge_attr.view(edge_features.shape[0], heads, -1)
