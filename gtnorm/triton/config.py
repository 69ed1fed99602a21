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

import dataclasses
import functools
from dataclasses import dataclass

import torch

from gtnorm._runtime import DEFAULT_SHARED_MEMORY, shared_memory_per_block, sm_count

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
# With the fused edge projection the by-source pass reads no edge rows; its LayerNorm form took 140 registers (7
# two-warp programs an SM) and ran 2-5 % faster capped at 128 (8), with no spill (benchmarks/NOTES.md v40). With
# edge rows the cap spills, so it is set only there.
_BY_SOURCE_PROJECTION_MAX_REGISTERS = 128
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
    # Channels per tile of the node-block products and the weights' gradient (a power of two >= 16); 0: each
    # head's whole row (C padded) in one tile. Wide heads are walked in tiles of this many channels, so that the
    # tiles fit in shared memory (projection_launch).
    channel_block: int = 0

    def channels(self, head_dim: int) -> int:
        """Channels per tile for heads of ``head_dim`` channels."""
        whole = dot_width(head_dim)
        return min(self.channel_block, whole) if self.channel_block else whole


# Room left below the device's limit for what the model does not count.
_SHARED_MEMORY_MARGIN = 8192
# The largest fp32 tiles of a 4-warp node-block program, [nodes, channels] and [weight rows, channels]. Whole rows
# up to 8192 elements (8 x 128 ran so before); tiles of a split row up to 4096, 32 registers per thread as the tuned
# 16 x 64 layout's: the recorded 8192-element tiles of split rows spilled 50-100 registers (NOTES.md, v18).
_MAX_WHOLE_ROW_TILE = 8192
_MAX_NODE_TILE = 4096


def node_block_shared_bytes(kernel: str, block_n: int, block_d: int, block_c: int) -> int:
    """Modelled shared memory (bytes) of one program of a node-block kernel over [block_n nodes, block_c channels]
    tiles with block_d weight rows. ``kernel``: "project" ([N, C] x [C, D]), "expand" ([N, D] x [D, C]) or
    "weight_grad" (two [D, N] x [N, C] products). Fitted to what Triton 3.6 allocated on an H100 (the tf32x3 products
    stage each fp32 operand through shared memory, split in parts, over the loop's 3 pipeline stages): an upper
    bound of every recorded figure, whatever the norm (tests/triton/data/shared_memory_h100.json,
    tests/triton/test_config.py)."""
    if kernel == "project":
        elements = max(block_c, 32) * (3 * block_n + 6 * block_d + 2)
    elif kernel == "expand":
        elements = 6 * block_n * block_d + block_c * (2 * block_d + 64)
    elif kernel == "weight_grad":
        elements = 4 * block_n * block_c + 6 * block_n * block_d
    else:
        raise ValueError(f"unknown node-block kernel {kernel!r}")
    return 4 * elements


def projection_launch(head_dim: int, extended_dim: int, shared_memory: int = DEFAULT_SHARED_MEMORY) -> ProjectionLaunch:
    """The fused edge projection's plan for heads of ``head_dim`` channels and ``extended_dim`` (D + bias) weight
    rows: the widest channel tile (a power of two, at least 16) whose node-block programs fit ``shared_memory``
    bytes and the register bound; None where even 16 channels do not fit."""
    plan = ProjectionLaunch()
    block_d = dot_width(extended_dim)
    budget = shared_memory - _SHARED_MEMORY_MARGIN
    block_c = dot_width(head_dim)
    while block_c >= 16:
        tiles = (
            ("project", plan.project_block),
            ("expand", plan.expand_block),
            ("weight_grad", plan.grad_block),
        )
        fits = all(node_block_shared_bytes(kernel, n, block_d, block_c) <= budget for kernel, n in tiles)
        bound = _MAX_WHOLE_ROW_TILE if block_c == dot_width(head_dim) else _MAX_NODE_TILE
        if fits and max(max(n for _, n in tiles), block_d) * block_c <= bound:
            break
        block_c //= 2
    else:
        return None
    return plan if block_c >= dot_width(head_dim) else dataclasses.replace(plan, channel_block=block_c)


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


def dot_width(n: int) -> int:
    """n padded to a power of two, at least 16: tl.dot's operands need 16 along every axis."""
    return max(16, next_power_of_2(n))


# The most warps a walk program gets on heads wider than its row slice (1 x 4096 runs the by-destination pass on
# 8 warps instead of 1): the elements per thread stay those of the tuned layouts instead of spilling.
_MAX_WALK_WARPS = 16


