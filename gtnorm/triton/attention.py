"""``graph_transformer_attention``: the public functional op, with its input checks."""

from __future__ import annotations

from torch import Tensor

from gtnorm._runtime import check_dtype, check_triton_device, resolve_eps
from gtnorm.triton.layout import GraphLayout
from gtnorm.triton.ops import graph_attention_forward


def graph_transformer_attention(
    query: Tensor,  # [N_dst, H, C]
    key: Tensor,  # [N_src, H, C]
    value: Tensor,  # [N_src, H, C]
    edge_attr: Tensor | None,  # [M, H, C] in the order of the edge_index the layout was built from
    layout: GraphLayout,
    *,
    qk_norm: bool = False,
    q_norm_weight: Tensor | None = None,  # [C]
    k_norm_weight: Tensor | None = None,  # [C]
    eps: float | None = None,
) -> Tensor:  # [N_dst, H, C]
    """Graph-transformer attention: for every destination i, softmax over its incoming edges (j -> i) of
    <q'_i, k'_j + e_ij> / sqrt(C), summed messages v_j + e_ij, per head.

    With ``qk_norm``, q' = RMSNorm(q) * q_norm_weight and k' = RMSNorm(k) * k_norm_weight over the channels
    of each head (weights [C] shared by the heads, optional), applied inside the kernels after each load.
    ``eps=None`` does what torch.nn.RMSNorm does (the float32 epsilon for 16- and 32-bit inputs). Destinations without
    incoming edges get 0. Differentiable in query, key, value, edge_attr and both weights.
    """
    _check_inputs(query, key, value, edge_attr, layout, qk_norm, q_norm_weight, k_norm_weight)
    eps = resolve_eps(eps, query.dtype)
    out, _ = graph_attention_forward(
        query.contiguous(),
        key.contiguous(),
        value.contiguous(),
        edge_attr.contiguous() if edge_attr is not None else None,
        q_norm_weight.contiguous() if q_norm_weight is not None else None,
        k_norm_weight.contiguous() if k_norm_weight is not None else None,
        *layout.tensors(),
        bool(qk_norm),
        eps,
    )
    return out


def check_attention_tensors(query, key, value, edge_attr) -> None:
    """The checks of query/key/value/edge_attr that the op and GraphTransformerConv (either backend) share:
    tensors of rank 3 with the same heads and channels, one floating dtype, one device."""
    named = {"query": query, "key": key, "value": value}
    if edge_attr is not None:
        named["edge_attr"] = edge_attr
    for name, t in named.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must have shape [num_nodes, heads, channels], got {list(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    heads, channels = query.shape[1:]
    if heads == 0 or channels == 0:
        raise ValueError(f"query must have at least one head and one channel, got {list(query.shape)}")
    for name, t in named.items():
        if tuple(t.shape[1:]) != (heads, channels):
            raise ValueError(f"{name} has {t.shape[1]} heads x {t.shape[2]} channels, query has {heads} x {channels}")
        if t.dtype != query.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}, query has {query.dtype}")
        if t.device != query.device:
            raise ValueError(f"{name} is on {t.device}, query is on {query.device}")
    if key.shape[0] != value.shape[0]:
        raise ValueError(f"key has {key.shape[0]} nodes, value has {value.shape[0]}: both are the source nodes")


def _check_inputs(query, key, value, edge_attr, layout, qk_norm, q_norm_weight, k_norm_weight) -> None:
    check_attention_tensors(query, key, value, edge_attr)
    for name, t in (("query", query), ("key", key), ("value", value), ("edge_attr", edge_attr)):
        if t is not None:
            check_dtype(name, t)
    if not isinstance(layout, GraphLayout):
        raise TypeError(f"layout must be a gtnorm.GraphLayout, got {type(layout).__name__}")
    heads_channels = tuple(query.shape[1:])
    if query.shape[0] != layout.num_dst:
        raise ValueError(f"query has {query.shape[0]} nodes, the layout has {layout.num_dst} destination nodes")
    if key.shape[0] != layout.num_src:
        raise ValueError(f"key has {key.shape[0]} nodes, the layout has {layout.num_src} source nodes")
    if edge_attr is not None and edge_attr.shape[0] != layout.num_edges:
        raise ValueError(f"edge_attr has {edge_attr.shape[0]} rows, the layout has {layout.num_edges} edges")
    if layout.device != query.device:
        raise ValueError(f"layout is on {layout.device}, query is on {query.device}")

    for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if w is None:
            continue
        if not qk_norm:
            raise ValueError(f"{name} was given but qk_norm=False")
        if not isinstance(w, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(w).__name__}")
        if tuple(w.shape) != (heads_channels[1],):
            raise ValueError(f"{name} must have shape [{heads_channels[1]}] (channels), got {list(w.shape)}")
        check_dtype(name, w)
        if w.device != query.device:
            raise ValueError(f"{name} is on {w.device}, query is on {query.device}")

    check_triton_device(query.device, "graph_transformer_attention")
