"""The fixed-order column sum that turns the backward's weight-gradient partial rows into the gradient."""

import pytest
import torch

from gtnorm.triton.attention_launch import column_sum
from gtnorm.triton.config import column_sum_launch
from tests.conftest import DEVICE


@pytest.fixture(params=["kernel", "default"])
def plan(request):
    """Short partials go to torch's sum by default; "kernel" sends every size through the Triton kernel."""
    if request.param == "kernel":
        return lambda rows: column_sum_launch(*rows.shape, rows.device, min_rows=1)
    return lambda rows: column_sum_launch(*rows.shape, rows.device)


# Row counts around the tile height (64 rows of 64 columns) and the programs' blocks; columns that do not
# fill a power of two.
@pytest.mark.parametrize("n_rows", [0, 1, 63, 64, 65, 1000] + ([300_000] if DEVICE.type == "cuda" else []))
@pytest.mark.parametrize("n_cols", [1, 5, 64, 100])
def test_column_sum_matches_torch(n_rows, n_cols, plan):
    rows = torch.randn(n_rows, n_cols, dtype=torch.float64)
    expected = rows.sum(dim=0)
    rows32 = rows.to(device=DEVICE, dtype=torch.float32)
    result = column_sum(rows32, plan(rows32))
    assert result.shape == (n_cols,) and result.dtype == torch.float32
    torch.testing.assert_close(result.double().cpu(), expected, rtol=1e-5, atol=1e-5 * (n_rows**0.5 + 1))


def test_column_sum_is_bitwise_reproducible(plan):
    rows = torch.randn(5000, 64, device=DEVICE)
    assert torch.equal(column_sum(rows, plan(rows)), column_sum(rows.clone(), plan(rows)))
