"""``graph_transformer_attention``: the public functional op, with its input checks."""

from __future__ import annotations

import numbers
import warnings

import torch
from torch import Tensor

from gtnorm._runtime import check_dtype, check_triton_device, resolve_eps
from gtnorm.triton.attention_launch import extended_dim_of
from gtnorm.triton.config import AttentionLaunchConfig, edge_projection_fits, edge_projection_pays
from gtnorm.triton.layout import GraphLayout
from gtnorm.triton.layout_cache import LayoutOfEdgeIndex
from gtnorm.triton.ops import graph_attention

NORM_KINDS = ("rms", "layer")
# Raw attributes per edge the fused edge projection takes: its kernels unroll a loop over them and hold a few
# [heads, D] tiles per program. Wider inputs are better projected by a matmul and passed as edge_attr.
MAX_EDGE_FEATURES = 64
# torch.nn.LayerNorm's default; RMSNorm's default (None) depends on the dtype (_runtime.resolve_eps).
LAYER_NORM_DEFAULT_EPS = 1e-5


def graph_transformer_attention(
    query: Tensor,  # [N_dst, H, C]
    key: Tensor,  # [N_src, H, C]
    value: Tensor,  # [N_src, H, C]
    edge_attr: Tensor | None,  # [M, H, C] in the order of the edge_index the layout was built from
    layout: GraphLayout | LayoutOfEdgeIndex,
    *,
    qk_norm: bool | str = False,
    q_norm_weight: Tensor | None = None,  # [C]
    q_norm_bias: Tensor | None = None,  # [C]
    k_norm_weight: Tensor | None = None,  # [C]
    k_norm_bias: Tensor | None = None,  # [C]
    eps: float | None | tuple[float | None, float | None] = None,
    edge_features: Tensor | None = None,  # [M, D], in the order of the edge_index the layout was built from
    edge_weight: Tensor | None = None,  # [D, H * C]
    edge_bias: Tensor | None = None,  # [H * C]
    launch: AttentionLaunchConfig | None = None,
) -> Tensor:  # [N_dst, H, C]
    """Graph-transformer attention: for every destination i, softmax over its incoming edges (j -> i) of
    <q'_i, k'_j + e_ij> / sqrt(C), summed messages v_j + e_ij, per head.

    ``qk_norm`` picks the norm applied to query and key over the channels of each head, inside the kernels
    after each load (no normalised copy is written):

    - ``False``: none, q' = q and k' = k;
    - ``True`` or ``"rms"``: torch.nn.RMSNorm, q' = q / sqrt(mean(q^2) + eps) * q_norm_weight;
    - ``"layer"``: torch.nn.LayerNorm, q' = (q - mean(q)) / sqrt(var(q) + eps) * q_norm_weight + q_norm_bias
      (biased variance).

    Likewise k' with the k_norm parameters. Weights and biases are [C], shared by the heads, each optional
    (biases only with ``"layer"``); statistics are computed in float32. ``eps`` is one value for both norms or a
    pair ``(eps_q, eps_k)``; None means torch's default for the kind: float32's epsilon for RMSNorm (what
    torch.nn.RMSNorm uses for 16- and 32-bit inputs), 1e-5 for LayerNorm.

    The four operands may have different dtypes (float16, bfloat16, float32, e.g. under autocast): each is
    converted to float32 when loaded, the output has the query's dtype and each gradient its input's dtype.
    Destinations without incoming edges get 0. Differentiable in query, key, value, edge_attr and every norm
    parameter.

    Fused edge projection: instead of ``edge_attr``, pass the edges' raw attributes ``edge_features`` [M, D]
    (D <= 64) with ``edge_weight`` [D, H * C] and optionally ``edge_bias`` [H * C]; then
    e = (edge_features @ edge_weight + edge_bias).view(M, H, C) is used inside the kernels and never stored
    (gtnorm/triton/edge_projection.py). torch.nn.Linear(D, H * C) keeps its weight as [H * C, D]: pass
    ``linear.weight.t()`` (a view: the kernels read a contiguous copy of W where its columns are strided, 4 D H C
    bytes) and ``linear.bias``. Differentiable in all three; the gradient of edge_features is computed only when it
    requires grad. Weight and bias gradients are sums over all edges in a fixed order (bitwise reproducible).

    ``layout`` is the graph's :class:`GraphLayout`, or what :func:`gtnorm.triton.layout_cache.cached_layout` returns
    under torch.compile (the op then finds the layout when it runs). ``launch`` is the kernels' launch plan; None
    takes ``gtnorm.triton.config.launch_config_for``'s. Sweeps and tests pass their own; under torch.compile only
    the default can run.

    Shapes:
        query: [N_dst, H, C]; key, value: [N_src, H, C]; edge_attr: [M, H, C] or None (M = layout.num_edges,
        in the caller's edge order); norm weights and biases: [C]; edge_features: [M, D]; edge_weight:
        [D, H * C]; edge_bias: [H * C]; output: [N_dst, H, C].
    """
    kind = norm_kind(qk_norm)
    params = {"q_norm_weight": q_norm_weight, "q_norm_bias": q_norm_bias}
    params.update(k_norm_weight=k_norm_weight, k_norm_bias=k_norm_bias)
    _check_inputs(query, key, value, edge_attr, layout, kind, params)
    check_edge_projection(edge_attr, edge_features, edge_weight, edge_bias, query, layout.num_edges)
    return attention_on_checked_inputs(
        query, key, value, edge_attr, layout, kind, *params.values(), eps, edge_features, edge_weight, edge_bias, launch
    )


