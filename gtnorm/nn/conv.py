"""GraphTransformerConv: Anemoi's graph-transformer message passing, with optional norms on query and key (the
caller's modules or ones the layer builds), running the fused Triton kernels where they can run and the PyG
reference elsewhere.
"""

from __future__ import annotations

import functools
import operator
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from gtnorm._runtime import (
    SUPPORTED_DTYPES,
    check_interpreter_version,
    check_triton_device,
    triton_can_run_on,
    warn_auto_uses_interpreter,
)
from gtnorm.nn.norms import FusedNorm, apply_with_torch, check_norm_eps, fusable_norm
from gtnorm.nn.reference import reference_graph_transformer_attention
from gtnorm.rmsnorm.module import RMSNorm
from gtnorm.triton.attention import (
    LAYER_NORM_DEFAULT_EPS,
    MAX_EDGE_FEATURES,
    attention_on_checked_inputs,
    check_attention_tensors,
    norm_kind,
)
from gtnorm.triton.layout import check_edge_index, check_edge_index_format
from gtnorm.triton.layout_cache import cached_layout

BACKENDS = ("auto", "triton", "pyg")
# Every backend takes these (the kernels' own, float64 as float32 copies: _forward_triton), anything else is refused
# by name before any work, so that a model does not run on one backend and fail on the other.
LAYER_DTYPES = (*SUPPORTED_DTYPES, torch.float64)


