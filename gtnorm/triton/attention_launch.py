"""The walk's launches: :func:`attention_forward` and :func:`attention_backward` leave the input checks to their callers
(attention.py), find the layout, pick the plan (config.py) and launch the forward, the two backward passes and the
fused edge projection's kernels on it; the norms' parameter gradients come from fp32 partial rows summed in a fixed
order (:func:`column_sum`). ops.py makes them custom ops with autograd."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gtnorm._runtime import device_guard, new_output
from gtnorm.triton.backward_kernels import (
    edge_softmax_backward_by_destination_kernel,
    edge_softmax_backward_by_source_kernel,
)
from gtnorm.triton.config import (
    AttentionLaunchConfig,
    ColumnSumLaunch,
    cdiv,
    column_sum_launch,
    launch_config_for,
    next_power_of_2,
)
from gtnorm.triton.edge_projection_launch import EdgeProjection
from gtnorm.triton.edge_projection_launch import or_fallback as _or
from gtnorm.triton.forward_kernel import graph_attention_forward_kernel
from gtnorm.triton.launcher import Launcher
from gtnorm.triton.layout_cache import layout_of_edge_index
from gtnorm.triton.partial_sum_kernel import column_sum_kernel

LOG2E = 1.4426950408889634
# The ops' ``qk_norm`` names -> the kernels' NORM constexpr (tiles.NORM_NONE / NORM_RMS / NORM_LAYER).
NORM_CODES = {"none": 0, "rms": 1, "layer": 2}
# Every kernel launches through a Launcher: on small graphs Triton's own per-call argument binding takes longer
# than the kernels (launcher.py).
launch_forward_walk = Launcher(graph_attention_forward_kernel)
launch_by_destination_walk = Launcher(edge_softmax_backward_by_destination_kernel)
launch_by_source_walk = Launcher(edge_softmax_backward_by_source_kernel)
launch_column_sum = Launcher(column_sum_kernel)


def attention_forward(
    query: Tensor,  # [N_dst, H, C]
    key: Tensor,  # [N_src, H, C]
    value: Tensor,  # [N_src, H, C]
    edge_attr: Tensor | None,  # [M, H, C]
    edge_features: Tensor | None,  # [M, D]: e = edge_features @ edge_weight + edge_bias, never formed
    edge_weight: Tensor | None,  # [D, H * C], any strides
    edge_bias: Tensor | None,  # [H * C]
    q_norm_weight: Tensor | None,  # [C]
    q_norm_bias: Tensor | None,  # [C]
    k_norm_weight: Tensor | None,  # [C]
    k_norm_bias: Tensor | None,  # [C]
    graph: list[Tensor],  # GraphLayout.tensors(), or [edge_index [2, M]]: its layout from the shared cache
    qk_norm: str,  # "none", "rms" or "layer"
    eps_q: float,
    eps_k: float,
    launch: AttentionLaunchConfig | None = None,  # None: the default plan (_default_plan)
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Returns (out [N_dst, H, C] in query's dtype, lse [N_dst, H] fp32 log2-sum-exp2 of the scores, query_proj),
    query_proj being the normalised query projected onto the edge weights, [N_dst, H, D + bias] fp32, with a fused
    edge projection (what the backward needs besides lse), else None (the custom op returns an empty tensor)."""
    num_dst, num_heads, head_dim = query.shape
    device = query.device
    out = new_output(query.shape, query.dtype, device)
    lse = new_output((num_dst, num_heads), torch.float32, device)
    edge_proj = edge_features is not None
    proj_shape = (num_dst, num_heads, extended_dim_of(edge_features, edge_bias)) if edge_proj else None
    query_proj = new_output(proj_shape, torch.float32, device) if edge_proj else None
    if num_dst == 0:
        return out, lse, query_proj
    dst_offsets, dst_by_slot, _, csc_src, csc_edge_id, dst_without_edges, *_ = layout_tensors(
        graph, key.shape[0], num_dst
    )
    launch = launch or _default_plan(num_heads, head_dim, edge_features, edge_bias, device)
    fwd = launch.forward
    busy_slots = num_dst - dst_without_edges.numel()  # slots with edges come first
    mean_in_degree = csc_src.numel() / max(busy_slots, 1)
    num_stages = launch.forward_stages(mean_in_degree)
    # Only the pipelined form walks runs of slots (forward_kernel.py).
    nodes_per_program = fwd.nodes_per_program(mean_in_degree) if num_stages > 1 else 1
    with device_guard(device):
        # sum_j a_ij x_ij per destination, expanded through W into out afterwards (node_projection_kernels.py).
        feature_means = new_output(proj_shape, torch.float32, device) if edge_proj else None
        _zero_rows((out, lse, feature_means) if edge_proj else (out, lse), dst_without_edges)
        if busy_slots == 0:
            return out, lse, query_proj
        projection = EdgeProjection(edge_weight, edge_bias, launch.projection) if edge_proj else None
        if edge_proj:
            projection.project(query, q_norm_weight, q_norm_bias, NORM_CODES[qk_norm], eps_q, query_proj)
        launch_forward_walk[(cdiv(busy_slots, nodes_per_program), fwd.head_groups)](
            query, key, value,
            edge_attr if edge_attr is not None else query,
            edge_features if edge_proj else query, *_or(lse, query_proj, feature_means),
            *_or(query, q_norm_weight, q_norm_bias, k_norm_weight, k_norm_bias),
            dst_offsets, dst_by_slot, csc_src, csc_edge_id,
            out, lse,
            busy_slots, nodes_per_program, num_heads, head_dim, LOG2E / math.sqrt(head_dim), eps_q, eps_k,
            HAS_EDGE_ATTR=edge_attr is not None,
            **_edge_projection_flags(edge_features, edge_bias),
            **_norm_flags(qk_norm, q_norm_weight, q_norm_bias, k_norm_weight),
            BLOCK_H=fwd.block_h, BLOCK_C=launch.block_c, NUM_STAGES=num_stages, num_warps=fwd.num_warps,
            **fwd.compile_options(),
        )  # fmt: skip
        if edge_proj:
            projection.add_expanded(feature_means, out)
    return out, lse, query_proj


