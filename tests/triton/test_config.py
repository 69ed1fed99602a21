"""The launch plan's shared-memory arithmetic (gtnorm/triton/config.py) against figures Triton recorded on an H100
(tests/triton/data/shared_memory_h100.json, written by ``python -m benchmarks.kernels.shared_memory``), so that
CI, which compiles nothing, catches a plan that would not fit; and the plan for every head layout up to
H * C = 4096."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gtnorm.triton.config import (
    DEFAULT_SHARED_MEMORY,
    attention_launch_config,
    dot_width,
    edge_projection_pays,
    node_block_shared_bytes,
    projection_launch,
)

RECORDED = json.loads((Path(__file__).parent / "data" / "shared_memory_h100.json").read_text())


def test_recorded_figures_are_from_this_limit():
    assert RECORDED["limit"] == DEFAULT_SHARED_MEMORY
    assert len(RECORDED["node_block"]) > 50


@pytest.mark.parametrize("kernel", ["project", "expand", "weight_grad"])
def test_model_bounds_every_recorded_tile(kernel):
    """What Triton allocated (or asked for, where the launch failed) never exceeds the model, whatever the norm; and
    every tile that failed to launch is one the model rejects."""
    rows = [row for row in RECORDED["node_block"] if row[0] == kernel]
    assert rows
    for _, block_n, block_d, block_c, _norm, shared, failed in rows:
        modelled = node_block_shared_bytes(kernel, block_n, block_d, block_c)
        assert shared <= modelled, (block_n, block_d, block_c)
        if failed:
            assert modelled > RECORDED["limit"]


def test_model_is_not_loose_where_it_matters():
    """On Anemoi's layout (16 x 64, D = 11 with a bias) the model is within 1.7x of the largest figure recorded for
    each kernel's tile (over the norms: the model is one for all), so the plan does not split rows it need not."""
    largest = {}
    for kernel, block_n, block_d, block_c, _norm, shared, _ in RECORDED["node_block"]:
        if (block_d, block_c) == (16, 64):
            key = (kernel, block_n, block_d, block_c)
            largest[key] = max(largest.get(key, 0), shared)
    assert len(largest) == 3
    for key, shared in largest.items():
        assert node_block_shared_bytes(*key) <= 1.7 * shared, key


@pytest.mark.parametrize("heads_channels", [(h, 4096 // h) for h in (1, 2, 4, 8, 16, 32, 64)] + [(6, 160), (12, 80)])
@pytest.mark.parametrize("edge_dim", [1, 3, 8, 11, 32, 64])
@pytest.mark.parametrize("bias", [True, False])
def test_plan_fits_every_layout(heads_channels, edge_dim, bias):
    """Every head layout with H * C up to 4096 and D up to 64 gets a fused-projection plan whose modelled programs
    fit, with the widest tile that does (a tile twice as wide would not fit or break the register bound)."""
    heads, channels = heads_channels
    extended = edge_dim + bias
    plan = attention_launch_config(heads, channels, extended)
    assert plan is not None
    projection = plan.projection
    block_c, block_d = projection.channels(channels), dot_width(extended)
    assert 16 <= block_c <= dot_width(channels) and block_c & (block_c - 1) == 0
    for kernel, block_n in (
        ("project", projection.project_block),
        ("expand", projection.expand_block),
        ("weight_grad", projection.grad_block),
    ):
        assert node_block_shared_bytes(kernel, block_n, block_d, block_c) <= DEFAULT_SHARED_MEMORY


def test_plan_follows_the_device_limit():
    """A smaller limit (an older GPU) gets narrower tiles; one below any tile gets no plan (the op then materialises
    the edge features)."""
    wide = projection_launch(64, 12, DEFAULT_SHARED_MEMORY).channels(64)
    narrow = projection_launch(64, 12, 64 * 1024).channels(64)
    assert narrow < wide
    assert projection_launch(64, 12, 16 * 1024) is None
    assert attention_launch_config(16, 64, 12, 16 * 1024) is None


def test_walk_warps_grow_with_wide_heads():
    """Heads wider than a walk's row slice get more warps (the same elements per thread), never more than 16."""
    narrow, wide = attention_launch_config(16, 64), attention_launch_config(1, 4096)
    assert wide.by_destination.num_warps > narrow.by_destination.num_warps
    assert max(wide.forward.num_warps, wide.by_destination.num_warps, wide.by_source.num_warps) <= 16


@pytest.mark.parametrize(
    "num_edges, num_dst, norm, fused",
    [
        (327_660, 40_962, "layer", True),  # level-6 processor: 8 edges per node
        (662_072, 40_962, "rms", True),  # O320 -> level-6 encoder
        (81_900, 10_242, "layer", False),  # level-5 processor: host-bound, materialised
        (169_420, 10_242, None, False),  # O160 -> level-5 encoder
        (631_680, 210_560, "layer", False),  # level-6 -> O320 decoder in 2 chunks: 3 edges per node, with a norm
        (1_263_360, 421_120, "layer", True),  # the whole O320 decoder in one call: 1.3 G feature elements
        (1_263_360, 421_120, None, True),  # the same without a norm
        (1_000_000, 333_334, None, True),  # no norm, 1M edges: fused below 2^30 feature elements too
        (1_000_000, 333_334, "layer", False),  # the same with a norm
        (315_840, 105_280, "layer", False),  # level-6 -> O320 decoder, one of 4 chunks: 0.3 G feature elements
        (1_941_600, 647_200, "layer", True),  # level-7 -> O800 decoder, one of 4 chunks: 2.0 G, never stored
        (4_951_680, 1_650_560, "layer", True),  # level-7 -> O1280 decoder, one of 4 chunks: 5.1 G
        (1_048_576, 349_526, "rms", True),  # exactly 2^30 feature elements
        (1_048_575, 349_525, "rms", False),
    ],
)
def test_edge_projection_rule(num_edges, num_dst, norm, fused):
    assert edge_projection_pays(num_edges, num_dst, norm, row_elements=16 * 64) is fused
