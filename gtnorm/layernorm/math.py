"""Per-row LayerNorm math as ``@triton.jit`` helpers (torch.nn.LayerNorm: mean-centred, biased variance),
shared by the graph-transformer kernels, which call them on Q/K rows they have already loaded.

All helpers work on fp32 tiles of any rank; ``AXIS`` is the (constexpr) axis being normalised and ``mask`` marks
the real lanes. Unlike RMSNorm's sums, the centred row x - mean is not 0 on padding lanes (it is -mean there),
so it is masked before it enters the variance, and the normalised row is masked before it enters any sum.
"""

import triton
import triton.language as tl


@triton.jit
def layer_norm_stats(x, mask, n_cols, eps, AXIS: tl.constexpr):
    """(mean, rstd) of x along AXIS, each kept as a size-1 axis so it broadcasts against x. Padding lanes of x
    must hold 0 (load with ``other=0``)."""
    mean = tl.sum(x, axis=AXIS, keep_dims=True) / n_cols
    centred = tl.where(mask, x - mean, 0.0)
    var = tl.sum(centred * centred, axis=AXIS, keep_dims=True) / n_cols
    return mean, tl.rsqrt(var + eps)


@triton.jit
def layer_norm_normalized(x, mean, rstd, mask):
    """x_hat = (x - mean) * rstd, 0 on padding lanes (also where rstd is infinite there, e.g. eps = 0)."""
    return tl.where(mask, (x - mean) * rstd, 0.0)


@triton.jit
def layer_norm_backward(x_hat, rstd, w, dy, mask, n_cols, AXIS: tl.constexpr):
    """dx of y = x_hat * w + b given dy (= dL/dy), with x_hat and rstd from the forward.

    The parameters' gradient contributions of these rows are dy * x_hat (weight) and dy (bias); callers sum
    them over their rows themselves, so that they control the order of the reduction.
    """
    g = tl.where(mask, dy * w, 0.0)
    mean_g = tl.sum(g, axis=AXIS, keep_dims=True) / n_cols
    mean_gx = tl.sum(g * x_hat, axis=AXIS, keep_dims=True) / n_cols
    return (g - mean_g - x_hat * mean_gx) * rstd
