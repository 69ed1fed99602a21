"""The MLP epilogue probe's kernels (benchmarks/kernels/mlp_epilogue.py) against float64 torch: the forward's h and
GELU, the backward's dh and GELU, with ragged edges (rows and columns not multiples of the tile) and more tiles than
programs. Under the Triton interpreter on the CPU; on a GPU, compiled."""

from __future__ import annotations

import pytest
import torch

from benchmarks.kernels.mlp_epilogue import Tile, linear_gelu, linear_gelu_backward
from tests.conftest import DEVICE


@pytest.mark.parametrize("rows", [100, 64])
def test_epilogues_match_torch(rows):
    generator = torch.Generator().manual_seed(rows)
    dtype = torch.float16
    x = torch.randn(rows, 64, generator=generator).to(dtype)
    w1 = (torch.randn(96, 64, generator=generator) / 8).to(dtype)
    b1 = (torch.randn(96, generator=generator) / 10).to(dtype)
    w2_t = (torch.randn(64, 96, generator=generator) / 10).t().contiguous().to(dtype)
    grad_y = torch.randn(rows, 64, generator=generator).to(dtype)
    tile = Tile.parse("64x64x32x4x2")
    on = {name: t.to(DEVICE) for name, t in dict(x=x, w1=w1, b1=b1, w2_t=w2_t, grad_y=grad_y).items()}

    h, activated = linear_gelu(on["x"], on["w1"], on["b1"], tile, programs=3)
    h_ref = torch.addmm(b1.double(), x.double(), w1.double().t())
    torch.testing.assert_close(h.double().cpu(), h_ref, rtol=2e-3, atol=2e-3)
    # GELU of h as stored, as torch's GELU reads the addmm's fp16 output.
    torch.testing.assert_close(activated.cpu(), torch.nn.functional.gelu(h.cpu().double()).to(dtype), rtol=2e-3,
                               atol=2e-3)  # fmt: skip

    grad_h, activated = linear_gelu_backward(on["grad_y"], on["w2_t"], h, tile, programs=3)
    grad_h_ref = torch.ops.aten.gelu_backward(grad_y.double() @ w2_t.double().t(), h.cpu().double())
    torch.testing.assert_close(grad_h.double().cpu(), grad_h_ref, rtol=3e-3, atol=3e-3)
    torch.testing.assert_close(activated.double().cpu(), torch.nn.functional.gelu(h.cpu().double()), rtol=2e-3,
                               atol=2e-3)  # fmt: skip


def test_tile_parse():
    assert Tile.parse("128x256x64") == Tile(128, 256, 64, 8, 3)
    assert Tile.parse("128x128x64x4x4") == Tile(128, 128, 64, 4, 4)
