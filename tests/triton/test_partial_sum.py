"""The fixed-order column sum that turns the backward's weight-gradient partial rows into the gradient."""

import pytest
import torch

from gtnorm.triton import config
from gtnorm.triton.ops import _column_sum
from tests.conftest import DEVICE


@pytest.fixture(params=["kernel", "default"])
def min_rows(request, monkeypatch):
    """Short partials go to torch's sum by default; "kernel" sends every size through the Triton kernel."""
    if request.param == "kernel":
        monkeypatch.setattr(config, "_COLUMN_SUM_MIN_ROWS", 1)


# Row counts around the tile height (64 rows of 64 columns) and the programs' blocks; columns that do not
# fill a power of two.
@pytest.mark.parametrize("n_rows", [0, 1, 63, 64, 65, 1000] + ([300_000] if DEVICE.type == "cuda" else []))
@pytest.mark.parametrize("n_cols", [1, 5, 64, 100])
def test_column_sum_matches_torch(n_rows, n_cols, min_rows):
    rows = torch.randn(n_rows, n_cols, dtype=torch.float64)
    expected = rows.sum(dim=0)
    result = _column_sum(rows.to(device=DEVICE, dtype=torch.float32))
    assert result.shape == (n_cols,) and result.dtype == torch.float32
    torch.testing.assert_close(result.double().cpu(), expected, rtol=1e-5, atol=1e-5 * (n_rows**0.5 + 1))


def test_column_sum_is_bitwise_reproducible(min_rows):
    rows = torch.randn(5000, 64, device=DEVICE)
    assert torch.equal(_column_sum(rows), _column_sum(rows.clone()))
