"""``head_parallel_attention``: gtnorm's attention op run head-parallel over a torch.distributed process group."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from gtnorm.distributed.plan import HeadParallelPlan
from gtnorm.triton.attention import graph_transformer_attention
from gtnorm.triton.config import AttentionLaunchConfig
from gtnorm.triton.layout import GraphLayout


def head_parallel_attention(
    query: Tensor,  # [N_dst_rank, H, C]: this rank's rows
    key: Tensor,  # [N_src_rank, H, C]
    value: Tensor,  # [N_src_rank, H, C]
    edge_attr: Tensor | None,  # [M_rank, H, C]: this rank's edges, in the layout's edge order
    layout: GraphLayout,  # the whole graph's
    plan: HeadParallelPlan,
    *,
    qk_norm: bool | str = False,
    q_norm_weight: Tensor | None = None,  # [C], the same on every rank
    q_norm_bias: Tensor | None = None,  # [C]
    k_norm_weight: Tensor | None = None,  # [C]
    k_norm_bias: Tensor | None = None,  # [C]
    eps: float | None | tuple[float | None, float | None] = None,
    launch: AttentionLaunchConfig | None = None,
) -> Tensor:  # [N_dst_rank, H, C]: this rank's rows of the output
    """:func:`gtnorm.graph_transformer_attention` over a process group, split by heads (as Anemoi's
    ``shard_strategy="heads"``): each rank holds some rows of every input (nodes and edges, consecutive, as the
    ``plan`` says), an all-to-all turns these into all rows of some heads, every rank runs the fused op on its
    heads over the whole graph, and a second all-to-all returns this rank's rows of every head. Differentiable
    like the op: the backward runs the all-to-alls in reverse.

    The QK-norm parameters are shared by the heads, so each rank's backward gives a part of their gradient:
    the parts are summed over the group inside the backward, and every rank ends with the whole gradient (the
    one a single process gets). Keep them out of any further sum of partial gradients; an average over the
    group (DDP) leaves the equal gradients unchanged. Inputs' gradients arrive on the rank that holds them.

    ``launch``: the kernels' launch plan for this rank's heads (None: the default for ``plan.heads[rank]``
    heads of C channels).

    Every rank of the group must call this together, with tensors of the shapes the plan gives it (checked on
    each rank before any communication) and the same dtypes and norm arguments. The plan's agreement covers
    what ranks could disagree on; a rank whose tensors do not fit its plan raises, and its peers then wait in
    the all-to-all until the process group's timeout.

    Shapes:
        query: [plan.dst_rows[rank], H, C]; key, value: [plan.src_rows[rank], H, C]; edge_attr:
        [plan.edge_rows[rank], H, C] or None; norm weights and biases: [C]; output: [plan.dst_rows[rank], H, C].
        Rank r's rows are the r-th consecutive block of the graph's nodes (and edges, in the order of the
        edge_index the layout was built from).
    """
    if not isinstance(plan, HeadParallelPlan):
        raise TypeError(f"plan must be a gtnorm.distributed.HeadParallelPlan, got {type(plan).__name__}")
    plan.check_local(query, key, value, edge_attr)
    edges_differ = plan.edge_rows is not None and layout.num_edges != sum(plan.edge_rows)
    if layout.num_dst != sum(plan.dst_rows) or layout.num_src != sum(plan.src_rows) or edges_differ:
        raise ValueError("layout is not the graph the plan was built for (its node or edge counts differ)")
    norm_params = dict(
        q_norm_weight=q_norm_weight, q_norm_bias=q_norm_bias, k_norm_weight=k_norm_weight, k_norm_bias=k_norm_bias
    )
    # Shared by the heads: each rank's backward gives part of their gradient, summed over the group.
    norm_params = {name: _sum_gradient_over(p, plan.group) for name, p in norm_params.items() if p is not None}
    query = _rows_to_heads(query, plan.dst_rows, plan)
    key = _rows_to_heads(key, plan.src_rows, plan)
    value = _rows_to_heads(value, plan.src_rows, plan)
    edge_attr = _rows_to_heads(edge_attr, plan.edge_rows, plan) if edge_attr is not None else None
    out = graph_transformer_attention(
        query, key, value, edge_attr, layout, qk_norm=qk_norm, eps=eps, launch=launch, **norm_params
    )
    return _heads_to_rows(out, plan)


def _rows_to_heads(x: Tensor, rows: tuple[int, ...], plan: HeadParallelPlan) -> Tensor:
    """[rows[rank], H, C] -> [sum(rows), heads[rank], C]: this rank's rows of every head to all rows of its heads."""
    channels, me = plan.channels, plan.rank
    # Peer r receives [rows[me], heads[r], C]; what arrives from the peers, in rank order, is then already the
    # [sum(rows), heads[me], C] tensor, rows in order.
    sent_sizes = [rows[me] * h * channels for h in plan.heads]
    send = x.new_empty(sum(sent_sizes))
    start = 0
    for size, part in zip(sent_sizes, x.split(plan.heads, dim=1), strict=True):
        send.narrow(0, start, size).view(part.shape).copy_(part)  # one copy of x; autograd records each slice
        start += size
    received_sizes = [n * plan.heads[me] * channels for n in rows]
    received = _all_to_all(send, received_sizes, sent_sizes, plan.group)
    return received.view(sum(rows), plan.heads[me], channels)


