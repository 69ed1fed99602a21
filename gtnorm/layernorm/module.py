"""``LayerNorm``: torch.nn.LayerNorm running the Triton kernels wherever they can run."""

from __future__ import annotations

import torch
from torch import Tensor

from gtnorm._runtime import SUPPORTED_DTYPES, triton_can_run_on
from gtnorm.layernorm.functional import layer_norm


class LayerNorm(torch.nn.LayerNorm):
    """Drop-in torch.nn.LayerNorm: same constructor, ``weight`` and ``bias`` parameters, state_dict and repr, so
    weights move between the two both ways. ``forward`` runs the Triton kernels when they can run on the input's
    device (CUDA, or CPU under the Triton interpreter) and dtypes (float16, bfloat16, float32), and torch's own
    forward otherwise (e.g. float64), which computes the same. A negative eps is refused on every path.

    Shapes:
        x: [*, *normalized_shape]; weight, bias: normalized_shape; output: x's shape and dtype.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _check_eps(self.eps)

    def forward(self, x: Tensor) -> Tensor:  # [*, *normalized_shape] -> the same
        _check_eps(self.eps)  # eps is a plain attribute: it may have been set after construction
        params_ok = all(p is None or p.dtype in SUPPORTED_DTYPES for p in (self.weight, self.bias))
        if triton_can_run_on(x.device) and x.dtype in SUPPORTED_DTYPES and params_ok:
            return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return super().forward(x)


def _check_eps(eps) -> None:
    if not eps >= 0.0:
        raise ValueError(f"LayerNorm eps must be non-negative, got {eps}")
