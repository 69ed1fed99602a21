"""Launch settings of the attention kernels: :func:`attention_launch_config` is the one plan function, chosen
from the tensor sizes; the per-graph numbers (nodes per program) follow from it and the graph's mean degrees.
The ops take a plan as an argument (``launch=``), so a sweep or a test passes its own in rather than patching
this module.

Nothing here benchmarks: a new graph never triggers a tuning run, the per-graph numbers (nodes per backward
program) are runtime arguments, and the forward's pipeline depth takes one of two values, so at most two
forward variants get compiled. The numbers come from sweeps on an H100 (benchmarks/NOTES.md, v2-v3): the kernels
are bound by the latency of dependent gathers (edge index, then the rows it points to), so what pays is many
small, register-light programs per SM whose loads the software pipeliner keeps in flight.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from gtnorm._runtime import sm_count

# Row slice (heads x padded channels) of one program: the forward and the by-source pass keep up to 1024
# elements together; the by-destination pass holds more state per element (q, dO, two accumulators) and
# runs best as one-warp programs over 512-element slices.
_FORWARD_ROW_SLICE = 1024
_BY_DESTINATION_ROW_SLICE = 512
_BY_SOURCE_ROW_SLICE = 1024
# Edges one backward program walks (rounded to whole nodes): enough for the pipeline's fill and drain to be
# amortised, few enough for many programs and small weight-gradient partials (one fp32 row per program).
_BACKWARD_EDGES_PER_PROGRAM = 16
# The by-destination pass holds the most state; capped at 160 registers, 12 rather than 11 one-warp programs
# fit an SM (65536 registers), which paid more than the compiler's own choice (185, no spills either way).
_BY_DESTINATION_MAX_REGISTERS = 160
# With the fused edge projection that pass carries two more [heads, D + 1] tiles and loads two more per edge: under
# the cap it spilled; the compiler's own register count (~235) measured 11-18 % faster than the cap of 160 and
# than 4 heads per program (benchmarks/NOTES.md, v10).
# The fused edge projection's node-block products (node_projection_kernels.py): nodes per program (tl.dot needs
# 16 rows at least; projecting reads one tensor, expanding two and writes one: 64 and 32 measured best, 16 was
# 1.3-2x slower, NOTES v10), and the d edge_features pass (edge_features_grad_kernel.py): edges per program.
_PROJECT_NODE_BLOCK = 64
_EXPAND_NODE_BLOCK = 32
_PROJECTION_EDGE_BLOCK = 128
# The forward pipelines its per-node edge loop only where nodes have many edges (encoders, ~16): on the
# decoder's 3-edge nodes the pipeline's fill cost more than it hid (NOTES.md, v2).
_FORWARD_PIPELINE_MIN_DEGREE = 8.0
# ... and only for rows of at least this many elements (H * C): on short rows (H = 5, C = 24) the pipeline's
# round trip through shared memory cost more than it hid (NOTES.md, v3).
_FORWARD_PIPELINE_MIN_ROW = 512
# Column sums of the weight-gradient partials: 4096-element fp32 tiles, and a few programs per SM, so that the
# loads fill the GPU while each program still sums a long block of rows. Below _COLUMN_SUM_MIN_ROWS rows torch's
# own sum is as fast on the GPU and saves a launch: on the small, host-bound graphs the two extra launches cost
# ~0.1 ms of host time per forward+backward (benchmarks/NOTES.md, v5).
_COLUMN_SUM_TILE = 4096
_COLUMN_SUM_PROGRAMS_PER_SM = 4
_COLUMN_SUM_MIN_ROWS = 65536


@dataclass(frozen=True)
class KernelLaunch:
    block_h: int  # heads per program (a power of two)
    head_groups: int  # programs along the head axis
    num_warps: int
    num_stages: int  # software-pipeline depth of the edge loop (the interpreter ignores it); 1: not pipelined
    edges_per_program: int = 1  # target number of edges per program (whole nodes)
    max_registers: int = 0  # the compiler's register cap per thread (maxnreg); 0: its own choice

    def compile_options(self) -> dict:
        return {"maxnreg": self.max_registers} if self.max_registers else {}

    def nodes_per_program(self, mean_degree: float) -> int:
        return max(1, round(self.edges_per_program / max(mean_degree, 1.0)))


@dataclass(frozen=True)
class ProjectionLaunch:
    """The fused edge projection's kernels besides the edge walks."""

    project_block: int = _PROJECT_NODE_BLOCK  # nodes per program of the projections (>= 16: tl.dot)
    expand_block: int = _EXPAND_NODE_BLOCK  # nodes per program of the expansions (>= 16)
    node_warps: int = 4
    edge_block: int = _PROJECTION_EDGE_BLOCK  # edges per program of the d edge_features pass
    edge_warps: int = 4
    # The edge weights' gradient (edge_weight_grad_kernel.py): destinations per tile, and programs per SM (over all
    # heads: each takes one head). A few per SM fill the GPU; more would only add [D + 1, C] fp32 partial blocks to
    # sum (8 per SM: ~3 MB at Anemoi's sizes).
    grad_block: int = 32
    grad_programs_per_sm: int = 8


