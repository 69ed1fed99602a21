"""The LayerNorm statistics helper of the attention kernels (gtnorm/layernorm/math.py) on rows whose mean is large
against their spread.

layer_norm_stats takes two passes (the mean, then the variance of the centred row), so its relative error stays a
few fp32 ulp where a one-pass E[x^2] - mean^2 would lose ulp times mean^2 / var. It is run through a small kernel
on fp32 rows and compared with float64 statistics of the same fp32 values.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from gtnorm.layernorm.math import layer_norm_stats
from tests.conftest import DEVICE

FLOAT32_UNIT_ROUNDOFF = 2.0**-24


@triton.jit
def _stats_kernel(x_ptr, mean_ptr, rstd_ptr, n_cols, eps, BLOCK_C: tl.constexpr):
    offs_c = tl.arange(0, BLOCK_C)
    x = tl.load(x_ptr + tl.program_id(0) * n_cols + offs_c[None, :], mask=offs_c[None, :] < n_cols, other=0.0)
    mean, rstd = layer_norm_stats(x, n_cols, eps, 1)
    tl.store(mean_ptr + tl.program_id(0) + tl.arange(0, 1)[None, :], mean)
    tl.store(rstd_ptr + tl.program_id(0) + tl.arange(0, 1)[None, :], rstd)


def _rstd_error(mean_over_spread: float, n_cols: int, n_rows: int = 64) -> float:
    """Largest relative error of rstd over n_rows random rows whose mean is +-mean_over_spread times their spread."""
    torch.manual_seed(0)
    x = torch.randn(n_rows, n_cols, dtype=torch.float64) + mean_over_spread * torch.randn(n_rows, 1).sign()
    x32 = x.float().to(DEVICE)
    mean = torch.empty(n_rows, dtype=torch.float32, device=DEVICE)
    rstd = torch.empty_like(mean)
    eps = 1e-5
    _stats_kernel[(n_rows,)](x32, mean, rstd, n_cols, eps, BLOCK_C=triton.next_power_of_2(n_cols))
    exact = x32.double().cpu()
    expected = 1 / (exact.var(dim=1, unbiased=False) + eps).sqrt()
    assert torch.allclose(mean.double().cpu(), exact.mean(dim=1), rtol=1e-6, atol=1e-6)
    return ((rstd.double().cpu() - expected).abs() / expected).max().item()


@pytest.mark.parametrize("n_cols", [5, 64, 100])
@pytest.mark.parametrize("mean_over_spread", [0.0, 3.0, 10.0, 30.0, 100.0])
def test_error_stays_a_few_ulp_whatever_the_mean(mean_over_spread, n_cols):
    """At a mean of 100 spreads one pass would be ~1e4 ulp off; two passes stay within a few (padding lanes included
    at C = 5 and 100)."""
    assert _rstd_error(mean_over_spread, n_cols) <= 16 * FLOAT32_UNIT_ROUNDOFF
