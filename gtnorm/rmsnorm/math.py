"""Per-row RMSNorm math as ``@triton.jit`` helpers, shared by the standalone RMSNorm kernels and by the
graph-transformer kernels, which call them on Q/K values they have already loaded.

All helpers work on fp32 tiles of any rank; ``AXIS`` is the (constexpr) axis being normalised. Lanes past the
real row length must hold 0 (load with ``other=0``): they then add nothing to the sums and come out as 0.
"""

import triton
import triton.language as tl


@triton.jit
def rms_norm_rstd(x, n_cols, eps, AXIS: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) along AXIS, kept as a size-1 axis so it broadcasts against x."""
    mean_sq = tl.sum(x * x, axis=AXIS, keep_dims=True) / n_cols
    return tl.rsqrt(mean_sq + eps)


@triton.jit
def rms_norm_forward(x, w, n_cols, eps, AXIS: tl.constexpr):
    """Returns (x * rstd * w, rstd). ``w`` broadcasts along AXIS (pass 1.0 for no affine weight)."""
    rstd = rms_norm_rstd(x, n_cols, eps, AXIS)
    return x * rstd * w, rstd


@triton.jit
def rms_norm_backward(x, rstd, w, dy, n_cols, AXIS: tl.constexpr):
    """dx of y = x * rstd * w given dy (= dL/dy), with rstd from the forward.

    The weight's gradient contribution of these rows is dy * x * rstd; callers sum it over their rows
    themselves, so that they control the order of the reduction.
    """
    x_hat = x * rstd
    g = dy * w
    mean_gx = tl.sum(g * x_hat, axis=AXIS, keep_dims=True) / n_cols
    return (g - x_hat * mean_gx) * rstd