def attention_backward(
    grad_out: Tensor,  # [N_dst, H, C]
    query: Tensor,  # [N_dst, H, C]
    key: Tensor,  # [N_src, H, C]
    value: Tensor,  # [N_src, H, C]
    edge_attr: Tensor | None,  # [M, H, C]
    edge_features: Tensor | None,  # [M, D]
    edge_weight: Tensor | None,  # [D, H * C], any strides
    edge_bias: Tensor | None,  # [H * C]
    q_norm_weight: Tensor | None,  # [C]
    q_norm_bias: Tensor | None,  # [C]
    k_norm_weight: Tensor | None,  # [C]
    k_norm_bias: Tensor | None,  # [C]
    lse: Tensor,  # [N_dst, H] fp32
    query_proj: Tensor | None,  # [N_dst, H, D + bias] fp32 from the forward (None or empty without edge_features)
    graph: list[Tensor],  # GraphLayout.tensors(), or [edge_index [2, M]]: its layout from the shared cache
    qk_norm: str,  # "none", "rms" or "layer"
    eps_q: float,
    eps_k: float,
    edge_features_grad: bool,  # whether to compute d edge_features
    launch: AttentionLaunchConfig | None = None,  # None: the default plan (_default_plan)
) -> tuple[Tensor | None, ...]:
    """Returns (dq, dk, dv, d_edge_attr, d_edge_features, d_edge_weight, d_edge_bias, d_q_norm_weight,
    d_q_norm_bias, d_k_norm_weight, d_k_norm_bias), each in its input's dtype (contiguous); None for absent inputs
    (and for edge_features without edge_features_grad). The custom op returns empty fp32 tensors there instead
    (an op's outputs are tensors); the eager path makes none: every allocation costs host time per call."""
    num_dst, num_heads, head_dim = query.shape
    num_src = key.shape[0]
    device = query.device
    grad_out = grad_out.contiguous()
    grad_query = new_output(query.shape, query.dtype, device)
    grad_key = new_output(key.shape, key.dtype, device)
    grad_value = new_output(value.shape, value.dtype, device)
    has_edge_attr = edge_attr is not None
    grad_edge_attr = new_output(edge_attr.shape, edge_attr.dtype, device) if has_edge_attr else None
    edge_proj = edge_features is not None
    edge_features_grad = edge_proj and edge_features_grad
    (
        dst_offsets, _, csc_dst, csc_src, csc_edge_id, dst_without_edges,
        src_offsets, csr_src, csr_dst, csr_edge_id, src_without_edges,
    ) = layout_tensors(graph, num_src, num_dst)  # fmt: skip
    num_edges = csc_src.numel()
    launch = launch or _default_plan(num_heads, head_dim, edge_features, edge_bias, device)
    by_dst, by_src = launch.by_destination, launch.by_source
    dst_slots = num_dst - dst_without_edges.numel()  # slots with edges come first
    src_slots = num_src - src_without_edges.numel()
    dst_per_program = by_dst.nodes_per_program(num_edges / max(dst_slots, 1))
    src_per_program = by_src.nodes_per_program(num_edges / max(src_slots, 1))
    dst_programs = cdiv(dst_slots, dst_per_program)
    src_programs = cdiv(src_slots, src_per_program)
    # One fp32 row per program: the weight's C columns, then the bias's, summed in a fixed order afterwards.
    normed = qk_norm != "none"
    q_params = [p for p in (q_norm_weight, q_norm_bias) if p is not None] if normed else []
    k_params = [k_norm_weight] if normed and k_norm_weight is not None else []  # no key bias: _norm_flags
    q_partial_width, k_partial_width = len(q_params) * head_dim, len(k_params) * head_dim
    projection = EdgeProjection(edge_weight, edge_bias, launch.projection) if edge_proj else None
    # With the edge projection, e's term of dq' passes the query norm's backward for blocks of nodes, whose
    # programs add their own partial rows after the by-destination pass's.
    q_partial_rows = dst_programs * by_dst.head_groups
    q_partial_rows += projection.partial_rows(num_dst, num_heads, head_dim) if edge_proj and normed else 0
    k_partial_rows = src_programs * by_src.head_groups
    # attn [M, H], dS [M, H], delta [N_dst, H], the query norm's statistics [N_dst, 2, H] (backward_kernels.py),
    # the partial rows [rows, width].
    scratch = [num_edges * num_heads, num_edges * num_heads, num_dst * num_heads]
    scratch += [num_dst * 2 * num_heads if normed else 0]
    scratch += [q_partial_rows * q_partial_width, k_partial_rows * k_partial_width]
    # With the edge projection, per destination: P = sum a x and S = sum dS x / sqrt(C) over its edges
    # (backward_kernels.py), and dO projected onto the edge weights. Scratch that a call does not use is not
    # allocated: the kernels get another fp32 tensor's pointer there, never read (_or).
    if edge_proj:
        extended_dim = extended_dim_of(edge_features, edge_bias)
        scratch += [num_dst * 2 * num_heads * extended_dim, num_dst * num_heads * extended_dim]
    attn, grad_attn, delta, query_stats, q_partial, k_partial, *projection_scratch = _fp32_scratch(device, scratch)
    query_stats = query_stats if normed else None
    q_partial = _shaped(q_partial, q_partial_rows, q_partial_width)
    k_partial = _shaped(k_partial, k_partial_rows, k_partial_width)
    feature_sums = grad_out_proj = None
    if edge_proj:  # shaped where they are indexed
        attn, grad_attn = _shaped(attn, num_edges, num_heads), _shaped(grad_attn, num_edges, num_heads)
        feature_sums = _shaped(projection_scratch[0], num_dst, 2, num_heads, extended_dim)
        grad_out_proj = _shaped(projection_scratch[1], num_dst, num_heads, extended_dim)
    flags = dict(
        HAS_EDGE_ATTR=has_edge_attr,
        **_norm_flags(qk_norm, q_norm_weight, q_norm_bias, k_norm_weight),
        BLOCK_C=launch.block_c,
    )
    edge_projection_flags = _edge_projection_flags(edge_features, edge_bias)
    q_weight, q_bias, k_weight, k_bias = _or(query, q_norm_weight, q_norm_bias, k_norm_weight, k_norm_bias)
    sm_scale = 1.0 / math.sqrt(head_dim)
    with device_guard(device):
        _zero_rows((grad_query,), dst_without_edges)
        _zero_rows((grad_key, grad_value), src_without_edges)
        if edge_proj:  # the edge weights' gradient sums over every destination
            _zero_rows((feature_sums,), dst_without_edges)
            if normed:  # and so reads the query's statistics of every destination
                query_stats = _shaped(query_stats, num_dst, 2 * num_heads)
                _zero_rows((query_stats,), dst_without_edges)
            projection.project(grad_out, None, None, NORM_CODES["none"], 0.0, grad_out_proj)
        if dst_programs:
            launch_by_destination_walk[(dst_programs, by_dst.head_groups)](
                query, key, value, edge_attr if has_edge_attr else query,
                edge_features if edge_proj else query, *_or(attn, query_proj if edge_proj else None, grad_out_proj),
                q_weight, q_bias, k_weight, k_bias,
                dst_offsets, csc_dst, csc_src, csc_edge_id,
                grad_out, lse,
                grad_query, attn, grad_attn, delta, *_or(attn, query_stats, feature_sums),
                q_partial, q_partial_width,
                dst_slots, dst_per_program, num_heads, head_dim, LOG2E * sm_scale, sm_scale, eps_q, eps_k,
                **edge_projection_flags,
                BLOCK_H=by_dst.block_h, NUM_STAGES=by_dst.num_stages, num_warps=by_dst.num_warps,
                **by_dst.compile_options(), **flags,
            )  # fmt: skip
        if edge_proj:  # e's term of dq': S W through the query norm's backward
            projection.add_expanded(
                feature_sums[:, 1], grad_query, query, q_norm_weight, q_norm_bias, NORM_CODES[qk_norm], eps_q,
                q_partial, first_partial_row=dst_programs * by_dst.head_groups,
            )  # fmt: skip
        if src_programs:
            launch_by_source_walk[(src_programs, by_src.head_groups)](
                query, key, q_weight, q_bias, k_weight,
                src_offsets, csr_src, csr_dst, csr_edge_id,
                grad_out, attn, grad_attn, delta, *_or(attn, query_stats),
                grad_key, grad_value, grad_edge_attr if has_edge_attr else query,
                k_partial, k_partial_width,
                src_slots, src_per_program, num_heads, head_dim, sm_scale, eps_k,
                BLOCK_H=by_src.block_h, NUM_STAGES=by_src.num_stages, num_warps=by_src.num_warps,
                **by_src.compile_options(), **flags,
            )  # fmt: skip
        grad_q_weight, grad_q_bias = _param_grads(q_norm_weight, q_norm_bias, q_partial, normed, device)
        grad_k_weight, _ = _param_grads(k_norm_weight, None, k_partial, normed, device)
        _, grad_k_bias = _param_grads(None, k_norm_bias, k_partial, False, device)  # exactly 0 (_norm_flags)
        grad_edge_features = None
        if edge_features_grad:
            grad_edge_features = projection.edge_features_grad(
                edge_features, csc_dst, csc_edge_id, attn, grad_attn, delta, query_proj, grad_out_proj, sm_scale
            )
        grad_edge_weight = grad_edge_bias = None
        if edge_proj:
            grad_edge_weight, grad_edge_bias = projection.weight_grads(
                feature_sums, query, grad_out, q_norm_weight, q_norm_bias, NORM_CODES[qk_norm],
                query_stats,
            )
    return (
        grad_query, grad_key, grad_value, grad_edge_attr, grad_edge_features, grad_edge_weight, grad_edge_bias,
        grad_q_weight, grad_q_bias, grad_k_weight, grad_k_bias,
    )  # fmt: skip


