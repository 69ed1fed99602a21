"""HeadParallelPlan: who holds which rows and computes which heads, agreed on by every rank of a process group."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from gtnorm.triton.layout import GraphLayout

# Order of the numbers each rank contributes to the one all_gather of HeadParallelPlan.build.
_FIELDS = (
    "dst_rows", "src_rows", "edge_rows", "heads", "channels", "layout.num_dst", "layout.num_src", "layout.num_edges"
)  # fmt: skip
_NO_EDGE_FEATURES = -1


def balanced_split(total: int, parts: int) -> tuple[int, ...]:
    """``total`` items in ``parts`` contiguous parts differing by at most one, the larger parts first (Anemoi's
    balanced partition, so a model sharded by Anemoi and this plan split heads alike)."""
    base, extra = divmod(total, parts)
    return tuple(base + 1 if r < extra else base for r in range(parts))


@dataclass(frozen=True)
class HeadParallelPlan:
    """How one graph's attention is split over a process group: the rows (destination nodes, source nodes, edges)
    each rank holds on the way in and out, and the heads each rank computes in between.

    Build it once per graph and group with :meth:`build` (a collective: every rank of the group calls it); it
    checks that the ranks agree, so a disagreement raises the same ValueError on every rank instead of leaving
    one rank waiting in an all-to-all. :func:`head_parallel_attention` then runs without further agreement
    (no communication beyond its all-to-alls, no host synchronisation).

    Shapes: every tuple has one entry per rank of the group, in rank order.
    """

    group: dist.ProcessGroup | None  # None: the default (world) group
    rank: int  # this process's rank in ``group``
    dst_rows: tuple[int, ...]  # destination nodes (query and output rows) held by each rank
    src_rows: tuple[int, ...]  # source nodes (key and value rows) held by each rank
    edge_rows: tuple[int, ...] | None  # edges (edge_attr rows) held by each rank; None without edge features
    heads: tuple[int, ...]  # heads computed by each rank
    channels: int  # channels per head

    @classmethod
    def build(
        cls,
        layout: GraphLayout,
        *,
        dst_rows: int,
        src_rows: int,
        edge_rows: int | None,
        heads: int,
        channels: int,
        group: dist.ProcessGroup | None = None,
    ) -> HeadParallelPlan:
        """The plan for this rank holding ``dst_rows`` query rows, ``src_rows`` key/value rows and ``edge_rows``
        edge_attr rows (None: no edge features) of the graph of ``layout``, with ``heads`` heads of ``channels``
        channels. Each rank holds consecutive rows: rank 0 the first ones, then rank 1, and so on; the layout is
        the whole graph's (the same on every rank). Heads are split in balanced contiguous parts.

        One all_gather of nine integers over ``group``, on ``layout``'s device (CUDA for NCCL). Invalid
        arguments on one rank raise there (TypeError / ValueError) and a ValueError naming that rank on the others.
        """
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("HeadParallelPlan.build needs an initialised torch.distributed process group")
        numbers = [dst_rows, src_rows, _NO_EDGE_FEATURES if edge_rows is None else edge_rows, heads, channels]
        problem = _argument_problem(layout, numbers)
        if problem is None:
            numbers += [layout.num_dst, layout.num_src, layout.num_edges]
            device = layout.device
        else:  # still take part in the all_gather, so that the other ranks raise too instead of waiting
            numbers = [0] * len(_FIELDS)
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
        world = dist.get_world_size(group)
        local = torch.tensor([problem is None, *numbers], dtype=torch.int64, device=device)
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local, group=group)
        rows = torch.stack(gathered).tolist()  # [world, 1 + 8], the same on every rank: so are the checks below
        if problem is not None:
            raise problem
        invalid = [rank for rank, row in enumerate(rows) if not row[0]]
        if invalid:
            raise ValueError(
                f"HeadParallelPlan.build: rank(s) {invalid} passed invalid arguments (their error says which)"
            )
        table = [row[1:] for row in rows]  # [world, 8]
        _check_agreement(table, world)
        columns = dict(zip(_FIELDS, zip(*table, strict=True), strict=True))
        return cls(
            group=group,
            rank=dist.get_rank(group),
            dst_rows=columns["dst_rows"],
            src_rows=columns["src_rows"],
            edge_rows=None if edge_rows is None else columns["edge_rows"],
            heads=balanced_split(heads, world),
            channels=channels,
        )

    def check_local(self, query: Tensor, key: Tensor, value: Tensor, edge_attr: Tensor | None) -> None:
        """ValueError unless this rank's tensors have the shapes the plan gives them (no communication)."""
        num_heads = sum(self.heads)
        expected = {
            "query": (self.dst_rows[self.rank], num_heads, self.channels),
            "key": (self.src_rows[self.rank], num_heads, self.channels),
            "value": (self.src_rows[self.rank], num_heads, self.channels),
        }
        named = {"query": query, "key": key, "value": value}
        if self.edge_rows is not None:
            expected["edge_attr"] = (self.edge_rows[self.rank], num_heads, self.channels)
            named["edge_attr"] = edge_attr
        elif edge_attr is not None:
            raise ValueError("edge_attr was given, but the plan was built with edge_rows=None")
        for name, t in named.items():
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != expected[name]:
                raise ValueError(
                    f"{name} on rank {self.rank} has shape {list(t.shape)}, the plan gives it {list(expected[name])}"
                )


def _argument_problem(layout, numbers: list) -> Exception | None:
    """The TypeError / ValueError this rank's own arguments deserve, if any."""
    if not isinstance(layout, GraphLayout):
        return TypeError(f"layout must be a gtnorm.GraphLayout, got {type(layout).__name__}")
    for name, value in zip(_FIELDS, numbers, strict=False):
        allowed_negative = name == "edge_rows" and value == _NO_EDGE_FEATURES  # edge_rows=None
        if isinstance(value, bool) or not isinstance(value, int) or (value < 0 and not allowed_negative):
            return ValueError(f"{name} must be a non-negative int, got {value!r}")
    return None


def _check_agreement(table: list[list[int]], world: int) -> None:
    """The same ValueError on every rank (all hold the same ``table``) when the ranks' numbers do not fit."""

    def column(name):
        return [row[_FIELDS.index(name)] for row in table]

    def by_rank(name):
        shown = ["none" if name == "edge_rows" and v == _NO_EDGE_FEATURES else v for v in column(name)]
        return ", ".join(f"rank {r}: {v}" for r, v in enumerate(shown))

    for name in ("heads", "channels", "layout.num_dst", "layout.num_src", "layout.num_edges"):
        if len(set(column(name))) > 1:
            raise ValueError(f"the ranks disagree on {name} ({by_rank(name)})")
    edge_rows = column("edge_rows")
    if len({r == _NO_EDGE_FEATURES for r in edge_rows}) > 1:
        raise ValueError(f"some ranks give edge features and some do not (edge_rows: {by_rank('edge_rows')})")
    totals = {"dst_rows": "layout.num_dst", "src_rows": "layout.num_src"}
    if edge_rows[0] != _NO_EDGE_FEATURES:
        totals["edge_rows"] = "layout.num_edges"
    for rows, total in totals.items():
        if sum(column(rows)) != column(total)[0]:
            raise ValueError(
                f"{rows} add up to {sum(column(rows))} over the ranks ({by_rank(rows)}), the layout has "
                f"{column(total)[0]} ({total})"
            )
    if column("heads")[0] < world:
        raise ValueError(f"{column('heads')[0]} heads cannot be split over {world} ranks: every rank needs one")