@dataclass(frozen=True)
class AttentionLaunchConfig:
    block_c: int  # channels, padded to a power of two
    forward: KernelLaunch
    by_destination: KernelLaunch
    by_source: KernelLaunch
    projection: ProjectionLaunch = ProjectionLaunch()

    def forward_stages(self, mean_in_degree: float) -> int:
        if mean_in_degree >= _FORWARD_PIPELINE_MIN_DEGREE:
            return self.forward.num_stages
        return 1


def cdiv(a: int, b: int) -> int:
    # Plain Python: triton.cdiv is a constexpr function in newer Triton, ~5 us per call from the host.
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _launch(num_heads: int, block_c: int, row_slice: int, num_warps: int, num_stages: int, **kw) -> KernelLaunch:
    block_h = min(next_power_of_2(num_heads), max(1, row_slice // block_c))
    return KernelLaunch(block_h, cdiv(num_heads, block_h), num_warps, num_stages, **kw)


@functools.cache
def attention_launch_config(num_heads: int, head_dim: int, edge_projection: bool = False) -> AttentionLaunchConfig:
    """Launch settings for H heads of C channels, and for the fused edge projection (edge features from raw
    attributes inside the kernels) where ``edge_projection`` (cached: it runs on every call's host path)."""
    block_c = next_power_of_2(head_dim)
    per_program = _BACKWARD_EDGES_PER_PROGRAM
    return AttentionLaunchConfig(
        block_c=block_c,
        forward=_launch(
            num_heads, block_c, _FORWARD_ROW_SLICE, num_warps=4,
            num_stages=3 if num_heads * head_dim >= _FORWARD_PIPELINE_MIN_ROW else 1,
        ),
        by_destination=_launch(
            num_heads, block_c, _BY_DESTINATION_ROW_SLICE, num_warps=1, num_stages=3, edges_per_program=per_program,
            max_registers=0 if edge_projection else _BY_DESTINATION_MAX_REGISTERS,
        ),
        by_source=_launch(
            num_heads, block_c, _BY_SOURCE_ROW_SLICE, num_warps=2, num_stages=4, edges_per_program=per_program
        ),
    )


@dataclass(frozen=True)
class ColumnSumLaunch:
    block_r: int  # rows per tile
    block_c: int  # columns, padded to a power of two
    programs: int
    rows_per_program: int  # a multiple of block_r


def column_sum_launch(
    n_rows: int, n_cols: int, device, min_rows: int = _COLUMN_SUM_MIN_ROWS
) -> ColumnSumLaunch | None:
    """How to reduce [n_rows, n_cols] partial rows to one block sum per program; None: leave it all to torch
    (below ``min_rows`` rows)."""
    if n_rows < min_rows or n_rows == 0:
        return None
    block_c = next_power_of_2(n_cols)
    block_r = max(1, _COLUMN_SUM_TILE // block_c)
    blocks = cdiv(n_rows, block_r)
    programs = min(blocks, sm_count(device) * _COLUMN_SUM_PROGRAMS_PER_SM)
    return ColumnSumLaunch(block_r, block_c, programs, cdiv(blocks, programs) * block_r)
