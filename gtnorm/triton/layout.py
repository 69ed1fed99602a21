"""GraphLayout: the edge orderings the attention kernels walk, built once per graph.

The forward and the first backward pass run one destination node at a time over its incoming edges
(CSC, by destination); the second backward pass runs one source node at a time over its outgoing edges.
Both orders point back into the caller's edge order, so edge features are read and their gradient written
in place, never copied into a sorted order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, eq=False)
class GraphLayout:
    num_src: int
    num_dst: int
    num_edges: int
    max_in_degree: int
    max_out_degree: int
    dst_offsets: torch.Tensor  # [N_dst + 1] int32: incoming edges of node i are positions dst_offsets[i]:[i+1]
    csc_src: torch.Tensor  # [M] int32: source node of each edge, by destination
    csc_edge_id: torch.Tensor  # [M] int32: caller's index of each edge, by destination
    src_offsets: torch.Tensor  # [N_src + 1] int32: outgoing edges of node j are src_offsets[j]:[j+1]
    csr_dst: torch.Tensor  # [M] int32: destination node of each edge, by source
    csr_edge_id: torch.Tensor  # [M] int32: caller's index of each edge, by source

    @property
    def device(self) -> torch.device:
        return self.csc_src.device

    @property
    def mean_in_degree(self) -> float:
        return self.num_edges / max(self.num_dst, 1)

    @property
    def mean_out_degree(self) -> float:
        return self.num_edges / max(self.num_src, 1)

    def index_bytes(self) -> int:
        """Bytes of the index arrays the kernels read: part of the traffic floor of every pass."""
        return sum(
            t.numel() * t.element_size()
            for t in (self.dst_offsets, self.csc_src, self.csc_edge_id, self.src_offsets, self.csr_dst,
                      self.csr_edge_id)
        )

    @classmethod
    def from_edge_index(
        cls,
        edge_index: torch.Tensor,  # [2, M]: row 0 = source, row 1 = destination (PyG convention)
        num_nodes: int | Sequence[int] | None = None,
    ) -> GraphLayout:
        """Validates ``edge_index`` and builds both orders (stable sorts, so the layout is deterministic).

        ``num_nodes`` is ``(num_src, num_dst)`` for a bipartite graph, one int for a square one, or None to
        take ``max index + 1`` over both rows (PyG's rule for square graphs).
        """
        num_src, num_dst = check_edge_index(edge_index, num_nodes)
        src, dst = edge_index[0].long(), edge_index[1].long()
        num_edges = src.numel()
        csc_order = torch.argsort(dst, stable=True)
        csr_order = torch.argsort(src, stable=True)
        in_degree = torch.bincount(dst, minlength=num_dst)
        out_degree = torch.bincount(src, minlength=num_src)
        return cls(
            num_src=num_src,
            num_dst=num_dst,
            num_edges=num_edges,
            max_in_degree=int(in_degree.max()) if num_dst else 0,
            max_out_degree=int(out_degree.max()) if num_src else 0,
            dst_offsets=_offsets(in_degree),
            csc_src=src[csc_order].int(),
            csc_edge_id=csc_order.int(),
            src_offsets=_offsets(out_degree),
            csr_dst=dst[csr_order].int(),
            csr_edge_id=csr_order.int(),
        )


def check_edge_index(
    edge_index: torch.Tensor,  # [2, M]: row 0 = source, row 1 = destination
    num_nodes: int | Sequence[int] | None = None,
) -> tuple[int, int]:
    """Checks type, shape and index range of ``edge_index`` (one device sync) and returns (num_src, num_dst),
    resolving ``num_nodes`` as :meth:`GraphLayout.from_edge_index` documents."""
    check_edge_index_format(edge_index)
    if edge_index.shape[1] > 0:
        src, dst = edge_index[0], edge_index[1]
        lo_src, hi_src, lo_dst, hi_dst = torch.stack([src.min(), src.max(), dst.min(), dst.max()]).tolist()
    else:
        lo_src = lo_dst = 0
        hi_src = hi_dst = -1
    num_src, num_dst = _resolve_num_nodes(num_nodes, max(hi_src, hi_dst) + 1)
    if min(lo_src, lo_dst) < 0:
        raise ValueError("edge_index holds negative node indices")
    if hi_src >= num_src:
        raise ValueError(f"edge_index[0] (source) holds index {hi_src}, but there are {num_src} source nodes")
    if hi_dst >= num_dst:
        raise ValueError(f"edge_index[1] (destination) holds index {hi_dst}, but there are {num_dst} destination nodes")
    return num_src, num_dst


def check_edge_index_format(edge_index: torch.Tensor) -> None:  # [2, M]
    """The checks that need no device sync: a tensor, shape [2, M], an integer type the kernels read."""
    if not isinstance(edge_index, torch.Tensor):
        raise TypeError(f"edge_index must be a torch.Tensor, got {type(edge_index).__name__}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape [2, num_edges], got {list(edge_index.shape)}")
    if edge_index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"edge_index must be int64 or int32, got {edge_index.dtype}")
    if edge_index.shape[1] > _INT32_MAX:
        raise ValueError(f"edge_index has {edge_index.shape[1]} edges; at most 2**31 - 1 are supported")


def _resolve_num_nodes(num_nodes, inferred: int) -> tuple[int, int]:
    if num_nodes is None:
        return inferred, inferred
    if isinstance(num_nodes, int):
        pair = (num_nodes, num_nodes)
    else:
        pair = tuple(num_nodes)
        if len(pair) != 2:
            raise ValueError(f"num_nodes must be an int or (num_src, num_dst), got {num_nodes!r}")
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= _INT32_MAX for n in pair):
        raise ValueError(f"num_nodes must hold non-negative ints below 2**31, got {num_nodes!r}")
    return pair


def _offsets(degree: torch.Tensor) -> torch.Tensor:
    offsets = torch.zeros(degree.numel() + 1, dtype=torch.int32, device=degree.device)
    offsets[1:] = torch.cumsum(degree, dim=0)
    return offsets