_LAYOUT_ARGS = 11  # GraphLayout.tensors()


def layout_tensors(graph: list[Tensor], num_src: int, num_dst: int) -> tuple[Tensor, ...]:
    """The layout's index tensors (GraphLayout.tensors()): ``graph`` itself, or the shared cache's layout of the
    edge_index it holds. The second is what torch.compile's graphs pass (layout_cache.LayoutOfEdgeIndex): the
    lookup runs when the op runs, so a compiled graph holds no layout of its own and a new graph of the same shape
    needs no recompile."""
    if len(graph) == 1:
        return layout_of_edge_index(graph[0], num_src, num_dst).tensors()
    if len(graph) != _LAYOUT_ARGS:
        raise ValueError(f"graph must hold the layout's {_LAYOUT_ARGS} index tensors or [edge_index], got {len(graph)}")
    return tuple(graph)


def _default_plan(num_heads: int, head_dim: int, edge_features, edge_bias, device) -> AttentionLaunchConfig:
    extended_dim = extended_dim_of(edge_features, edge_bias) if edge_features is not None else 0
    plan = launch_config_for(num_heads, head_dim, extended_dim, device)
    if plan is None:  # graph_transformer_attention materialises the edge features instead (edge_projection_fits)
        raise ValueError(
            f"the fused edge projection's tiles do not fit this device for {num_heads} x {head_dim} and "
            f"{extended_dim} weight rows: pass edge_attr (edge_features @ edge_weight + edge_bias) instead"
        )
    return plan


