"""``graph_transformer_attention``: the public functional op, with its input checks."""

from __future__ import annotations

import numbers

from torch import Tensor

from gtnorm._runtime import check_dtype, check_triton_device, resolve_eps
from gtnorm.triton.config import AttentionLaunchConfig
from gtnorm.triton.layout import GraphLayout
from gtnorm.triton.ops import graph_attention

NORM_KINDS = ("rms", "layer")
# torch.nn.LayerNorm's default; RMSNorm's default (None) depends on the dtype (_runtime.resolve_eps).
LAYER_NORM_DEFAULT_EPS = 1e-5


def graph_transformer_attention(
    query: Tensor,  # [N_dst, H, C]
    key: Tensor,  # [N_src, H, C]
    value: Tensor,  # [N_src, H, C]
    edge_attr: Tensor | None,  # [M, H, C] in the order of the edge_index the layout was built from
    layout: GraphLayout,
    *,
    qk_norm: bool | str = False,
    q_norm_weight: Tensor | None = None,  # [C]
    q_norm_bias: Tensor | None = None,  # [C]
    k_norm_weight: Tensor | None = None,  # [C]
    k_norm_bias: Tensor | None = None,  # [C]
    eps: float | None | tuple[float | None, float | None] = None,
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

    ``launch`` is the kernels' launch plan; None takes ``gtnorm.triton.config.attention_launch_config(H, C)``.
    Sweeps and tests pass their own; under torch.compile only the default can run.

    Shapes:
        query: [N_dst, H, C]; key, value: [N_src, H, C]; edge_attr: [M, H, C] or None (M = layout.num_edges,
        in the caller's edge order); norm weights and biases: [C]; output: [N_dst, H, C].
    """
    kind = norm_kind(qk_norm)
    params = {"q_norm_weight": q_norm_weight, "q_norm_bias": q_norm_bias}
    params.update(k_norm_weight=k_norm_weight, k_norm_bias=k_norm_bias)
    _check_inputs(query, key, value, edge_attr, layout, kind, params)
    eps_q, eps_k = resolve_norm_eps(eps, kind, query.dtype, key.dtype)
    operands = [t.contiguous() if t is not None else None for t in (query, key, value, edge_attr)]
    norm_params = [p.contiguous() if p is not None else None for p in params.values()]
    out, _ = graph_attention(*operands, *norm_params, *layout.tensors(), kind or "none", eps_q, eps_k, launch=launch)
    return out


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
    if not isinstance(layout, GraphLayout):
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
