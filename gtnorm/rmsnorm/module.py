"""``RMSNorm``: torch.nn.RMSNorm running the Triton kernels wherever they can run."""

from __future__ import annotations

import torch
from torch import Tensor

from gtnorm._runtime import triton_can_run_on
from gtnorm.rmsnorm.functional import rms_norm


class RMSNorm(torch.nn.RMSNorm):
    """Drop-in torch.nn.RMSNorm: same constructor, ``weight`` parameter, state_dict and repr, so weights move
    between the two both ways. ``forward`` runs the Triton kernels when they can run on the input's device
    (CUDA, or CPU under the Triton interpreter) and torch's own forward otherwise, which computes the same.

    Shapes:
        weight: ``normalized_shape`` (with ``elementwise_affine=True``).
        forward: x [*, *normalized_shape] -> the same shape, in x's dtype.
    """

    def forward(self, x: Tensor) -> Tensor:  # [*, *normalized_shape] -> the same
        if triton_can_run_on(x.device):
            return rms_norm(x, self.normalized_shape, self.weight, self.eps)
        return super().forward(x)
