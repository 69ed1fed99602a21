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
def _lane_weights(n_cols, BLOCK: tl.constexpr):
    """1.0 on the real lanes (below n_cols) of a BLOCK-wide axis, 0.0 on padding lanes."""
    return tl.where(tl.arange(0, BLOCK) < n_cols, 1.0, 0.0)


@triton.jit
def _centred(x, mean, n_cols, AXIS: tl.constexpr):
    """x - mean on the real lanes along AXIS (the last axis), 0 on padding lanes, where x is 0 and x - mean would be
    -mean. Padding rows need nothing (a row of 0 has mean 0), so the lanes' own weights suffice. A multiply by them
    rather than a select: it fuses with the subtraction (one FMA per element instead of a subtract and a select, the
    forward kernel's n_cols being a run-time value, benchmarks/NOTES.md v12); where n_cols is a constexpr equal to the
    tile's width (the backward kernels) the weights are 1 and fold away."""
    tl.static_assert(AXIS == len(x.shape) - 1, "padding lanes are masked along the last axis")
    return x - mean * _lane_weights(n_cols, x.shape[AXIS])


@triton.jit
def _moments(x, n_cols, eps, AXIS: tl.constexpr):
    """(mean, centred row, rstd) of x along AXIS (the last axis); mean and rstd kept as a size-1 axis."""
    mean = tl.sum(x, axis=AXIS, keep_dims=True) / n_cols
    centred = _centred(x, mean, n_cols, AXIS)
    var = tl.sum(centred * centred, axis=AXIS, keep_dims=True) / n_cols
    # Finite even for an all-zero row with eps = 0 (a padding head): it then normalises to 0, not to 0 * inf.
    return mean, centred, tl.minimum(tl.rsqrt(var + eps), FLOAT32_MAX)


@triton.jit
def layer_norm_stats(x, n_cols, eps, AXIS: tl.constexpr):
    """(mean, rstd) of x along AXIS (the last axis), each kept as a size-1 axis so it broadcasts against x; padding
    lanes (past n_cols) and padding rows of x must hold 0.

    Two passes: the mean, then the variance of the centred row. The one-pass form (var = E[x^2] - mean^2, which
    lets both sums reduce at once) was 3-4 % faster forward+backward but lost a few fp32 ulp times mean^2 / var:
    on the GPU the q and k gradients of fp32 runs came out ~10x further from float64 than the PyG path's (up to
    1.5e-5 relative against 4e-7, benchmarks/NOTES.md v9), so the dependent reduction stays.
    """
    mean, _, rstd = _moments(x, n_cols, eps, AXIS)
    return mean, rstd


@triton.jit
def layer_norm_centred(x, n_cols, eps, AXIS: tl.constexpr):
    """(x - mean, 0 on padding lanes; rstd kept as a size-1 axis) along AXIS (the last axis): what a caller that
    applies the normalisation to a product rather than to the row itself needs (x_hat = centred * rstd)."""
    _, centred, rstd = _moments(x, n_cols, eps, AXIS)
    return centred, rstd


@triton.jit
def layer_norm_forward(x, w, b, n_cols, eps, AXIS: tl.constexpr):
    """x_hat * w + b along AXIS (the last axis), x_hat from the statistics' centred row (recomputing x - mean cost one
    more instruction per element of every gathered key). 0 on padding lanes where w and b are 0 there; padding rows
    of x must hold 0."""
    _, centred, rstd = _moments(x, n_cols, eps, AXIS)
    return centred * rstd * w + b


@triton.jit
def layer_norm_normalized(x, mean, rstd, n_cols, AXIS: tl.constexpr):
    """x_hat = (x - mean) * rstd, 0 on padding lanes (also where rstd is infinite there, e.g. eps = 0)."""
    return _centred(x, mean, n_cols, AXIS) * rstd


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