def _heads_to_rows(out: Tensor, plan: HeadParallelPlan) -> Tensor:
    """[N_dst, heads[rank], C] -> [dst_rows[rank], H, C]: the inverse of :func:`_rows_to_heads` for the output."""
    channels, me, rows = plan.channels, plan.rank, plan.dst_rows
    sent_sizes = [n * plan.heads[me] * channels for n in rows]  # peer r's rows are one contiguous block
    received_sizes = [rows[me] * h * channels for h in plan.heads]
    received = _all_to_all(out.reshape(-1), received_sizes, sent_sizes, plan.group)
    parts = received.split(received_sizes)
    return torch.cat([part.view(rows[me], h, channels) for part, h in zip(parts, plan.heads, strict=True)], dim=1)


class _AllToAll(torch.autograd.Function):
    """torch.distributed.all_to_all_single of a flat tensor, differentiable: the backward sends the gradient
    back the way the values came (the same exchange with the sizes swapped).

    (torch.distributed.nn.functional.all_to_all_single does the same but is deprecated from torch 2.12; the
    functional collectives' autograd variant returns lazily-waited tensors that Triton kernels cannot read.)
    """

    @staticmethod
    def forward(ctx, send: Tensor, received_sizes: list[int], sent_sizes: list[int], group) -> Tensor:
        ctx.sizes, ctx.group = (received_sizes, sent_sizes), group
        received = send.new_empty(sum(received_sizes))
        dist.all_to_all_single(received, send, received_sizes, sent_sizes, group=group)
        return received

    @staticmethod
    def backward(ctx, grad: Tensor):
        received_sizes, sent_sizes = ctx.sizes
        grad_send = grad.new_empty(sum(sent_sizes))
        dist.all_to_all_single(grad_send, grad.contiguous(), sent_sizes, received_sizes, group=ctx.group)
        return grad_send, None, None, None


def _all_to_all(send: Tensor, received_sizes: list[int], sent_sizes: list[int], group) -> Tensor:  # [S] -> [R]
    return _AllToAll.apply(send, received_sizes, sent_sizes, group)


class _SumGradientOverGroup(torch.autograd.Function):
    """Identity forward; the backward sums the gradient over the group (every rank gets the sum)."""

    @staticmethod
    def forward(ctx, param: Tensor, group) -> Tensor:
        ctx.group = group
        return param.view_as(param)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def _sum_gradient_over(param: Tensor, group) -> Tensor:  # [C] -> [C]
    return _SumGradientOverGroup.apply(param, group)
