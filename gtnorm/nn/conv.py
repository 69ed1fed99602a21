"""GraphTransformerConv: Anemoi's graph-transformer message passing, with optional RMSNorm on query and key,
running the fused Triton kernels where they can run and the PyG reference elsewhere.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from gtnorm._runtime import triton_can_run_on
from gtnorm.nn.reference import reference_graph_transformer_attention
from gtnorm.rmsnorm.module import RMSNorm
from gtnorm.triton.attention import check_attention_tensors, graph_transformer_attention
from gtnorm.triton.layout import check_edge_index, check_edge_index_format
from gtnorm.triton.layout_cache import cached_layout

BACKENDS = ("auto", "triton", "pyg")


class GraphTransformerConv(torch.nn.Module):
    """Graph-transformer attention over the edges of a (bipartite) graph, per head::

        q' = q_norm(q), k' = k_norm(k)                    (RMSNorm over C, weight [C] shared by the heads)
        out_i = sum_{j -> i} softmax_j(<q'_i, k'_j + e_ij> / sqrt(C)) (v_j + e_ij)

    A drop-in for the message-passing part of Anemoi's ``GraphTransformerConv`` (``out_channels`` is the
    channel count per head, C); the projections to query/key/value/edge features stay with the caller.

    Args:
        out_channels: channels per head (C).
        qk_norm: apply RMSNorm (learnable weight [C], ones at init) to query and key. The norms are the
            submodules ``q_norm`` and ``k_norm`` (state_dict keys ``q_norm.weight``, ``k_norm.weight``).
        eps: the norms' epsilon; None means what torch.nn.RMSNorm does (float32's epsilon).
        backend: ``"triton"``: the fused Triton kernels (norms applied inside them); ``"pyg"``: torch's RMSNorm
            then the PyG reference; ``"auto"``: Triton exactly where it can run on the query's device
            (``gtnorm._runtime.triton_can_run_on``: CUDA tensors, or CPU tensors when ``TRITON_INTERPRET=1``
            is set, i.e. under the interpreter), PyG elsewhere. Both backends compute the same function
            from the same parameters, so a state_dict moves between them unchanged.

    The Triton backend needs a :class:`gtnorm.GraphLayout` of the graph: built on first sight of a graph and
    found again by content (a clone, a per-step batch expansion, an inference tensor holding it) in a cache
    that every layer shares; see :func:`gtnorm.triton.layout_cache.cached_layout`.
    """

    def __init__(self, out_channels: int, qk_norm: bool = False, eps: float | None = None, backend: str = "auto"):
        super().__init__()
        if isinstance(out_channels, bool) or not isinstance(out_channels, int) or out_channels <= 0:
            raise ValueError(f"out_channels must be a positive int (channels per head), got {out_channels!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.out_channels = out_channels
        self.qk_norm = bool(qk_norm)
        self.backend = backend
        if self.qk_norm:
            self.q_norm = RMSNorm(out_channels, eps=eps)
            self.k_norm = RMSNorm(out_channels, eps=eps)
        else:
            # Registered as None: the attributes exist, and the state_dict has no norm keys.
            self.register_module("q_norm", None)
            self.register_module("k_norm", None)

    def extra_repr(self) -> str:
        return f"out_channels={self.out_channels}, qk_norm={self.qk_norm}, backend={self.backend!r}"

    def forward(
        self,
        query: Tensor,  # [N_dst, H, C]
        key: Tensor,  # [N_src, H, C]
        value: Tensor,  # [N_src, H, C]
        edge_attr: Tensor | None,  # [M, H, C], in edge_index's order
        edge_index: Tensor,  # [2, M] int64/int32: row 0 = source, row 1 = destination
        size: tuple[int, int] | None = None,  # (N_src, N_dst); None: a square graph of query.shape[0] nodes
    ) -> Tensor:  # [N_dst, H, C]
        num_src, num_dst = self._check_inputs(query, key, value, edge_attr, edge_index, size)
        if self._uses_triton(query.device):
            return self._forward_triton(query, key, value, edge_attr, edge_index, num_src, num_dst)
        return self._forward_pyg(query, key, value, edge_attr, edge_index, num_src, num_dst)

    def _uses_triton(self, device: torch.device) -> bool:
        can_run = triton_can_run_on(device)
        if self.backend == "triton" and not can_run:
            hint = " (on the CPU they run only under TRITON_INTERPRET=1)" if device.type == "cpu" else ""
            raise RuntimeError(
                f"GraphTransformerConv(backend='triton'): the Triton kernels cannot run on {device} tensors here"
                f"{hint}; use backend='auto' or 'pyg' to fall back to the PyG path"
            )
        return self.backend == "triton" or (self.backend == "auto" and can_run)

    def _forward_triton(self, query, key, value, edge_attr, edge_index, num_src, num_dst) -> Tensor:
        eps = self._norm_eps()
        layout = cached_layout(edge_index, (num_src, num_dst))
        # The norms run inside the kernels (fused): they are not applied here.
        q_weight = self.q_norm.weight if self.qk_norm else None
        k_weight = self.k_norm.weight if self.qk_norm else None
        return graph_transformer_attention(
            query, key, value, edge_attr, layout,
            qk_norm=self.qk_norm, q_norm_weight=q_weight, k_norm_weight=k_weight, eps=eps,
        )  # fmt: skip

    def _forward_pyg(self, query, key, value, edge_attr, edge_index, num_src, num_dst) -> Tensor:
        # The Triton path range-checks indices while building its layout; PyG would fail inside a scatter
        # (or with a device-side assert on CUDA), so check here for the same clear error on both paths.
        check_edge_index(edge_index, (num_src, num_dst))
        if self.qk_norm:
            # torch's own RMSNorm math, whatever gtnorm.RMSNorm.forward would dispatch to.
            channels = (self.out_channels,)
            query = F.rms_norm(query, channels, self.q_norm.weight, self.q_norm.eps)
            key = F.rms_norm(key, channels, self.k_norm.weight, self.k_norm.eps)
        return reference_graph_transformer_attention(query, key, value, edge_attr, edge_index, size=(num_src, num_dst))

    def _norm_eps(self) -> float | None:
        if not self.qk_norm:
            return None
        # The kernels take one epsilon for both norms.
        if self.q_norm.eps != self.k_norm.eps:
            raise ValueError(
                f"q_norm.eps ({self.q_norm.eps}) and k_norm.eps ({self.k_norm.eps}) differ; the fused kernels "
                "take one eps for both"
            )
        return self.q_norm.eps

    def _check_inputs(self, query, key, value, edge_attr, edge_index, size) -> tuple[int, int]:
        """The layer's own checks, the same for both backends, before any work; returns (N_src, N_dst).

        Index ranges are checked on the way (by GraphLayout or check_edge_index); dtypes the kernels do
        not support are refused by graph_transformer_attention.
        """
        check_attention_tensors(query, key, value, edge_attr)
        channels = query.shape[2]
        if channels != self.out_channels:
            raise ValueError(f"query has {channels} channels per head, but out_channels={self.out_channels}")

        check_edge_index_format(edge_index)
        if edge_index.device != query.device:
            raise ValueError(f"edge_index is on {edge_index.device}, query is on {query.device}")
        num_edges = edge_index.shape[1]
        if edge_attr is not None and edge_attr.shape[0] != num_edges:
            raise ValueError(f"edge_attr has {edge_attr.shape[0]} rows, edge_index has {num_edges} edges")

        if self.qk_norm:
            for name, norm in (("q_norm", self.q_norm), ("k_norm", self.k_norm)):
                if norm.weight is not None and norm.weight.device != query.device:
                    raise ValueError(
                        f"{name}.weight is on {norm.weight.device}, query is on {query.device} (move the module "
                        "with .to())"
                    )

        num_src, num_dst = _resolve_size(size, key.shape[0], query.shape[0])
        return num_src, num_dst


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
        num_src, num_dst = (operator.index(n) for n in size)
    except TypeError:
        raise ValueError(f"size must hold two ints (num_src, num_dst), got {size!r}") from None
    if num_src != num_key_nodes:
        raise ValueError(f"size says {num_src} source nodes, key and value have {num_key_nodes}")
    if num_dst != num_query_nodes:
        raise ValueError(f"size says {num_dst} destination nodes, query has {num_query_nodes}")
    return num_src, num_dst
