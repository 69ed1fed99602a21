"""Launch glue: the attention kernels as ``torch.library`` custom ops with fake impls and autograd.

The layout's index tensors are op arguments (not a Python object) so that torch.compile can trace the op and
the autograd formula can hand them to the backward op.
"""

from __future__ import annotations

import math

import torch
import triton
from torch import Tensor

from gtnorm._runtime import device_guard, new_output
from gtnorm.triton.backward_kernels import (
    edge_softmax_backward_by_destination_kernel,
    edge_softmax_backward_by_source_kernel,
)
from gtnorm.triton.config import attention_launch_config, column_sum_launch
from gtnorm.triton.forward_kernel import graph_attention_forward_kernel
from gtnorm.triton.partial_sum_kernel import column_sum_kernel

LOG2E = 1.4426950408889634


@torch.library.custom_op("gtnorm::graph_attention_forward", mutates_args=())
def graph_attention_forward(
    query: Tensor,  # [N_dst, H, C]
    key: Tensor,  # [N_src, H, C]
    value: Tensor,  # [N_src, H, C]
    edge_attr: Tensor | None,  # [M, H, C]
    q_norm_weight: Tensor | None,  # [C]
    k_norm_weight: Tensor | None,  # [C]
    dst_offsets: Tensor,  # [N_dst + 1] int32, by slot
    dst_by_slot: Tensor,  # [N_dst] int32
    csc_dst: Tensor,  # [M] int32 (for the backward)
    csc_src: Tensor,  # [M] int32
    csc_edge_id: Tensor,  # [M] int32
    dst_without_edges: Tensor,  # [K_dst] int64
    src_offsets: Tensor,  # [N_src + 1] int32, by slot (for the backward)
    csr_src: Tensor,  # [M] int32 (for the backward)
    csr_dst: Tensor,  # [M] int32 (for the backward)
    csr_edge_id: Tensor,  # [M] int32 (for the backward)
    src_without_edges: Tensor,  # [K_src] int64 (for the backward)
    qk_norm: bool,
    eps: float,
) -> tuple[Tensor, Tensor]:
    """Returns (out [N_dst, H, C], lse [N_dst, H] fp32 log2-sum-exp2 of the scores)."""
    num_dst, num_heads, head_dim = query.shape
    out = new_output(query.shape, query.dtype, query.device)
    lse = new_output((num_dst, num_heads), torch.float32, query.device)
    if num_dst == 0:
        return out, lse
    launch = attention_launch_config(num_heads, head_dim)
    fwd = launch.forward
    busy_slots = num_dst - dst_without_edges.numel()  # slots with edges come first
    mean_in_degree = csc_src.numel() / max(busy_slots, 1)
    num_stages = launch.forward_stages(mean_in_degree)
    # Only the pipelined form walks runs of slots (forward_kernel.py).
    nodes_per_program = fwd.nodes_per_program(mean_in_degree) if num_stages > 1 else 1
    with device_guard(query.device):
        _zero_rows((out, lse), dst_without_edges)
        if busy_slots == 0:
            return out, lse
        graph_attention_forward_kernel[(triton.cdiv(busy_slots, nodes_per_program), fwd.head_groups)](
            query, key, value,
            edge_attr if edge_attr is not None else query,
            q_norm_weight if q_norm_weight is not None else query,
            k_norm_weight if k_norm_weight is not None else query,
            dst_offsets, dst_by_slot, csc_src, csc_edge_id,
            out, lse,
            busy_slots, nodes_per_program, num_heads, head_dim, LOG2E / math.sqrt(head_dim), eps,
            HAS_EDGE_ATTR=edge_attr is not None,
            QK_NORM=qk_norm,
            HAS_Q_WEIGHT=q_norm_weight is not None,
            HAS_K_WEIGHT=k_norm_weight is not None,
            BLOCK_H=fwd.block_h, BLOCK_C=launch.block_c, NUM_STAGES=num_stages, num_warps=fwd.num_warps,
            **fwd.compile_options(),
        )  # fmt: skip
    return out, lse


@graph_attention_forward.register_fake
def _(query, key, value, edge_attr, q_norm_weight, k_norm_weight, *layout_and_flags):
    return torch.empty_like(query), query.new_empty(query.shape[:2], dtype=torch.float32)