def _edge_projection_flags(edge_features: Tensor | None, edge_bias: Tensor | None) -> dict:
    edge_proj = edge_features is not None
    return dict(
        EDGE_PROJ=edge_proj,
        EDGE_DIM=edge_features.shape[1] if edge_proj else 0,
        HAS_EDGE_BIAS=edge_bias is not None,
        BLOCK_D=next_power_of_2(extended_dim_of(edge_features, edge_bias)) if edge_proj else 1,
    )


def extended_dim_of(edge_features: Tensor, edge_bias: Tensor | None) -> int:
    """D + 1 with a bias (its extra row of W, edge_projection.py), else D."""
    return edge_features.shape[1] + int(edge_bias is not None)  # int: a SymInt plus a bool fails under tracing


def _norm_flags(qk_norm: str, q_weight, q_bias, k_weight) -> dict:
    if qk_norm not in NORM_CODES:
        raise ValueError(f"qk_norm must be one of {tuple(NORM_CODES)}, got {qk_norm!r}")
    # The key norm's bias b adds <q'_i, b> to every score of destination i alike: the softmax cancels it, so the
    # output does not depend on it and its gradient is exactly 0. The kernels leave it out (it cost 5-10 % on
    # the decoder and processor and C fp32 columns per by-source program, benchmarks/NOTES.md v7).
    return dict(
        NORM=NORM_CODES[qk_norm],
        HAS_Q_WEIGHT=q_weight is not None,
        HAS_Q_BIAS=q_bias is not None,
        HAS_K_WEIGHT=k_weight is not None,
        HAS_K_BIAS=False,
    )