def attention_on_checked_inputs(
    query: Tensor,  # [N_dst, H, C]
    key: Tensor,  # [N_src, H, C]
    value: Tensor,  # [N_src, H, C]
    edge_attr: Tensor | None,  # [M, H, C]
    layout: GraphLayout | LayoutOfEdgeIndex,
    kind: str | None,  # norm_kind's: None, "rms" or "layer"
    q_norm_weight: Tensor | None,  # [C]
    q_norm_bias: Tensor | None,  # [C]
    k_norm_weight: Tensor | None,  # [C]
    k_norm_bias: Tensor | None,  # [C]
    eps,
    edge_features: Tensor | None,  # [M, D]
    edge_weight: Tensor | None,  # [D, H * C]
    edge_bias: Tensor | None,  # [H * C]
    launch: AttentionLaunchConfig | None,
) -> Tensor:  # [N_dst, H, C]
    """graph_transformer_attention after its checks: for a caller that has made every one of them already
    (GraphTransformerConv, whose own checks and cached layout cover them). On small graphs a call is host-bound,
    and checking twice cost ~7 % of an eager forward+backward's host time (benchmarks/NOTES.md, v21)."""
    eps_q, eps_k = resolve_norm_eps(eps, kind, query.dtype, key.dtype)
    # A plan passed in keeps the projection fused (sweeps and tests run the kernels whatever the rule picks).
    if launch is None and not fuses_edge_projection(query, edge_features, edge_bias, layout, kind):
        edge_attr = materialised_edge_features(edge_features, edge_weight, edge_bias, query)
        edge_features = edge_weight = edge_bias = None
    operands = [t.contiguous() if t is not None else None for t in (query, key, value, edge_attr, edge_features)]
    # Strided columns (a transposed torch.nn.Linear weight, as Anemoi's blocks pass lin_edge.weight.t()) made the
    # node-block kernels' loads of W 1.2-1.4x slower (benchmarks/NOTES.md, v16): one copy here serves the forward and
    # the backward (and its gradient reaches the caller's view through autograd); row-strided views are read as they
    # are.
    if edge_weight is not None and edge_weight.stride(1) != 1:
        edge_weight = edge_weight.contiguous()
    projection = [edge_weight, edge_bias.contiguous() if edge_bias is not None else None]
    norm_params = [
        p.contiguous() if p is not None else None for p in (q_norm_weight, q_norm_bias, k_norm_weight, k_norm_bias)
    ]
    out, *_ = graph_attention(
        *operands, *projection, *norm_params, list(layout.tensors()), kind or "none", eps_q, eps_k, launch=launch
    )
    return out


