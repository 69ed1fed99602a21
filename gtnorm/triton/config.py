"""Launch settings of the attention kernels, chosen from the tensor sizes alone.

Nothing here benchmarks: a new graph never triggers a tuning run and only a few kernel variants get
compiled. The numbers come from sweeps on an H200 (benchmarks/NOTES.md, "launch settings"): the kernels are
bound by the latency of dependent gathers (edge index, then the rows it points to), so what pays is many
small, register-light programs resident per SM, each walking its edges one at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

from gtnorm._runtime import interpreter_active

# Row slice (heads x padded channels) of one program: the forward keeps all heads of a node together up to
# 1024 elements; the backward kernels hold more state per element (q, dO, two accumulators, the prefetched
# next edge) and run best as one-warp programs over 512-element slices.
_FORWARD_ROW_SLICE = 1024
_BACKWARD_ROW_SLICE = 512
# Nodes per backward program: the weight-gradient partials stay small (one fp32 row of C per program).
_BACKWARD_NODES_PER_PROGRAM = 8


@dataclass(frozen=True)
class KernelLaunch:
    block_h: int  # heads per program (a power of two)
    head_groups: int  # programs along the head axis
    block_e: int  # edges gathered per step
    num_warps: int


@dataclass(frozen=True)
class AttentionLaunchConfig:
    block_c: int  # channels, padded to a power of two
    forward: KernelLaunch
    by_destination: KernelLaunch
    by_source: KernelLaunch
    nodes_per_program: int  # backward programs walk this many consecutive nodes


def _launch(num_heads: int, block_c: int, row_slice: int, num_warps: int) -> KernelLaunch:
    block_h = min(triton.next_power_of_2(num_heads), max(1, row_slice // block_c))
    # The interpreter pays per executed operation, not per byte: there, fewer and wider steps are faster.
    block_e = 4 if interpreter_active() else 1
    return KernelLaunch(block_h, triton.cdiv(num_heads, block_h), block_e=block_e, num_warps=num_warps)


def attention_launch_config(num_heads: int, head_dim: int) -> AttentionLaunchConfig:
    block_c = triton.next_power_of_2(head_dim)
    backward = _launch(num_heads, block_c, _BACKWARD_ROW_SLICE, num_warps=1)
    return AttentionLaunchConfig(
        block_c=block_c,
        forward=_launch(num_heads, block_c, _FORWARD_ROW_SLICE, num_warps=4),
        by_destination=backward,
        by_source=backward,
        nodes_per_program=_BACKWARD_NODES_PER_PROGRAM,
    )