# Pieces of one scratch allocation start 512 bytes apart, as separate allocations would (the kernels' loads are
# specialised for 16-byte aligned pointers, and rows stay as coalesced as they would be).
_SCRATCH_ALIGN = 128


def _fp32_scratch(device: torch.device, sizes: list[int]) -> list[Tensor]:
    """Flat fp32 scratch tensors of these sizes, pieces of one allocation cut by one split: on the small graphs'
    path every allocation costs ~10 us of host time per call (benchmarks/NOTES.md, v14), and a view op a few (a
    shaped view per piece cost 30 of a 330 us eager forward+backward on the CPU harness, v22). The pieces are flat
    and padded (_SCRATCH_ALIGN): the kernels read them through their pointers; the caller shapes the few it
    indexes (_shaped)."""
    padded = [cdiv(size, _SCRATCH_ALIGN) * _SCRATCH_ALIGN for size in sizes]
    return list(new_output((sum(padded),), torch.float32, device).split_with_sizes(padded))


def _shaped(piece: Tensor, *shape: int) -> Tensor:
    """The first elements of a scratch piece as a contiguous tensor of this shape."""
    if len(shape) == 2:  # the partial rows of every call: the strides without a loop
        return piece.as_strided(shape, (shape[1], 1))
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return piece.as_strided(shape, strides[::-1])


def _zero_rows(tensors: tuple[Tensor, ...], rows: Tensor) -> None:
    """Rows of nodes without edges: the kernels never visit them, and their output and gradients are 0."""
    if rows.numel():
        for t in tensors:
            t.index_fill_(0, rows, 0)


def _param_grads(weight: Tensor | None, bias: Tensor | None, partial: Tensor, computed: bool, device):
    """(d weight, d bias) from the [weight | bias] partial rows [rows, width]: one column sum for both, cast once,
    handed out as two views of it (a copy each cost ~15 us of host time, v22; the custom op copies them, as its
    outputs may not alias: _attention_backward_op); None for an absent one."""
    if weight is None and bias is None:
        return None, None
    if not computed or not partial.shape[1]:  # the parameters exist but took no part (qk_norm off, or the key bias)
        return tuple(torch.zeros_like(p) if p is not None else None for p in (weight, bias))
    sums = column_sum(partial, column_sum_launch(partial.shape[0], partial.shape[1], device))
    if weight is None or bias is None:
        return (_cast(sums, weight), None) if bias is None else (None, _cast(sums, bias))
    sums = _cast(sums, weight)
    channels = weight.shape[0]
    return sums[:channels], _cast(sums[channels:], bias)


def _cast(grad: Tensor, param: Tensor) -> Tensor:
    # A no-op .to() still costs a few us of host time.
    return grad if grad.dtype == param.dtype else grad.to(param.dtype)


def column_sum(
    rows: Tensor,  # [n_rows, C] fp32
    launch: ColumnSumLaunch | None,  # config.column_sum_launch's plan; None: torch's sum alone
) -> Tensor:  # [C] fp32, summed in a fixed order
    if launch is not None:  # tall: block sums first, then torch sums the few block rows
        sums = torch.empty((launch.programs, rows.shape[1]), dtype=torch.float32, device=rows.device)
        launch_column_sum[(launch.programs,)](
            rows, sums, rows.shape[0], rows.shape[1], launch.rows_per_program,
            BLOCK_R=launch.block_r, BLOCK_C=launch.block_c,
        )  # fmt: skip
        rows = sums
    return rows.sum(dim=0)