def _launch(num_heads: int, block_c: int, row_slice: int, num_warps: int, num_stages: int, **kw) -> KernelLaunch:
    block_h = min(next_power_of_2(num_heads), max(1, row_slice // block_c))
    warps = min(_MAX_WALK_WARPS, num_warps * max(1, block_h * block_c // row_slice))
    return KernelLaunch(block_h, cdiv(num_heads, block_h), warps, num_stages, **kw)


@functools.cache
def attention_launch_config(
    num_heads: int, head_dim: int, extended_dim: int = 0, shared_memory: int = DEFAULT_SHARED_MEMORY
) -> AttentionLaunchConfig | None:
    """Launch settings for H heads of C channels; with ``extended_dim`` > 0 (D + bias), for the fused edge
    projection (edge features from raw attributes inside the kernels) too, its tiles fitted to ``shared_memory``
    bytes per program (the device's limit: shared_memory_per_block). None where the projection's tiles cannot fit
    (the caller then projects the features itself). Cached: it runs on every call's host path."""
    block_c = next_power_of_2(head_dim)
    per_program = _BACKWARD_EDGES_PER_PROGRAM
    projection = ProjectionLaunch()
    if extended_dim:
        projection = projection_launch(head_dim, extended_dim, shared_memory)
        if projection is None:
            return None
    return AttentionLaunchConfig(
        block_c=block_c,
        forward=_launch(
            num_heads, block_c, _FORWARD_ROW_SLICE, num_warps=4,
            num_stages=3 if num_heads * head_dim >= _FORWARD_PIPELINE_MIN_ROW else 1,
        ),
        by_destination=_launch(
            num_heads, block_c, _BY_DESTINATION_ROW_SLICE, num_warps=1, num_stages=3, edges_per_program=per_program,
            max_registers=0 if extended_dim else _BY_DESTINATION_MAX_REGISTERS,
        ),
        by_source=_launch(
            num_heads, block_c, _BY_SOURCE_ROW_SLICE, num_warps=2, num_stages=4, edges_per_program=per_program,
            max_registers=_BY_SOURCE_PROJECTION_MAX_REGISTERS if extended_dim else 0,
        ),
        projection=projection,
    )


# The fused edge projection against lin_edge materialised + the attention, fwd+bwd, H100, bf16, 16 x 64, D = 8
# (benchmarks/NOTES.md, v18): 1.00-1.79x on every graph with 6 or more edges per destination, any norm; on the
# decoders (3 per destination) 0.74-0.92x on r5 -> O96 and, on r6 -> O320, 1.37x without a norm, 1.00x with LayerNorm.
# Below _PROJECTION_MIN_EDGES the calls are host-bound (level-5 / O96 graphs, ~60-170k edges): inside Anemoi's
# blocks on an H100 the fused projection's extra launches cost more than the edge rows it saves. The level-5
# processor (82k edges, 4 layers, fp16) ran its eager training step 11 % (LayerNorm) and 19 % (no norm) faster with
# lin_edge materialised, compiled 4-5 % faster (benchmarks/NOTES.md, v20); the level-6 processor (328k) and the
# O320 encoder (662k) gain from fusing (v10, v14).
_PROJECTION_MIN_DEGREE = 6.0
_PROJECTION_MIN_EDGES = 200_000
_PROJECTION_MIN_EDGES_LOW_DEGREE = 1_000_000  # below the degree: only without a norm, on graphs this large
# Edge features this large (elements, 2 GiB in bf16) are never materialised, whatever the speed: there memory
# decides how far a model reaches. An O800 decoder chunk at the yaml's 4 mapper chunks holds 2.0 G elements (3.7 GiB):
# fused, gtnorm's O800 step peaks at 0.75x Anemoi's instead of 0.82x for 0.4-2.3 % of the compiled step (H200,
# benchmarks/NOTES.md v41); an O1280 decoder chunk would hold 5.1 G (9.4 GiB at 4 chunks) or 1.3 G (16 chunks).
# The O320 decoder's chunks (0.3 G) stay materialised: fused they cost 1 % of the step there and no memory, since
# that step peaks in the processor (v42).
_PROJECTION_MAX_MATERIALISED = 2**30


def edge_projection_pays(num_edges: int, num_dst: int, norm: str | None, row_elements: int) -> bool:
    """Whether the fused edge projection is measured to beat forming the edge features (``row_elements`` = H * C
    per edge) with a matmul and running the attention on them, for a graph of these sizes and a QK norm (None,
    "rms", "layer"); and always where those features would take _PROJECTION_MAX_MATERIALISED elements or more."""
    if num_edges * row_elements >= _PROJECTION_MAX_MATERIALISED:
        return True
    if num_edges < _PROJECTION_MIN_EDGES:
        return False
    if num_edges >= _PROJECTION_MIN_DEGREE * max(num_dst, 1):
        return True
    return norm is None and num_edges >= _PROJECTION_MIN_EDGES_LOW_DEGREE


def launch_config_for(num_heads: int, head_dim: int, extended_dim: int, device) -> AttentionLaunchConfig | None:
    """attention_launch_config for a device: its own shared-memory limit (the default one off CUDA)."""
    return attention_launch_config(num_heads, head_dim, extended_dim, shared_memory_per_block(device))


@torch.compiler.assume_constant_result
def edge_projection_fits(num_heads: int, head_dim: int, extended_dim: int, device) -> bool:
    """Whether the fused edge projection's tiles fit the device (a plan exists): a constant to torch.compile, which
    traces the dispatch but cannot build the plan's dataclasses."""
    return launch_config_for(num_heads, head_dim, extended_dim, device) is not None


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