@torch.library.custom_op("gtnorm::graph_attention_backward", mutates_args=())
def graph_attention_backward(
    grad_out: Tensor,  # [N_dst, H, C]
    query: Tensor,  # [N_dst, H, C]
    key: Tensor,  # [N_src, H, C]
    value: Tensor,  # [N_src, H, C]
    edge_attr: Tensor | None,  # [M, H, C]
    q_norm_weight: Tensor | None,  # [C]
    k_norm_weight: Tensor | None,  # [C]
    lse: Tensor,  # [N_dst, H] fp32
    dst_offsets: Tensor,  # [N_dst + 1] int32, by slot
    dst_by_slot: Tensor,  # [N_dst] int32 (for the forward)
    csc_dst: Tensor,  # [M] int32
    csc_src: Tensor,  # [M] int32
    csc_edge_id: Tensor,  # [M] int32
    dst_without_edges: Tensor,  # [K_dst] int64
    src_offsets: Tensor,  # [N_src + 1] int32, by slot
    csr_src: Tensor,  # [M] int32
    csr_dst: Tensor,  # [M] int32
    csr_edge_id: Tensor,  # [M] int32
    src_without_edges: Tensor,  # [K_src] int64
    qk_norm: bool,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Returns (dq, dk, dv, d_edge_attr, d_q_norm_weight, d_k_norm_weight); absent inputs get empty grads."""
    num_dst, num_heads, head_dim = query.shape
    num_src = key.shape[0]
    num_edges = csc_src.numel()
    device = query.device
    grad_out = grad_out.contiguous()
    grad_query = new_output(query.shape, query.dtype, device)
    grad_key = new_output(key.shape, key.dtype, device)
    grad_value = new_output(value.shape, value.dtype, device)
    has_edge_attr = edge_attr is not None
    edge_shape, edge_dtype = (edge_attr.shape, edge_attr.dtype) if has_edge_attr else ((0,), query.dtype)
    grad_edge_attr = new_output(edge_shape, edge_dtype, device)
    attn = new_output((num_edges, num_heads), torch.float32, device)
    grad_attn = new_output((num_edges, num_heads), torch.float32, device)
    delta = new_output((num_dst, num_heads), torch.float32, device)

    launch = attention_launch_config(num_heads, head_dim)
    by_dst, by_src = launch.by_destination, launch.by_source
    dst_slots = num_dst - dst_without_edges.numel()  # slots with edges come first
    src_slots = num_src - src_without_edges.numel()
    dst_per_program = by_dst.nodes_per_program(num_edges / max(dst_slots, 1))
    src_per_program = by_src.nodes_per_program(num_edges / max(src_slots, 1))
    dst_programs = triton.cdiv(dst_slots, dst_per_program)
    src_programs = triton.cdiv(src_slots, src_per_program)
    with_q_weight = qk_norm and q_norm_weight is not None
    with_k_weight = qk_norm and k_norm_weight is not None
    q_partial_rows = dst_programs * by_dst.head_groups if with_q_weight else 0
    k_partial_rows = src_programs * by_src.head_groups if with_k_weight else 0
    q_weight_partial = new_output((q_partial_rows, head_dim), torch.float32, device)
    k_weight_partial = new_output((k_partial_rows, head_dim), torch.float32, device)
    flags = dict(
        HAS_EDGE_ATTR=has_edge_attr,
        QK_NORM=qk_norm,
        HAS_Q_WEIGHT=q_norm_weight is not None,
        HAS_K_WEIGHT=k_norm_weight is not None,
        BLOCK_C=launch.block_c,
    )
    q_weight = q_norm_weight if q_norm_weight is not None else query
    k_weight = k_norm_weight if k_norm_weight is not None else query
    sm_scale = 1.0 / math.sqrt(head_dim)
    with device_guard(device):
        _zero_rows((grad_query,), dst_without_edges)
        _zero_rows((grad_key, grad_value), src_without_edges)
        if dst_programs:
            edge_softmax_backward_by_destination_kernel[(dst_programs, by_dst.head_groups)](
                query, key, value, edge_attr if has_edge_attr else query, q_weight, k_weight,
                dst_offsets, csc_dst, csc_src, csc_edge_id,
                grad_out, lse,
                grad_query, attn, grad_attn, delta, q_weight_partial,
                dst_slots, dst_per_program, num_heads, head_dim, LOG2E * sm_scale, sm_scale, eps,
                BLOCK_H=by_dst.block_h, NUM_STAGES=by_dst.num_stages, num_warps=by_dst.num_warps,
                **by_dst.compile_options(), **flags,
            )  # fmt: skip
        if src_programs:
            edge_softmax_backward_by_source_kernel[(src_programs, by_src.head_groups)](
                query, key, q_weight, k_weight,
                src_offsets, csr_src, csr_dst, csr_edge_id,
                grad_out, attn, grad_attn, delta,
                grad_key, grad_value, grad_edge_attr if has_edge_attr else query, k_weight_partial,
                src_slots, src_per_program, num_heads, head_dim, sm_scale, eps,
                BLOCK_H=by_src.block_h, NUM_STAGES=by_src.num_stages, num_warps=by_src.num_warps,
                **by_src.compile_options(), **flags,
            )  # fmt: skip
        grad_q_weight = _weight_grad(q_norm_weight, q_weight_partial, with_q_weight, device)
        grad_k_weight = _weight_grad(k_norm_weight, k_weight_partial, with_k_weight, device)
    return grad_query, grad_key, grad_value, grad_edge_attr, grad_q_weight, grad_k_weight


def _zero_rows(tensors: tuple[Tensor, ...], rows: Tensor) -> None:
    """Rows of nodes without edges: the kernels never visit them, and their output and gradients are 0."""
    if rows.numel():
        for t in tensors:
            t.index_fill_(0, rows, 0)


def _weight_grad(weight: Tensor | None, partial: Tensor, computed: bool, device) -> Tensor:
    if weight is None:
        return torch.empty(0, dtype=torch.float32, device=device)
    if not computed:  # the weight exists but qk_norm is off: it took no part
        return torch.zeros_like(weight)
    return _column_sum(partial).to(weight.dtype)


def _column_sum(rows: Tensor) -> Tensor:  # [n_rows, C] fp32 -> [C] fp32, summed in a fixed order
    launch = column_sum_launch(rows.shape[0], rows.shape[1], rows.device)
    if launch is not None:  # tall: block sums first, then torch sums the few block rows
        sums = torch.empty((launch.programs, rows.shape[1]), dtype=torch.float32, device=rows.device)
        column_sum_kernel[(launch.programs,)](
            rows, sums, rows.shape[0], rows.shape[1], launch.rows_per_program,
            BLOCK_R=launch.block_r, BLOCK_C=launch.block_c,
        )  # fmt: skip
        rows = sums
    return rows.sum(dim=0)


@graph_attention_backward.register_fake
def _(grad_out, query, key, value, edge_attr, q_norm_weight, k_norm_weight, *layout_and_flags):
    def grad_or_empty(t):
        return torch.empty_like(t) if t is not None else query.new_empty((0,), dtype=torch.float32)

    grad_edge_attr = torch.empty_like(edge_attr) if edge_attr is not None else query.new_empty((0,))
    return (
        torch.empty_like(query),
        torch.empty_like(key),
        torch.empty_like(value),
        grad_edge_attr,
        grad_or_empty(q_norm_weight),
        grad_or_empty(k_norm_weight),
    )


_LAYOUT_ARGS = 11  # GraphLayout.tensors()


def _setup_context(ctx, inputs, output):
    (query, key, value, edge_attr, q_norm_weight, k_norm_weight, *layout, qk_norm, eps) = inputs
    ctx.save_for_backward(query, key, value, edge_attr, q_norm_weight, k_norm_weight, output[1], *layout)
    ctx.qk_norm = qk_norm
    ctx.eps = eps
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, grad_out, _grad_lse):
    query, key, value, edge_attr, q_norm_weight, k_norm_weight, lse, *layout = ctx.saved_tensors
    grads = torch.ops.gtnorm.graph_attention_backward(
        grad_out, query, key, value, edge_attr, q_norm_weight, k_norm_weight, lse, *layout, ctx.qk_norm, ctx.eps
    )
    grad_query, grad_key, grad_value, grad_edge_attr, grad_q_weight, grad_k_weight = grads
    return (
        grad_query,
        grad_key,
        grad_value,
        grad_edge_attr if edge_attr is not None else None,
        grad_q_weight if q_norm_weight is not None else None,
        grad_k_weight if k_norm_weight is not None else None,
        *([None] * _LAYOUT_ARGS),
        None,
        None,
    )


graph_attention_forward.register_autograd(_backward, setup_context=_setup_context)
