"""Launch glue of the fused edge projection's kernels besides the edge walks (node-block products, the weights'
gradient, d edge_features): :class:`EdgeProjection`, for one weight and bias under one plan (ProjectionLaunch)."""

from __future__ import annotations

import torch
from torch import Tensor

from gtnorm._runtime import new_output, sm_count
from gtnorm.triton.config import ProjectionLaunch, cdiv, dot_width, next_power_of_2
from gtnorm.triton.edge_features_grad_kernel import edge_features_grad_kernel
from gtnorm.triton.edge_weight_grad_kernel import edge_weight_grad_kernel
from gtnorm.triton.launcher import Launcher
from gtnorm.triton.node_projection_kernels import add_expanded_rows_kernel, project_rows_kernel

launch_project_rows = Launcher(project_rows_kernel)
launch_add_expanded_rows = Launcher(add_expanded_rows_kernel)
launch_edge_weight_grad = Launcher(edge_weight_grad_kernel)
launch_edge_features_grad = Launcher(edge_features_grad_kernel)


def or_fallback(fallback: Tensor, *tensors: Tensor | None) -> list[Tensor]:
    """The kernels take a pointer for every optional tensor: absent ones (never read) become ``fallback``."""
    return [t if t is not None else fallback for t in tensors]


class EdgeProjection:
    """Launches of the fused edge projection's kernels besides the edge walks, for one weight and bias."""

    def __init__(
        self,
        weight: Tensor,  # [D, H * C], any strides (fastest with contiguous columns: attention.py copies to those)
        bias: Tensor | None,  # [H * C]
        plan: ProjectionLaunch,
    ):
        self.weight, self.bias, self.plan = weight, bias, plan
        self.edge_dim = weight.shape[0]
        extended = self.edge_dim + (bias is not None)
        self.block_d = dot_width(extended)
        self.flags = dict(D=self.edge_dim, HAS_EDGE_BIAS=bias is not None)

    def _channel_tile(self, head_dim: int) -> dict:
        block_c = self.plan.channels(head_dim)
        return dict(BLOCK_C=block_c, CHUNKED=block_c < head_dim)

    def _weight_args(self, fallback: Tensor) -> list:
        return [self.weight, self.bias if self.bias is not None else fallback, *self.weight.stride()]

    def programs(self, num_nodes: int) -> int:
        """Programs of add_expanded."""
        return cdiv(num_nodes, self.plan.expand_block)

    def partial_rows(self, num_nodes: int, num_heads: int, head_dim: int) -> int:
        """Rows of parameter-gradient partials add_expanded writes: one per program, or one per program and head where
        heads are walked in channel tiles (node_projection_kernels.py)."""
        chunked = self.plan.channels(head_dim) < head_dim
        return self.programs(num_nodes) * (num_heads if chunked else 1)

    def project(
        self,
        rows: Tensor,  # [N, H, C]
        norm_weight: Tensor | None,  # [C]
        norm_bias: Tensor | None,  # [C]
        norm: int,  # NORM_CODES
        eps: float,
        out: Tensor,  # [N, H, D + bias] fp32
    ) -> None:
        """out = norm(rows) projected onto W (and b) per head."""
        num_nodes, num_heads, head_dim = rows.shape
        if num_nodes == 0:
            return
        launch_project_rows[(cdiv(num_nodes, self.plan.project_block),)](
            rows, *or_fallback(rows, norm_weight, norm_bias), *self._weight_args(rows), out,
            num_nodes, num_heads, head_dim, eps,
            NORM=norm, HAS_NORM_WEIGHT=norm_weight is not None, HAS_NORM_BIAS=norm_bias is not None,
            BLOCK_N=self.plan.project_block, BLOCK_D=self.block_d, **self._channel_tile(head_dim),
            num_warps=self.plan.node_warps, **self.flags,
        )  # fmt: skip

    def add_expanded(
        self,
        sums: Tensor,  # [N, H, D + bias] fp32, rows sums.stride(0) apart
        target: Tensor,  # [N, H, C], updated in place
        query: Tensor | None = None,  # [N, H, C]: with a norm, sums W is a term of dq' (add_expanded_rows_kernel)
        q_weight: Tensor | None = None,  # [C]
        q_bias: Tensor | None = None,  # [C]
        norm: int = 0,  # NORM_CODES
        eps_q: float = 0.0,
        partial: Tensor | None = None,  # [rows, width] fp32: the query norm's parameter-gradient partial rows
        first_partial_row: int = 0,
    ) -> None:
        num_nodes, num_heads, head_dim = target.shape
        if num_nodes == 0:
            return
        launch_add_expanded_rows[(self.programs(num_nodes),)](
            sums, sums.stride(0), *self._weight_args(sums), target, *or_fallback(target, query, q_weight),
            *or_fallback(sums, partial), partial.shape[1] if partial is not None else 0, first_partial_row,
            num_nodes, num_heads, head_dim, eps_q,
            NORM=norm, HAS_Q_WEIGHT=q_weight is not None, HAS_Q_BIAS=q_bias is not None,
            BLOCK_N=self.plan.expand_block, BLOCK_D=self.block_d, **self._channel_tile(head_dim),
            num_warps=self.plan.node_warps, **self.flags,
        )  # fmt: skip

    def weight_grads(
        self,
        feature_sums: Tensor,  # [N_dst, 2, H, D + bias] fp32: P, S from the by-destination pass
        query: Tensor,  # [N_dst, H, C]
        grad_out: Tensor,  # [N_dst, H, C]
        q_norm_weight: Tensor | None,  # [C]
        q_norm_bias: Tensor | None,  # [C]
        norm: int,  # NORM_CODES
        query_stats: Tensor | None,  # [N_dst, 2 * H] fp32: the query norm's mean and rstd (by-destination pass)
    ) -> tuple[Tensor, Tensor | None]:  # d edge_weight [D, H * C], d edge_bias [H * C]
        """dW and db from the per-destination sums (edge_weight_grad_kernel.py)."""
        num_dst, num_heads, head_dim = query.shape
        extended_dim = feature_sums.shape[3]
        block_n = self.plan.grad_block
        tile = self._channel_tile(head_dim)
        chunks = cdiv(head_dim, tile["BLOCK_C"])
        per_head = self.plan.grad_programs_per_sm * sm_count(query.device) // (num_heads * chunks)
        programs = max(1, min(cdiv(num_dst, block_n), per_head))
        nodes_per_program = cdiv(cdiv(max(num_dst, 1), programs), block_n) * block_n
        programs = cdiv(max(num_dst, 1), nodes_per_program)
        partial = new_output((programs, extended_dim, num_heads * head_dim), torch.float32, query.device)
        launch_edge_weight_grad[(programs, num_heads, chunks)](
            feature_sums, query, *or_fallback(feature_sums, query_stats), grad_out,
            *or_fallback(query, q_norm_weight, q_norm_bias), partial, num_dst, nodes_per_program, num_heads, head_dim,
            D1=extended_dim, NORM=norm, HAS_Q_WEIGHT=q_norm_weight is not None, HAS_Q_BIAS=q_norm_bias is not None,
            BLOCK_N=block_n, BLOCK_D=self.block_d, **tile,
        )  # fmt: skip
        sums = partial.sum(dim=0)  # [D + bias, H * C], over the programs in a fixed order
        grad_weight = sums[: self.edge_dim].to(self.weight.dtype, copy=True)
        grad_bias = sums[self.edge_dim].to(self.bias.dtype, copy=True) if self.bias is not None else None
        return grad_weight, grad_bias

    def edge_features_grad(
        self,
        edge_features: Tensor,  # [M, D]
        csc_dst: Tensor,  # [M] int32
        csc_edge_id: Tensor,  # [M] int32
        attn: Tensor,  # [M, H] fp32
        grad_attn: Tensor,  # [M, H] fp32
        delta: Tensor,  # [N_dst, H] fp32
        query_proj: Tensor,  # [N_dst, H, D + bias] fp32
        grad_out_proj: Tensor,  # [N_dst, H, D + bias] fp32
        sm_scale: float,
    ) -> Tensor:  # [M, D] in edge_features' dtype
        num_edges, edge_dim = edge_features.shape
        grad = new_output(edge_features.shape, edge_features.dtype, edge_features.device)
        if num_edges:
            launch_edge_features_grad[(cdiv(num_edges, self.plan.edge_block),)](
                csc_dst, csc_edge_id, attn, grad_attn, delta, query_proj, grad_out_proj, grad,
                num_edges, attn.shape[1], sm_scale,
                D=edge_dim, D1=query_proj.shape[2], BLOCK_E=self.plan.edge_block,
                BLOCK_D=next_power_of_2(edge_dim), num_warps=self.plan.edge_warps,
            )  # fmt: skip
        return grad
