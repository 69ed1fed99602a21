"""Gradient of the fused edge projection's raw attributes x (edge_projection.py):

    d x_ij[d] = sum_h <de_ij,h, W_d,h> = sum_h a_ij,h <dO_i,h, W_d,h> + dS_ij,h <q'_i,h, W_d,h> / sqrt(C),
    dS_ij = a_ij (da_ij - D_i),

from what the by-destination pass left per edge (a, da: [M, H]) and per destination (D: [N_dst, H]) and the
destination's projections onto W ([N_dst, H, D + 1], node_projection_kernels.py). dS needs D_i, known only after a
destination's last edge, so this is a pass of its own: it walks the edges in by-destination order, where a
destination's projections are re-read from cache by its edges, and sums the heads in a fixed order (no partials,
no atomics). Per edge it moves the 2 x H fp32 of a and da and writes D numbers.
"""

import triton
import triton.language as tl


@triton.jit
def edge_features_grad_kernel(
    csc_dst_ptr,  # [M] int32, by-destination walk
    csc_edge_id_ptr,  # [M] int32
    attn_ptr,  # [M, H] fp32: a, by the caller's edge id
    grad_attn_ptr,  # [M, H] fp32: da, by the caller's edge id
    delta_ptr,  # [N_dst, H] fp32: D
    query_proj_ptr,  # [N_dst, H, D1] fp32: <q', W_d>
    grad_out_proj_ptr,  # [N_dst, H, D1] fp32: <dO, W_d>
    grad_features_ptr,  # [M, D] out, the caller's edge order
    num_edges,
    H,
    sm_scale,  # 1 / sqrt(C)
    D: tl.constexpr,
    D1: tl.constexpr,  # D, plus 1 where the projection has a bias (the projections' row width)
    BLOCK_E: tl.constexpr,
    BLOCK_D: tl.constexpr,  # D padded to a power of two
):
    pos = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    edge_mask = pos < num_edges
    dst = tl.load(csc_dst_ptr + pos, mask=edge_mask, other=0).to(tl.int64)
    edge_id = tl.load(csc_edge_id_ptr + pos, mask=edge_mask, other=0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    proj_mask = edge_mask[:, None] & (offs_d[None, :] < D)
    grad_x = tl.zeros([BLOCK_E, BLOCK_D], tl.float32)
    for head in range(H):
        a = tl.load(attn_ptr + edge_id * H + head, mask=edge_mask, other=0.0)  # [BLOCK_E]
        da = tl.load(grad_attn_ptr + edge_id * H + head, mask=edge_mask, other=0.0)
        delta = tl.load(delta_ptr + dst * H + head, mask=edge_mask, other=0.0)
        proj_offsets = dst[:, None] * (H * D1) + head * D1 + offs_d[None, :]
        q_proj = tl.load(query_proj_ptr + proj_offsets, mask=proj_mask, other=0.0)  # [BLOCK_E, BLOCK_D]
        d_out_proj = tl.load(grad_out_proj_ptr + proj_offsets, mask=proj_mask, other=0.0)
        grad_x += a[:, None] * d_out_proj + (a * (da - delta) * sm_scale)[:, None] * q_proj
    out_ptr = grad_features_ptr + edge_id[:, None] * D + offs_d[None, :]
    tl.store(out_ptr, grad_x.to(grad_features_ptr.dtype.element_ty), mask=proj_mask)
