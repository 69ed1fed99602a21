"""The fused edge projection's node-block kernels (gtnorm/triton/node_projection_kernels.py, launched through
edge_projection_launch.EdgeProjection) against torch in float64, on fresh random inputs: odd sizes (node counts
that leave a partial block, C and D + 1 below tl.dot's 16), a strided weight as torch.nn.Linear's ``weight.t()``
gives it, with and without a bias, each head's row whole and in channel tiles (the last one partial). float32
kernels: 1e-5 relative (tf32x3 products, measured ~1e-7)."""

from __future__ import annotations

import pytest
import torch

from gtnorm import _runtime
from gtnorm.triton.attention_launch import NORM_CODES
from gtnorm.triton.config import ProjectionLaunch
from gtnorm.triton.edge_projection_launch import EdgeProjection
from tests.conftest import DEVICE
from tests.graphs import draw_seed, rel_error

EPS = 1e-5
# 0: each head's row in one tile; 16: in tiles of 16 channels (what the plan picks for wide heads).
CHANNEL_TILES = pytest.mark.parametrize("channel_block", [0, 16], ids=["whole_rows", "channel_tiles"])


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    monkeypatch.setattr(_runtime, "POISON_OUTPUTS", True)


def _weights(edge_dim, heads, channels, bias, generator):
    # Stored as torch.nn.Linear keeps it ([H * C, D]) and passed transposed: the kernels take any strides.
    linear_weight = torch.randn(heads * channels, edge_dim, generator=generator, dtype=torch.float64)
    edge_bias = torch.randn(heads * channels, generator=generator, dtype=torch.float64) if bias else None
    return linear_weight.t(), edge_bias


def _extended(weight, bias):  # [D (+1), H * C]: the bias as W's extra row
    return torch.cat([weight, bias[None]]) if bias is not None else weight


def _on_device(*tensors):
    return [t.to(DEVICE, torch.float32) if t is not None else None for t in tensors]


@pytest.mark.parametrize("norm", ["none", "rms", "layer"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@CHANNEL_TILES
def test_project_rows_matches_torch(norm, bias, channel_block):
    generator = torch.Generator().manual_seed(draw_seed())
    nodes, heads, channels, edge_dim = 70, 3, 12 if not channel_block else 36, 5
    rows = 3.0 + torch.randn(nodes, heads, channels, generator=generator, dtype=torch.float64)
    norm_weight = 1.0 + 0.5 * torch.randn(channels, generator=generator, dtype=torch.float64)
    norm_bias = 0.5 * torch.randn(channels, generator=generator, dtype=torch.float64) if norm == "layer" else None
    weight, edge_bias = _weights(edge_dim, heads, channels, bias, generator)
    if norm == "rms":
        normalised = torch.nn.functional.rms_norm(rows, (channels,), norm_weight, EPS)
    elif norm == "layer":
        normalised = torch.nn.functional.layer_norm(rows, (channels,), norm_weight, norm_bias, EPS)
    else:
        normalised, norm_weight = rows, None
    expected = torch.einsum("nhc,dhc->nhd", normalised, _extended(weight, edge_bias).view(-1, heads, channels))

    dev_rows, dev_weight, dev_bias, dev_norm_weight, dev_norm_bias = _on_device(
        rows, weight, edge_bias, norm_weight, norm_bias
    )
    out = torch.empty(nodes, heads, expected.shape[2], device=DEVICE)
    projection = EdgeProjection(dev_weight, dev_bias, ProjectionLaunch(channel_block=channel_block))
    projection.project(dev_rows, dev_norm_weight, dev_norm_bias, NORM_CODES[norm], EPS, out)
    assert rel_error(out.double().cpu(), expected) < 1e-5


@pytest.mark.parametrize("norm", ["none", "rms", "layer"])
@CHANNEL_TILES
def test_add_expanded_rows_matches_torch(norm, channel_block):
    """target += sums W; with a norm, sums W is a term of dL/dq' and what is added is dL/dq through the norm (the
    gradient autograd gives), with its terms of the norm parameters' gradients in the partial rows."""
    generator = torch.Generator().manual_seed(draw_seed())
    nodes, heads, channels, edge_dim = 45, 2, 20, 7
    weight, edge_bias = _weights(edge_dim, heads, channels, True, generator)
    sums = torch.randn(nodes, heads, edge_dim + 1, generator=generator, dtype=torch.float64)
    target = torch.randn(nodes, heads, channels, generator=generator, dtype=torch.float64)
    query = 2.0 + torch.randn(nodes, heads, channels, generator=generator, dtype=torch.float64)
    q_weight = (1.0 + 0.5 * torch.randn(channels, generator=generator, dtype=torch.float64)).requires_grad_()
    q_bias = (0.5 * torch.randn(channels, generator=generator, dtype=torch.float64)).requires_grad_()
    grad_q_norm = torch.einsum("nhd,dhc->nhc", sums, _extended(weight, edge_bias).view(-1, heads, channels))

    projection = EdgeProjection(*_on_device(weight, edge_bias), ProjectionLaunch(channel_block=channel_block))
    dev_sums, dev_target = _on_device(sums, target)
    if norm == "none":
        projection.add_expanded(dev_sums, dev_target)
        assert rel_error(dev_target.double().cpu(), target + grad_q_norm) < 1e-5
        return

    leaf = query.clone().requires_grad_()
    if norm == "rms":
        normalised = torch.nn.functional.rms_norm(leaf, (channels,), q_weight, EPS)
        params, bias_arg = (q_weight,), None
    else:
        normalised = torch.nn.functional.layer_norm(leaf, (channels,), q_weight, q_bias, EPS)
        params, bias_arg = (q_weight, q_bias), q_bias
    grads = torch.autograd.grad(normalised, (leaf, *params), grad_q_norm)
    width = channels * len(params)
    first_row = 3  # rows before it belong to another kernel: left as they are
    partial = torch.full((first_row + projection.partial_rows(nodes, heads, channels), width), 7.0, device=DEVICE)
    dev_query, dev_q_weight, dev_q_bias = _on_device(query, q_weight.detach(), bias_arg)
    projection.add_expanded(
        dev_sums, dev_target, dev_query, dev_q_weight, dev_q_bias, NORM_CODES[norm], EPS, partial, first_row
    )
    assert rel_error(dev_target.double().cpu(), target + grads[0]) < 1e-5
    assert (partial[:first_row] == 7.0).all()
    sums_of_partials = partial[first_row:].double().sum(dim=0).cpu()
    for i, grad in enumerate(grads[1:]):
        assert rel_error(sums_of_partials[i * channels : (i + 1) * channels], grad) < 1e-5
