"""Launch settings of the RMSNorm kernels, chosen from the tensor sizes alone (no tuning runs)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

# A whole row lives in registers (the shared math reduces a row in one tile); past this it would spill.
MAX_FUSED_COLS = 65536
# Bytes of input per [BLOCK_M, BLOCK_C] tile: small rows are stacked until one load step moves this much.
_TILE_BYTES = 8192
# Elements each thread should hold of a tile: two 16-byte vectors of bf16.
_ELEMENTS_PER_THREAD = 16
# Resident warps per SM the persistent grid aims for; memory-bound kernels need several programs per SM
# to keep enough loads in flight.
_WARPS_PER_SM = 32
# The interpreter has no SMs; a few programs still make every program loop over several row blocks.
_INTERPRETER_PROGRAMS = 4


@dataclass(frozen=True)
class RMSNormLaunchConfig:
    block_m: int  # rows per tile
    block_c: int  # columns per tile: the whole row, padded to a power of two
    num_warps: int
    n_programs: int  # persistent grid size; also the row count of the weight-gradient partial buffer


def rms_norm_launch_config(n_rows: int, n_cols: int, dtype: torch.dtype, device: torch.device) -> RMSNormLaunchConfig:
    block_c = triton.next_power_of_2(n_cols)
    rows_per_tile = max(1, _TILE_BYTES // (dtype.itemsize * block_c))
    block_m = min(rows_per_tile, triton.next_power_of_2(max(n_rows, 1)))
    threads = block_m * block_c // _ELEMENTS_PER_THREAD
    num_warps = min(32, max(4, triton.next_power_of_2(threads // 32)))
    n_row_blocks = triton.cdiv(n_rows, block_m)
    if device.type == "cuda":
        max_programs = _sm_count(device) * max(1, _WARPS_PER_SM // num_warps)
    else:
        max_programs = _INTERPRETER_PROGRAMS
    return RMSNormLaunchConfig(
        block_m=block_m,
        block_c=block_c,
        num_warps=num_warps,
        n_programs=max(1, min(n_row_blocks, max_programs)),
    )


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count
