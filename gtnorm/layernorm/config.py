"""Launch settings of the standalone LayerNorm kernels: the RMSNorm kernels' tiles (gtnorm/rmsnorm/config.py), with
fewer elements per thread in the backward, which holds two fp32 accumulators (weight and bias) to RMSNorm's one."""

from __future__ import annotations

import dataclasses

import torch
import triton

from gtnorm._runtime import sm_count
from gtnorm.rmsnorm.config import RMSNormLaunchConfig, rms_norm_launch_config

# x, dy, x_hat, dx and two accumulators per element: at RMSNorm's 32 elements per thread for rows past 128 they
# spill (measured 73-78 % of copy bandwidth at C = 256..1024 against 93-94 % at C <= 128, benchmarks/NOTES.md v7).
_BACKWARD_ELEMENTS_PER_THREAD = 8
_BACKWARD_WARPS_PER_SM = 32


def layer_norm_launch_config(
    n_rows: int, n_cols: int, dtype: torch.dtype, device: torch.device, backward: bool = False
) -> RMSNormLaunchConfig:
    cfg = rms_norm_launch_config(n_rows, n_cols, dtype, device, backward=backward)
    if not backward:
        return cfg
    threads = cfg.block_m * cfg.block_c // _BACKWARD_ELEMENTS_PER_THREAD
    num_warps = min(32, max(4, triton.next_power_of_2(threads // 32)))
    if device.type != "cuda":  # the interpreter: keep the few programs of the RMSNorm settings
        return dataclasses.replace(cfg, num_warps=num_warps)
    max_programs = sm_count(device) * max(1, _BACKWARD_WARPS_PER_SM // num_warps)
    n_programs = max(1, min(triton.cdiv(n_rows, cfg.block_m), max_programs))
    return dataclasses.replace(cfg, num_warps=num_warps, n_programs=n_programs)