class GraphTransformerConv(torch.nn.Module):
    """Graph-transformer attention over the edges of a (bipartite) graph, per head::

        q' = q_norm(q), k' = k_norm(k)                    (each over the C channels of a head, or none)
        out_i = sum_{j -> i} softmax_j(<q'_i, k'_j + e_ij> / sqrt(C)) (v_j + e_ij)

    A drop-in for the message-passing part of Anemoi's ``GraphTransformerConv`` (``out_channels`` is the
    channel count per head, C); the projections to query/key/value/edge features stay with the caller. Unlike
    PyG's ``GraphTransformerConv(in_channels, out_channels)``, it takes no input size: every option after
    ``out_channels`` is keyword-only.

    Args:
        out_channels: channels per head (C).
        qk_norm: False (no norm), True or ``"rms"`` (gtnorm.RMSNorm, weight [C] of ones at init) or ``"layer"``
            (torch.nn.LayerNorm(C): weight and bias [C]), built as the submodules ``q_norm`` and ``k_norm``
            (state_dict keys ``q_norm.weight``, ``k_norm.weight``, ...).
        eps: the built norms' epsilon; None means torch's default (float32's epsilon for RMSNorm, 1e-5 for
            LayerNorm).
        backend: ``"triton"``: the fused Triton kernels (norms applied inside them); ``"pyg"``: torch's norms
            then the PyG reference; ``"auto"``: Triton exactly where it can run on the query's device
            (``gtnorm._runtime.triton_can_run_on``: CUDA tensors, or CPU tensors when ``TRITON_INTERPRET=1``
            is set, i.e. under the interpreter), PyG elsewhere. Both backends compute the same function
            from the same parameters, so a state_dict moves between them unchanged.
        q_norm, k_norm: the caller's own norm modules instead of ``qk_norm``, kept as the submodules ``q_norm``
            and ``k_norm`` (so a model's parameters and state_dict keys stay where they are). Run inside the
            kernels when both are torch.nn.RMSNorm (gtnorm.RMSNorm included) or both torch.nn.LayerNorm, or
            subclasses of these (e.g. Anemoi's AutocastLayerNorm), over the last axis (normalized_shape ==
            (C,)), with or without weight and bias. Any other module, or a pair of different kinds, is applied
            as the caller's module before the kernels (correct, not fused), with one warning per module.
        lin_edge: the caller's edge projection, a torch.nn.Linear(D, H * C) (kept as the submodule ``lin_edge``).
            Then ``edge_attr`` holds the edges' D raw attributes, [M, D], and the edge features are
            ``lin_edge(edge_attr)`` viewed [M, H, C]: on the Triton backend computed inside the kernels and never
            stored (the fused edge projection of :func:`gtnorm.graph_transformer_attention`), on the PyG backend
            by the module. A subclass that overrides forward is applied as a module before the kernels (correct,
            not fused), with one warning.

    Shapes:
        query: [N_dst, H, C]; key, value: [N_src, H, C]; edge_attr: [M, H, C] or None, in edge_index's order
        ([M, D] with lin_edge); edge_index: [2, M] (row 0 = source, row 1 = destination); output: [N_dst, H, C] in
        query's dtype.
        query, key, value and edge_attr may have different dtypes (e.g. under autocast): float16, bfloat16,
        float32 or float64 on every backend, the norms' and lin_edge's parameters too; any other is a TypeError.
        The Triton kernels compute in float32, float64 tensors reaching them as float32 copies (output and
        gradients in float64, with float32's rounding); the PyG backend computes in the widest operand dtype.

    The Triton backend needs a :class:`gtnorm.GraphLayout` of the graph: built on first sight of a graph and
    found again by content (a clone, a per-step batch expansion, an inference tensor holding it) in a cache
    that every layer shares; see :func:`gtnorm.triton.layout_cache.cached_layout`.
    """

    def __init__(
        self,
        out_channels: int,
        *positional,
        qk_norm: bool | str = False,
        eps: float | None = None,
        backend: str = "auto",
        q_norm: torch.nn.Module | None = None,
        k_norm: torch.nn.Module | None = None,
        lin_edge: torch.nn.Linear | None = None,
    ):
        super().__init__()
        if positional:
            args = ", ".join(repr(a) for a in (out_channels, *positional))
            raise TypeError(
                f"GraphTransformerConv({args}): only out_channels (channels per head) is positional. This is not "
                "PyG's GraphTransformerConv(in_channels, out_channels): the projections stay with the caller. "
                "Pass the options by keyword, e.g. GraphTransformerConv(64, qk_norm=True)"
            )
        if isinstance(out_channels, bool) or not isinstance(out_channels, int) or out_channels <= 0:
            raise ValueError(f"out_channels must be a positive int (channels per head), got {out_channels!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        kind = norm_kind(qk_norm)
        self.out_channels = out_channels
        self.qk_norm = kind or False
        self.backend = backend
        if q_norm is not None or k_norm is not None:
            if kind is not None or eps is not None:
                raise ValueError(
                    "pass either qk_norm (and eps) or your own q_norm / k_norm modules, not both: the modules "
                    "carry their own kind and eps"
                )
            for name, module in (("q_norm", q_norm), ("k_norm", k_norm)):
                if module is not None and not isinstance(module, torch.nn.Module):
                    raise TypeError(f"{name} must be a torch.nn.Module or None, got {type(module).__name__}")
        elif kind == "rms":
            q_norm, k_norm = RMSNorm(out_channels, eps=eps), RMSNorm(out_channels, eps=eps)
        elif kind == "layer":
            if eps is not None and not eps >= 0.0:
                raise ValueError(f"eps must be non-negative, got {eps}")
            eps = LAYER_NORM_DEFAULT_EPS if eps is None else eps
            q_norm, k_norm = torch.nn.LayerNorm(out_channels, eps=eps), torch.nn.LayerNorm(out_channels, eps=eps)
        if lin_edge is not None and not isinstance(lin_edge, torch.nn.Linear):
            raise TypeError(f"lin_edge must be a torch.nn.Linear or None, got {type(lin_edge).__name__}")
        # Registered even when None: the attributes exist, and the state_dict has no norm or projection keys.
        self.register_module("q_norm", q_norm)
        self.register_module("k_norm", k_norm)
        self.register_module("lin_edge", lin_edge)
        self._warned_unfused: set[tuple[str, int]] = set()

    def reset_parameters(self) -> None:
        """Re-initialises the norms' and lin_edge's parameters (the layer has no others)."""
        for norm in (self.q_norm, self.k_norm, self.lin_edge):
            if norm is not None and hasattr(norm, "reset_parameters"):
                norm.reset_parameters()

    def extra_repr(self) -> str:
        return f"out_channels={self.out_channels}, qk_norm={self.qk_norm!r}, backend={self.backend!r}"

    def forward(
        self,
        query: Tensor,  # [N_dst, H, C]
        key: Tensor,  # [N_src, H, C]
        value: Tensor,  # [N_src, H, C]
        edge_attr: Tensor | None,  # [M, H, C], in edge_index's order; [M, D] raw attributes with lin_edge
        edge_index: Tensor,  # [2, M] int64/int32: row 0 = source, row 1 = destination
        size: tuple[int, int] | None = None,  # (N_src, N_dst); None: a square graph of query.shape[0] nodes
    ) -> Tensor:  # [N_dst, H, C]
        """Shapes: see the class docstring."""
        num_src, num_dst = self._check_inputs(query, key, value, edge_attr, edge_index, size)
        if self._uses_triton(query.device):
            return self._forward_triton(query, key, value, edge_attr, edge_index, num_src, num_dst)
        return self._forward_pyg(query, key, value, edge_attr, edge_index, num_src, num_dst)

    def _uses_triton(self, device: torch.device) -> bool:
        if self.backend == "triton":
            check_triton_device(device, "GraphTransformerConv(backend='triton')")
            return True
        if self.backend == "auto" and triton_can_run_on(device):
            check_interpreter_version("GraphTransformerConv(backend='auto')")
            warn_auto_uses_interpreter(device)
            return True
        return False

    def _forward_triton(self, query, key, value, edge_attr, edge_index, num_src, num_dst) -> Tensor:
        fused = self._fused_norms()
        if fused is None:  # applied here, as the caller's modules, then the kernels without a norm
            query, key = self._apply_norms(query, key)
            fused_q = fused_k = FusedNorm(False, None, None, None)
        else:
            fused_q, fused_k = fused
        edge_features = edge_weight = edge_bias = None
        if self.lin_edge is not None:
            if self._edge_projection_fusable():
                # Linear keeps its weight as [H * C, D]: the op takes the transposed view.
                edge_features, edge_weight, edge_bias = edge_attr, self.lin_edge.weight.t(), self.lin_edge.bias
                edge_attr = None
            else:
                edge_attr = self._project_edges(edge_attr, query.shape[1])
        # The kernels load float16, bfloat16 or float32 and compute in float32: float64 tensors reach them as float32
        # copies, the output and the gradients coming back in their own dtypes. The op's checks are made
        # (_check_inputs, fusable_norm, _uses_triton); the cached layout is built for (num_src, num_dst).
        out_dtype = query.dtype
        query, key, value, edge_attr = map(_for_kernels, (query, key, value, edge_attr))
        edge_features, edge_weight, edge_bias = map(_for_kernels, (edge_features, edge_weight, edge_bias))
        q_weight, q_bias, k_weight, k_bias = map(
            _for_kernels, (fused_q.weight, fused_q.bias, fused_k.weight, fused_k.bias)
        )
        layout = cached_layout(edge_index, (num_src, num_dst))
        out = attention_on_checked_inputs(
            query, key, value, edge_attr, layout, fused_q.kind or None,
            q_weight, q_bias, k_weight, k_bias, (fused_q.eps, fused_k.eps),
            edge_features, edge_weight, edge_bias, None,
        )  # fmt: skip
        return out.to(out_dtype)

    def _edge_projection_fusable(self) -> bool:
        """Whether the kernels can apply lin_edge themselves: a Linear whose forward is torch.nn.Linear's (warns
        once when not) on at most MAX_EDGE_FEATURES inputs (wider ones are a matmul's work, run before the kernels)."""
        if type(self.lin_edge).forward is torch.nn.Linear.forward:
            return self.lin_edge.in_features <= MAX_EDGE_FEATURES
        key = ("lin_edge", id(self.lin_edge))
        if key not in self._warned_unfused:
            self._warned_unfused.add(key)
            warnings.warn(
                f"GraphTransformerConv: lin_edge ({type(self.lin_edge).__name__}) overrides torch.nn.Linear.forward, "
                "so it is applied before the Triton kernels, not fused into them. The result is correct.",
                stacklevel=4,
            )
        return False

    def _project_edges(self, edge_attr: Tensor, heads: int) -> Tensor:  # [M, D] -> [M, H, C]
        return self.lin_edge(edge_attr).view(edge_attr.shape[0], heads, self.out_channels)

    def _forward_pyg(self, query, key, value, edge_attr, edge_index, num_src, num_dst) -> Tensor:
        # The Triton path range-checks indices while building its layout; PyG would fail inside a scatter
        # (or with a device-side assert on CUDA), so check here for the same clear error on both paths. Under
        # torch.compile a host sync would break the graph: there the check runs on the device.
        if torch.compiler.is_compiling():
            bounds = torch.tensor([[num_src], [num_dst]], device=edge_index.device)
            in_range = ((edge_index >= 0) & (edge_index < bounds)).all()
            torch._assert_async(in_range, "edge_index holds node indices out of range for size=(num_src, num_dst)")
        else:
            check_edge_index(edge_index, (num_src, num_dst))
        query_dtype = query.dtype
        query, key = self._apply_norms(query, key)
        if self.lin_edge is not None:
            edge_attr = self._project_edges(edge_attr, query.shape[1])
        # Mixed operand dtypes: computed in the widest of them, returned in the query's (as the kernels do).
        operands = [t for t in (query, key, value, edge_attr) if t is not None]
        dtype = functools.reduce(torch.promote_types, (t.dtype for t in operands))
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
        edge_attr = edge_attr.to(dtype) if edge_attr is not None else None
        out = reference_graph_transformer_attention(query, key, value, edge_attr, edge_index, size=(num_src, num_dst))
        return out.to(query_dtype)

    def _apply_norms(self, query: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
        if self.q_norm is not None:
            query = apply_with_torch(self.q_norm, query)
        if self.k_norm is not None:
            key = apply_with_torch(self.k_norm, key)
        return query, key

    def _fused_norms(self) -> tuple[FusedNorm, FusedNorm] | None:
        """The norms as the kernels take them; None when they must be applied unfused (said once per module)."""
        if self.q_norm is None and self.k_norm is None:
            return FusedNorm(False, None, None, None), FusedNorm(False, None, None, None)
        found = {}
        for name in ("q_norm", "k_norm"):
            module = getattr(self, name)
            found[name] = fusable_norm(module, self.out_channels) if module is not None else "it is None"
        reasons = {name: why for name, why in found.items() if isinstance(why, str)}
        if not reasons and found["q_norm"].kind != found["k_norm"].kind:
            reasons = {"q_norm": f"it is a {found['q_norm'].kind} norm and k_norm a {found['k_norm'].kind} norm"}
        if not reasons:
            return found["q_norm"], found["k_norm"]
        for name in ("q_norm", "k_norm"):
            module = getattr(self, name)
            check_norm_eps(module)
            key = (name, id(module))
            if module is not None and key not in self._warned_unfused:
                self._warned_unfused.add(key)
                why = "; ".join(f"{n}: {r}" for n, r in reasons.items())
                warnings.warn(
                    f"GraphTransformerConv: {name} ({type(module).__name__}) is applied before the Triton kernels, "
                    f"not fused into them ({why}). The result is correct; fusing needs both norms torch.nn.RMSNorm "
                    "or both torch.nn.LayerNorm over the C channels.",
                    stacklevel=4,
                )
        return None

    def _check_inputs(self, query, key, value, edge_attr, edge_index, size) -> tuple[int, int]:
        """The layer's own checks, the same for both backends, before any work; returns (N_src, N_dst).

        Index ranges are checked on the way (by GraphLayout or check_edge_index).
        """
        check_attention_tensors(query, key, value, edge_attr if self.lin_edge is None else None)
        _refuse_other_dtypes(query, "query")
        _refuse_other_dtypes(key, "key")
        _refuse_other_dtypes(value, "value")
        _refuse_other_dtypes(edge_attr, "edge_attr")
        channels = query.shape[2]
        if channels != self.out_channels:
            raise ValueError(f"query has {channels} channels per head, but out_channels={self.out_channels}")
        if self.lin_edge is not None:
            self._check_edge_projection(edge_attr, query)

        check_edge_index_format(edge_index)
        if edge_index.device != query.device:
            raise ValueError(f"edge_index is on {edge_index.device}, query is on {query.device}")
        num_edges = edge_index.shape[1]
        if edge_attr is not None and edge_attr.shape[0] != num_edges:
            raise ValueError(f"edge_attr has {edge_attr.shape[0]} rows, edge_index has {num_edges} edges")

        for name in ("q_norm", "k_norm"):
            norm = getattr(self, name)
            if norm is None:
                continue
            check_norm_eps(norm)
            # The module's own parameters (not named_parameters(): a generator over the module tree, a few us a call)
            for param_name, param in norm._parameters.items():
                _refuse_other_dtypes(param, name, param_name)
                if param is not None and param.device != query.device:
                    raise ValueError(
                        f"{name}.{param_name} is on {param.device}, query is on {query.device} (move the module "
                        "with .to())"
                    )

        num_src, num_dst = _resolve_size(size, key.shape[0], query.shape[0])
        return num_src, num_dst

    def _check_edge_projection(self, edge_attr, query: Tensor) -> None:
        """With lin_edge: edge_attr holds raw attributes [M, D], and lin_edge maps D to H * C."""
        if not isinstance(edge_attr, Tensor):
            raise TypeError(f"with lin_edge, edge_attr must be the raw edge attributes [M, D], got {edge_attr!r}")
        in_features, out_features = self.lin_edge.in_features, self.lin_edge.out_features
        if edge_attr.dim() != 2 or edge_attr.shape[1] != in_features:
            raise ValueError(
                f"with lin_edge, edge_attr must have shape [num_edges, {in_features}] (lin_edge.in_features), got "
                f"{list(edge_attr.shape)}"
            )
        if not edge_attr.is_floating_point():
            raise TypeError(f"edge_attr must be a floating-point tensor, got {edge_attr.dtype}")
        if edge_attr.device != query.device:
            raise ValueError(f"edge_attr is on {edge_attr.device}, query is on {query.device}")
        heads = query.shape[1]
        if out_features != heads * self.out_channels:
            raise ValueError(
                f"lin_edge.out_features is {out_features}, the attention has {heads} heads x {self.out_channels} "
                f"channels = {heads * self.out_channels}"
            )
        for name, param in self.lin_edge._parameters.items():
            _refuse_other_dtypes(param, "lin_edge", name)
            if param is not None and param.device != query.device:
                raise ValueError(f"lin_edge.{name} is on {param.device}, query is on {query.device}")


def _refuse_other_dtypes(t: Tensor | None, *name: str) -> None:
    """LAYER_DTYPES on every backend; the name's parts are joined only for the error (a host path of every call)."""
    if t is not None and t.dtype not in LAYER_DTYPES:
        raise TypeError(f"{'.'.join(name)} must be float16, bfloat16, float32 or float64, got {t.dtype}")


def _for_kernels(t: Tensor | None) -> Tensor | None:
    return t.float() if t is not None and t.dtype == torch.float64 else t


def _node_count(n) -> int:
    # Under torch.compile a size taken from a tensor's shape is a symbolic int (an int to the tracer):
    # operator.index would specialise it to this call's number, and make every new size (each mapper chunk's
    # sources) a new compiled graph.
    return n if isinstance(n, int) else operator.index(n)


def _resolve_size(size, num_key_nodes: int, num_query_nodes: int) -> tuple[int, int]:
    if size is None:
        if num_key_nodes != num_query_nodes:
            raise ValueError(
                f"key has {num_key_nodes} nodes and query has {num_query_nodes}: for a bipartite graph pass "
                "size=(num_src, num_dst)"
            )
        return num_query_nodes, num_query_nodes
    if not isinstance(size, Sequence) or len(size) != 2 or any(isinstance(n, bool) for n in size):
        raise ValueError(f"size must be (num_src, num_dst) or None, got {size!r}")
    try:
        num_src, num_dst = (_node_count(n) for n in size)
    except TypeError:
        raise ValueError(f"size must hold two ints (num_src, num_dst), got {size!r}") from None
    if num_src != num_key_nodes:
        raise ValueError(f"size says {num_src} source nodes, key and value have {num_key_nodes}")
    if num_dst != num_query_nodes:
        raise ValueError(f"size says {num_dst} destination nodes, query has {num_query_nodes}")
    return num_src, num_dst
