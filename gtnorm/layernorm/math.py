"""Per-row LayerNorm math as ``@triton.jit`` helpers (torch.nn.LayerNorm: mean-centred, biased variance),
shared by the graph-transformer kernels, which call them on Q/K rows they have already loaded.

All helpers work on fp32 tiles of any rank; ``AXIS`` is the (constexpr) axis being normalised, the last one.
Padding lanes of x hold 0 (loads use ``other=0``), so they add nothing to the statistics' sums; x - mean is -mean
there, so x_hat is masked, and the affine output is 0 there only through a weight and bias that are 0 on those lanes.
"""

import triton
import triton.language as tl

FLOAT32_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def _zero_padding_lanes(centred, n_cols, AXIS: tl.constexpr):
    """centred with the lanes past n_cols along AXIS (the last axis), where x - mean is -mean, set to 0. Padding rows
    need nothing (a row of 0 has mean 0), so the mask is the channels' alone: where n_cols is a constexpr equal to
    the tile's width (the backward kernels are specialised on the head dim) the compiler drops the select."""
    tl.static_assert(AXIS == len(centred.shape) - 1, "padding lanes are masked along the last axis")
    return tl.where(tl.arange(0, centred.shape[AXIS]) < n_cols, centred, 0.0)


@triton.jit
def layer_norm_stats(x, n_cols, eps, AXIS: tl.constexpr):
    """(mean, rstd) of x along AXIS (the last axis), each kept as a size-1 axis so it broadcasts against x; padding
    lanes (past n_cols) and padding rows of x must hold 0.

    Two passes: the mean, then the variance of the centred row. The one-pass form (var = E[x^2] - mean^2, which
    lets both sums reduce at once) was 3-4 % faster forward+backward but lost a few fp32 ulp times mean^2 / var:
    on the GPU the q and k gradients of fp32 runs came out ~10x further from float64 than the PyG path's (up to
    1.5e-5 relative against 4e-7, benchmarks/NOTES.md v9), so the dependent reduction stays.
    """
    mean = tl.sum(x, axis=AXIS, keep_dims=True) / n_cols
    centred = _zero_padding_lanes(x - mean, n_cols, AXIS)
    var = tl.sum(centred * centred, axis=AXIS, keep_dims=True) / n_cols
    # Finite even for an all-zero row with eps = 0 (a padding head): it then normalises to 0, not to 0 * inf.
    return mean, tl.minimum(tl.rsqrt(var + eps), FLOAT32_MAX)


@triton.jit
def layer_norm_normalized(x, mean, rstd, n_cols, AXIS: tl.constexpr):
    """x_hat = (x - mean) * rstd, 0 on padding lanes (also where rstd is infinite there, e.g. eps = 0)."""
    return _zero_padding_lanes((x - mean) * rstd, n_cols, AXIS)


@triton.jit
def layer_norm_affine(x, mean, rstd, w, b):
    """x_hat * w + b, unmasked: 0 on padding lanes where w and b are 0 there; a padding row (x = 0) comes out as b."""
    return (x - mean) * rstd * w + b


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