def fuses_edge_projection(
    query: Tensor, edge_features, edge_bias, layout: GraphLayout | LayoutOfEdgeIndex, kind
) -> bool:
    """True without edge_features (nothing to project). Otherwise whether the op projects the raw attributes inside
    the kernels (config.edge_projection_pays, and tiles that fit the device) or materialises the edge features first;
    the second with a warning, once per shape, where the tiles alone decide."""
    if edge_features is None:
        return True
    heads, channels = query.shape[1:]
    extended_dim = extended_dim_of(edge_features, edge_bias)
    if not edge_projection_pays(layout.num_edges, layout.num_dst, kind, heads * channels):
        return False
    if edge_projection_fits(heads, channels, extended_dim, query.device):
        return True
    if (heads, channels, extended_dim) not in _WARNED_NO_FIT:
        _WARNED_NO_FIT.add((heads, channels, extended_dim))
        warnings.warn(
            f"gtnorm: the fused edge projection's tiles do not fit this device's shared memory for {heads} heads x "
            f"{channels} channels and {extended_dim} weight rows; the edge features are materialised instead",
            stacklevel=3,
        )
    return False


_WARNED_NO_FIT: set[tuple[int, int, int]] = set()


def materialised_edge_features(
    edge_features: Tensor,  # [M, D]
    edge_weight: Tensor,  # [D, H * C]
    edge_bias: Tensor | None,  # [H * C]
    query: Tensor,  # [N_dst, H, C]
) -> Tensor:  # [M, H, C] in query's dtype
    """e = edge_features @ edge_weight + edge_bias, formed in the query's dtype (as autocast runs lin_edge)."""
    dtype = query.dtype
    weight = edge_weight.to(dtype)
    bias = edge_bias.to(dtype) if edge_bias is not None else None
    features = torch.nn.functional.linear(edge_features.to(dtype), weight.t(), bias)
    return features.view(edge_features.shape[0], *query.shape[1:])


def check_edge_projection(edge_attr, edge_features, edge_weight, edge_bias, query: Tensor, num_edges: int) -> None:
    """The checks of the fused edge projection's inputs (ValueError / TypeError naming the argument)."""
    if edge_features is None:
        for name, t in (("edge_weight", edge_weight), ("edge_bias", edge_bias)):
            if t is not None:
                raise ValueError(f"{name} was given without edge_features (the raw edge attributes it projects)")
        return
    if edge_attr is not None:
        raise ValueError(
            "pass either edge_attr (edge features [M, H, C]) or edge_features with edge_weight (projected inside "
            "the kernels), not both"
        )
    if edge_weight is None:
        raise ValueError("edge_features needs edge_weight [D, H * C] (the projection to the edge features)")
    heads, channels = query.shape[1:]
    named = {"edge_features": edge_features, "edge_weight": edge_weight}
    if edge_bias is not None:
        named["edge_bias"] = edge_bias
    for name, t in named.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        check_dtype(name, t)
        if t.device != query.device:
            raise ValueError(f"{name} is on {t.device}, query is on {query.device}")
    if edge_features.dim() != 2 or edge_features.shape[0] != num_edges:
        raise ValueError(f"edge_features must have shape [num_edges={num_edges}, D], got {list(edge_features.shape)}")
    edge_dim = edge_features.shape[1]
    if not 1 <= edge_dim <= MAX_EDGE_FEATURES:
        raise ValueError(
            f"edge_features must have 1 to {MAX_EDGE_FEATURES} attributes per edge, got {edge_dim} (project wider "
            "ones with a matmul and pass edge_attr)"
        )
    if tuple(edge_weight.shape) != (edge_dim, heads * channels):
        transposed = tuple(edge_weight.shape) == (heads * channels, edge_dim)
        hint = " (a torch.nn.Linear weight is [H * C, D]: pass weight.t())" if transposed else ""
        raise ValueError(
            f"edge_weight must have shape [D={edge_dim}, H * C={heads * channels}], got {list(edge_weight.shape)}"
            + hint
        )
    if edge_bias is not None and tuple(edge_bias.shape) != (heads * channels,):
        raise ValueError(f"edge_bias must have shape [H * C={heads * channels}], got {list(edge_bias.shape)}")


