"""gtnorm/layernorm/rows.py: the row LayerNorm kernels against torch's LayerNorm in float64."""

from __future__ import annotations

import pytest
import torch

from gtnorm.layernorm.rows import layer_norm_rows, layer_norm_rows_backward
from tests.conftest import DEVICE

# The output's rounding (one unit of its dtype) plus fp32 math over a row; the gradients' fp32 sums over rows.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_forward_and_backward_match_float64(dtype, affine):
    """y, mean, rstd and dx in the given dtypes, d weight and d bias (fp32 sums over the rows) against torch's
    LayerNorm in float64 on the same values; 37 rows of 200 channels (rows and lanes that do not fill a tile)."""
    rows, channels = 37, 200
    x = (torch.randn(rows, channels, device=DEVICE) * 3 + 1).to(dtype)
    weight = torch.randn(channels, device=DEVICE) if affine != "none" else None
    bias = torch.randn(channels, device=DEVICE) if affine == "both" else None
    grad_y = torch.randn(rows, channels, device=DEVICE).to(dtype)
    x64 = x.double().requires_grad_()
    params64 = [p.double().requires_grad_() if p is not None else None for p in (weight, bias)]
    y64 = torch.nn.functional.layer_norm(x64, (channels,), *params64, eps=1e-5)
    grads64 = torch.autograd.grad(y64, [x64, *(p for p in params64 if p is not None)], grad_y.double())

    y, mean, rstd = layer_norm_rows(x, weight, bias, 1e-5, out_dtype=dtype)
    assert y.dtype == dtype and mean.dtype == rstd.dtype == torch.float32
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(y.double(), y64.detach(), rtol=tol, atol=tol)
    torch.testing.assert_close(mean.double(), x.double().mean(1), rtol=1e-5, atol=1e-5)
    grad_x = torch.empty_like(x)
    param_grads = layer_norm_rows_backward(grad_y, x, weight, mean, rstd, grad_x, affine != "none")
    torch.testing.assert_close(grad_x.double(), grads64[0], rtol=tol, atol=tol * grads64[0].abs().max().item())
    if affine == "none":
        assert param_grads is None
        return
    expected = {"weight": grads64[1]} | ({"bias": grads64[2]} if bias is not None else {})
    actual = dict(zip(("weight", "bias"), param_grads, strict=True))
    for name, grad in expected.items():
        assert actual[name].dtype == torch.float32
        torch.testing.assert_close(actual[name].double(), grad, rtol=tol, atol=tol * grad.abs().max().item())


def test_output_dtype_is_its_own_and_no_rows_is_fine():
    x = torch.randn(5, 64, device=DEVICE)
    y, _, _ = layer_norm_rows(x, None, None, 1e-5, out_dtype=torch.bfloat16)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (64,)).to(torch.bfloat16))
    empty = torch.empty(0, 64, device=DEVICE)
    y, mean, rstd = layer_norm_rows(empty, None, None, 1e-5, out_dtype=torch.float32)
    assert y.shape == (0, 64) and mean.shape == rstd.shape == (0,)
    ones = torch.ones(64, device=DEVICE)
    sums = layer_norm_rows_backward(empty, empty, ones, mean, rstd, torch.empty_like(empty), True)
    assert all(torch.equal(s, torch.zeros(64, device=DEVICE)) for s in sums)
