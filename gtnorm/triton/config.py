"""Launch settings of the attention kernels, chosen from the tensor sizes and the graph's degrees.

Nothing here benchmarks: settings depend on (H, C) and the mean degree only, so a new graph never triggers
a tuning run and at most a few kernel variants get compiled.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

# Elements of one [BLOCK_E, BLOCK_H, BLOCK_C] fp32 tile the kernels keep in registers (several live at once).
_MAX_EDGE_TILE = 4096
# Rows of H*C elements handled per backward program: enough to keep the weight-gradient partials small
# (one fp32 row of C per program) while leaving thousands of programs to balance the load.
_BACKWARD_NODES_PER_PROGRAM = 8


@dataclass(frozen=True)
class AttentionLaunchConfig:
    block_h: int
    block_c: int
    block_e_forward: int
    block_e_by_destination: int
    block_e_by_source: int
    nodes_per_program: int
    num_warps: int


def attention_launch_config(
    num_heads: int, head_dim: int, mean_in_degree: float, mean_out_degree: float
) -> AttentionLaunchConfig:
    block_h = triton.next_power_of_2(num_heads)
    block_c = triton.next_power_of_2(head_dim)
    row = block_h * block_c
    max_block_e = max(1, _MAX_EDGE_TILE // row)

    def edge_block(mean_degree: float) -> int:
        # Round the typical degree up to a power of two so a typical node needs one step, within the tile cap.
        return max(1, min(max_block_e, triton.next_power_of_2(max(1, round(mean_degree)))))

    return AttentionLaunchConfig(
        block_h=block_h,
        block_c=block_c,
        block_e_forward=edge_block(mean_in_degree),
        block_e_by_destination=edge_block(mean_in_degree),
        block_e_by_source=edge_block(mean_out_degree),
        nodes_per_program=_BACKWARD_NODES_PER_PROGRAM,
        num_warps=4 if row <= 512 else 8,
    )
