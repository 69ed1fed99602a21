"""The tile helpers of the attention kernels (gtnorm/triton/tiles.py) that the op-level tests reach only through the
walks: ``normalized_dot``, the score of a key whose norm scales a per-head sum instead of every element.

Run through a small kernel on fp32 [H, C] rows (padding lanes included at C = 5 and 100) and compared with float64
norms of the same fp32 values, rows whose mean is up to 100 times their spread included: the sum runs on the centred
row, so nothing cancels beyond the rounding of the fp32 mean that the element-wise form has too.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from gtnorm.triton.tiles import NORM_LAYER, NORM_NONE, NORM_RMS, normalized_dot, row_tile_offsets
from tests.conftest import DEVICE

NORMS = {"layer": NORM_LAYER, "rms": NORM_RMS, "none": NORM_NONE}
FLOAT32_UNIT_ROUNDOFF = 2.0**-24


@triton.jit
def _normalized_dot_kernel(
    x_ptr,  # [N, H, C] fp32
    y_ptr,  # [N, H, C] fp32
    out_ptr,  # [N, H] fp32
    H,
    C,
    eps,
    NORM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    offsets, mask, offs_h = row_tile_offsets(0, H, C, BLOCK_H, BLOCK_C)
    row = tl.program_id(0) * H * C
    x = tl.load(x_ptr + row + offsets, mask=mask, other=0.0)
    y = tl.load(y_ptr + row + offsets, mask=mask, other=0.0)
    tl.store(out_ptr + tl.program_id(0) * H + offs_h, normalized_dot(x, y, C, eps, NORM), mask=offs_h < H)


def _reference(x: torch.Tensor, y: torch.Tensor, norm: str, eps: float) -> torch.Tensor:
    """<norm(x), y> per head in float64, with torch's own norms (no affine)."""
    x, y = x.double(), y.double()
    if norm == "layer":
        x = torch.nn.functional.layer_norm(x, x.shape[-1:], eps=eps)
    elif norm == "rms":
        x = torch.nn.functional.rms_norm(x, x.shape[-1:], eps=eps)
    return (x * y).sum(-1)


@pytest.mark.parametrize("norm", list(NORMS))
@pytest.mark.parametrize("channels", [5, 64, 100])
@pytest.mark.parametrize("mean_over_spread", [0.0, 100.0])
def test_normalized_dot_matches_the_normalised_rows_product(norm, channels, mean_over_spread):
    torch.manual_seed(0)
    rows, heads, eps = 16, 3, 1e-5
    x = torch.randn(rows, heads, channels) + mean_over_spread * torch.randn(rows, heads, 1).sign()
    y = torch.randn(rows, heads, channels)
    out = torch.empty(rows, heads, device=DEVICE)
    _normalized_dot_kernel[(rows,)](
        x.to(DEVICE), y.to(DEVICE), out, heads, channels, eps, NORM=NORMS[norm],
        BLOCK_H=triton.next_power_of_2(heads), BLOCK_C=triton.next_power_of_2(channels),
    )  # fmt: skip
    expected = _reference(x, y, norm, eps)
    # Against the size of the terms, sum |x_hat y|, not of the sum, which may be near 0.
    scale = _reference(x.abs(), y.abs(), "none" if norm == "none" else "rms", eps)
    error = ((out.double().cpu() - expected).abs() / scale).max().item()
    # A few fp32 ulp; with LayerNorm also the rounding of the fp32 mean (an ulp of the mean over the spread), which
    # the row normalised element by element carries alike.
    assert error < 16 * FLOAT32_UNIT_ROUNDOFF * (1 + mean_over_spread), error
