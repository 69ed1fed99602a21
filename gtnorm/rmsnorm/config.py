"""Launch settings of the RMSNorm kernels, chosen from the tensor sizes alone (no tuning runs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from gtnorm._runtime import sm_count

# A whole row lives in registers (the shared math reduces a row in one tile); past this it would spill.
MAX_FUSED_COLS = 65536
# The interpreter has no SMs; a few programs still make every program loop over several row blocks.
_INTERPRETER_PROGRAMS = 4

# Measured on an H200 (bf16, M*C = 2**28; benchmarks/NOTES.md, "RMSNorm"):
# - forward: one 4 KB tile per program, as many programs as tiles (97-98 % of copy bandwidth for C <= 1024;
#   a persistent grid stayed near 90 %), 32 elements per thread;
# - backward: a persistent grid of 32 resident warps per SM, so the weight-gradient partials stay one row per
#   program; 8 KB tiles; more warps (8 elements per thread) for short rows, 32 elements per thread for long.
_FORWARD_TILE_BYTES = 4096
_BACKWARD_TILE_BYTES = 8192
_FORWARD_ELEMENTS_PER_THREAD = 32
_BACKWARD_WARPS_PER_SM = 32


def _backward_elements_per_thread(block_c: int) -> int:
    return 8 if block_c <= 128 else 32


@dataclass(frozen=True)
class RMSNormLaunchConfig:
    block_m: int  # rows per tile
    block_c: int  # columns per tile: the whole row, padded to a power of two
    num_warps: int
    n_programs: int  # grid size; in the backward also the row count of the weight-gradient partial buffer


def rms_norm_launch_config(
    n_rows: int, n_cols: int, dtype: torch.dtype, device: torch.device, backward: bool = False
) -> RMSNormLaunchConfig:
    block_c = triton.next_power_of_2(n_cols)
    tile_bytes = _BACKWARD_TILE_BYTES if backward else _FORWARD_TILE_BYTES
    rows_per_tile = max(1, tile_bytes // (dtype.itemsize * block_c))
    block_m = min(rows_per_tile, triton.next_power_of_2(max(n_rows, 1)))
    per_thread = _backward_elements_per_thread(block_c) if backward else _FORWARD_ELEMENTS_PER_THREAD
    threads = block_m * block_c // per_thread
    num_warps = min(32, max(4, triton.next_power_of_2(threads // 32)))
    n_row_blocks = triton.cdiv(n_rows, block_m)
    if device.type != "cuda":
        max_programs = _INTERPRETER_PROGRAMS
    elif backward:
        max_programs = sm_count(device) * max(1, _BACKWARD_WARPS_PER_SM // num_warps)
    else:
        max_programs = n_row_blocks
    return RMSNormLaunchConfig(
        block_m=block_m,
        block_c=block_c,
        num_warps=num_warps,
        n_programs=max(1, min(n_row_blocks, max_programs)),
    )
