"""``RMSNorm``: torch.nn.RMSNorm running the Triton kernels wherever they can run."""

from __future__ import annotations

import torch
from torch import Tensor

from gtnorm._runtime import SUPPORTED_DTYPES, triton_can_run_on
from gtnorm.rmsnorm.functional import rms_norm


class RMSNorm(torch.nn.RMSNorm):
    """Drop-in torch.nn.RMSNorm: same constructor, ``weight`` parameter, state_dict and repr, so weights move
    between the two both ways. ``forward`` runs the Triton kernels when they can run on the input's device
    (CUDA, or CPU under the Triton interpreter) and dtypes (float16, bfloat16, float32), and torch's own forward
    otherwise (e.g. float64), which computes the same. A negative eps is refused on every path.

    Shapes:
        x: [*, *normalized_shape]; weight: normalized_shape; output: x's shape and dtype.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _check_eps(self.eps)

    def forward(self, x: Tensor) -> Tensor:
        _check_eps(self.eps)  # eps is a plain attribute: it may have been set after construction
        weight_ok = self.weight is None or self.weight.dtype in SUPPORTED_DTYPES
        if triton_can_run_on(x.device) and x.dtype in SUPPORTED_DTYPES and weight_ok:
            return rms_norm(x, self.normalized_shape, self.weight, self.eps)
        return super().forward(x)


def _check_eps(eps) -> None:
    if eps is not None and not eps >= 0.0:
        raise ValueError(f"RMSNorm eps must be non-negative (or None), got {eps}")