def norm_kind(qk_norm) -> str | None:
    """The norm kind named by a ``qk_norm`` argument: None, "rms" or "layer"."""
    if qk_norm is False:
        return None
    if qk_norm is True:
        return "rms"
    if isinstance(qk_norm, str) and qk_norm in NORM_KINDS:
        return qk_norm
    raise ValueError(f"qk_norm must be False, True, 'rms' or 'layer', got {qk_norm!r}")


def resolve_norm_eps(eps, kind: str | None, query_dtype, key_dtype) -> tuple[float, float]:
    """(eps_q, eps_k) from ``eps`` (a number, None, or a pair of those), None replaced by torch's default for
    the norm kind; a negative or non-numeric eps is a ValueError / TypeError."""
    if isinstance(eps, tuple | list):
        if len(eps) != 2:
            raise ValueError(f"eps must be a number, None or a pair (eps_q, eps_k), got {eps!r}")
        eps_q, eps_k = eps
    else:
        eps_q = eps_k = eps
    resolved = []
    for name, value, dtype in (("eps_q", eps_q, query_dtype), ("eps_k", eps_k, key_dtype)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            raise TypeError(f"eps must be a number, None or a pair (eps_q, eps_k); {name} is {value!r}")
        if kind == "layer" and value is None:
            value = LAYER_NORM_DEFAULT_EPS
        try:
            resolved.append(resolve_eps(value, dtype))
        except ValueError:
            raise ValueError(f"eps must be non-negative; {name} is {value!r}") from None
    return resolved[0], resolved[1]


def check_attention_tensors(query, key, value, edge_attr) -> None:
    """The checks of query/key/value/edge_attr that the op and GraphTransformerConv (either backend) share:
    floating tensors of rank 3 with the same heads and channels, on one device (dtypes may differ)."""
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
        if t.device != query.device:
            raise ValueError(f"{name} is on {t.device}, query is on {query.device}")
    if key.shape[0] != value.shape[0]:
        raise ValueError(f"key has {key.shape[0]} nodes, value has {value.shape[0]}: both are the source nodes")


def _check_inputs(query, key, value, edge_attr, layout, kind, params: dict) -> None:
    check_attention_tensors(query, key, value, edge_attr)
    for name, t in (("query", query), ("key", key), ("value", value), ("edge_attr", edge_attr)):
        if t is not None:
            check_dtype(name, t)
    if not isinstance(layout, GraphLayout | LayoutOfEdgeIndex):
        raise TypeError(f"layout must be a gtnorm.GraphLayout, got {type(layout).__name__}")
    if query.shape[0] != layout.num_dst:
        raise ValueError(f"query has {query.shape[0]} nodes, the layout has {layout.num_dst} destination nodes")
    if key.shape[0] != layout.num_src:
        raise ValueError(f"key has {key.shape[0]} nodes, the layout has {layout.num_src} source nodes")
    if edge_attr is not None and edge_attr.shape[0] != layout.num_edges:
        raise ValueError(f"edge_attr has {edge_attr.shape[0]} rows, the layout has {layout.num_edges} edges")
    if layout.device != query.device:
        raise ValueError(f"layout is on {layout.device}, query is on {query.device}")

    channels = query.shape[2]
    for name, p in params.items():
        if p is None:
            continue
        if kind is None:
            raise ValueError(f"{name} was given but qk_norm=False")
        if name.endswith("bias") and kind != "layer":
            raise ValueError(f"{name} was given with qk_norm={kind!r}: only LayerNorm (qk_norm='layer') has a bias")
        if not isinstance(p, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(p).__name__}")
        if tuple(p.shape) != (channels,):
            raise ValueError(f"{name} must have shape [{channels}] (channels), got {list(p.shape)}")
        check_dtype(name, p)
        if p.device != query.device:
            raise ValueError(f"{name} is on {p.device}, query is on {query.device}")

    check_triton_device(query.device, "graph_transformer_attention")
