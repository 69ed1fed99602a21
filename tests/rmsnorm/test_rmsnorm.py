"""gtnorm.rms_norm / gtnorm.RMSNorm (Triton kernels) against torch.nn.RMSNorm.

Accuracy is the relative Frobenius error against torch.nn.RMSNorm run in float64 on the same inputs (the
low-precision inputs, weight and upstream gradient upcast), with the same weight and the same eps; eps=None
is resolved by gtnorm._runtime.resolve_eps for the input dtype, and torch's own run in the low-precision
dtype gets that resolved eps explicitly (see test_eps_none_matches_torch for why):
- float32: 1e-5 for y, dx and dw (measured 2e-8 to 3e-7);
- float16/bfloat16: at most 2x torch.nn.RMSNorm's own error in that dtype against the same float64
  reference, plus 1e-3 (a quarter of bfloat16's unit roundoff) for tensors where torch's error happens to be
  tiny. Measured: float16 equals torch's error (ratio 1.00). Under the Triton interpreter, which converts
  float32 to bfloat16 by truncation instead of round-to-nearest (so about twice the rounding error, up to
  3.3x torch's on the smallest CPU tensors), the bfloat16 factor is 4 instead.
Every output and scratch buffer starts as NaN (POISON_OUTPUTS), so an element the kernels forget to write
fails the finiteness checks.
"""

from __future__ import annotations

import pytest
import torch

import gtnorm
from gtnorm import _runtime
from gtnorm._runtime import interpreter_active, resolve_eps
from gtnorm.rmsnorm import functional
from gtnorm.rmsnorm.config import MAX_FUSED_COLS, RMSNormLaunchConfig, rms_norm_launch_config
from tests.conftest import DEVICE, HAS_CUDA
from tests.graphs import rel_error

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (x shape, normalized_shape): [N, C], [N, H, C], [B, N, H, C], odd C, several normalised dims.
SHAPES = [
    ((13, 7), (7,)),
    ((6, 4, 33), (33,)),
    ((2, 5, 3, 100), (100,)),
    ((40, 64), (64,)),
    ((3, 2, 5, 6), (5, 6)),
]
GPU_SHAPES = [
    ((4096, 64), (64,)),
    ((2, 512, 8, 128), (128,)),
    ((777, 1024), (1024,)),
    ((300, 4096), (4096,)),
    ((37, 3, 5000), (5000,)),
]
FLOAT32_TOL = 1e-5
LOW_PRECISION_FLOOR = 1e-3


def low_precision_factor(dtype) -> float:
    return 4.0 if dtype == torch.bfloat16 and interpreter_active() else 2.0


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    monkeypatch.setattr(_runtime, "POISON_OUTPUTS", True)



def random_weight(normalized_shape, dtype) -> torch.Tensor:
    """Far from the init of ones, so a kernel that ignores the weight (or its layout) fails."""
    return (1.0 + 0.5 * torch.randn(normalized_shape, dtype=torch.float64)).to(dtype)


def forward_backward(module: torch.nn.Module, x: torch.Tensor, grad_y: torch.Tensor):
    """(y, dx, dw or None) of module on a leaf copy of x."""
    x = x.detach().clone().requires_grad_()
    y = module(x)
    params = [module.weight] if module.weight is not None else []
    grads = torch.autograd.grad(y, [x, *params], grad_y.to(y.dtype))
    return y, grads[0], grads[1] if params else None


def make_pair(normalized_shape, eps, dtype, device, *, affine=True):
    """(gtnorm.RMSNorm, torch.nn.RMSNorm) holding the same random weight, both in dtype on device."""
    ours = gtnorm.RMSNorm(normalized_shape, eps=eps, elementwise_affine=affine, device=device, dtype=dtype)
    theirs = torch.nn.RMSNorm(normalized_shape, eps=eps, elementwise_affine=affine, device=device, dtype=dtype)
    if affine:
        with torch.no_grad():
            theirs.weight.copy_(random_weight(normalized_shape, dtype))
        ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def float64_reference(theirs: torch.nn.RMSNorm, x, grad_y):
    """torch.nn.RMSNorm with the same weight and eps, in float64 on the CPU."""
    reference = torch.nn.RMSNorm(
        theirs.normalized_shape, eps=theirs.eps, elementwise_affine=theirs.weight is not None, dtype=torch.float64
    )
    if theirs.weight is not None:
        reference.load_state_dict({"weight": theirs.weight.detach().double().cpu()})
    return forward_backward(reference, x.double().cpu(), grad_y.double().cpu())


def check_against_torch(shape, normalized_shape, dtype, eps, *, affine=True):
    ours, theirs = make_pair(normalized_shape, eps, dtype, DEVICE, affine=affine)
    # torch resolves eps=None differently from its docs (test_eps_none_matches_torch): give it gtnorm's.
    theirs.eps = resolve_eps(eps, dtype)
    x = torch.randn(shape, device=DEVICE).to(dtype)
    grad_y = torch.randn(shape, device=DEVICE).to(dtype)
    results = forward_backward(ours, x, grad_y)
    expected = float64_reference(theirs, x, grad_y)
    torch_results = forward_backward(theirs, x, grad_y)
    y, dx, dw = results
    assert y.dtype == dtype and y.shape == x.shape
    assert dx.dtype == dtype and dx.shape == x.shape
    if affine:
        assert dw.dtype == dtype and dw.shape == normalized_shape
    else:
        assert dw is None
    for name, actual, want, torch_actual in zip(("y", "dx", "dw"), results, expected, torch_results, strict=True):
        if want is None:
            continue
        error = rel_error(actual, want)
        if dtype == torch.float32:
            assert error < FLOAT32_TOL, (name, error)
        else:
            torch_error = rel_error(torch_actual, want)
            bound = low_precision_factor(dtype) * torch_error + LOW_PRECISION_FLOOR
            assert error <= bound, (name, error, torch_error)


@pytest.mark.parametrize("eps", [1e-5, None], ids=["eps1e-5", "eps_none"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,normalized_shape", SHAPES, ids=str)
def test_matches_torch_rmsnorm(shape, normalized_shape, dtype, eps):
    check_against_torch(shape, normalized_shape, dtype, eps)


@pytest.mark.gpu
@pytest.mark.parametrize("eps", [1e-6, None], ids=["eps1e-6", "eps_none"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,normalized_shape", GPU_SHAPES, ids=str)
def test_matches_torch_rmsnorm_large(shape, normalized_shape, dtype, eps):
    check_against_torch(shape, normalized_shape, dtype, eps)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_eps_none_matches_torch(dtype):
    """gtnorm.RMSNorm(eps=None) against torch.nn.RMSNorm(eps=None) as torch actually runs it (the float32
    epsilon, also for 16-bit inputs), on rows with an RMS of 0.05, where eps=finfo(bfloat16).eps would change
    the output by half."""
    ours, theirs = make_pair((32,), None, dtype, DEVICE)
    x = (0.05 * torch.randn(16, 32, device=DEVICE)).to(dtype)
    tolerance = FLOAT32_TOL if dtype == torch.float32 else 2e-2
    assert rel_error(ours(x), theirs(x)) < tolerance


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_without_affine_weight(dtype):
    check_against_torch((3, 4, 33), (33,), dtype, None, affine=False)


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_affine"])
def test_loops_over_row_blocks_with_a_partial_tail(monkeypatch, affine):
    """Tiny tiles and more programs than row blocks: every program loops, the last block is partial, and
    programs with no rows still write a zero partial row for the weight gradient."""
    for n_programs in (3, 12):
        monkeypatch.setattr(
            functional,
            "rms_norm_launch_config",
            lambda n_rows, n_cols, dtype, device, backward=False, n=n_programs: RMSNormLaunchConfig(
                block_m=2, block_c=8, num_warps=4, n_programs=n
            ),
        )
        check_against_torch((17, 7), (7,), torch.float32, 1e-6, affine=affine)


def test_rstd_of_the_forward_op(device):
    x = torch.randn(37, 20, device=device, dtype=torch.bfloat16)
    eps = 1e-6
    y, rstd = torch.ops.gtnorm.rms_norm_forward(x, None, eps)
    assert rstd.dtype == torch.float32 and rstd.shape == (37,)
    expected = torch.rsqrt(x.double().pow(2).mean(-1) + eps)
    assert rel_error(rstd, expected) < 1e-6


def test_weight_dtype_may_differ_from_input(device):
    """As in torch: a float32 weight with bfloat16 x gives a bfloat16 y and a float32 dw."""
    x = torch.randn(9, 3, 40, device=device, dtype=torch.bfloat16).requires_grad_()
    weight = random_weight(40, torch.float32).to(device).requires_grad_()
    grad_y = torch.randn(9, 3, 40, device=device, dtype=torch.bfloat16)
    y = gtnorm.rms_norm(x, 40, weight)
    dx, dw = torch.autograd.grad(y, (x, weight), grad_y)
    assert y.dtype == torch.bfloat16 and dx.dtype == torch.bfloat16 and dw.dtype == torch.float32
    x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    y64 = torch.nn.functional.rms_norm(x64, (40,), w64, resolve_eps(None, torch.bfloat16))
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), grad_y.double())
    assert rel_error(y, y64) < 5e-3
    assert rel_error(dx, dx64) < 5e-3
    assert rel_error(dw, dw64) < 1e-5  # summed in fp32 from bf16 inputs, never rounded to bf16


def test_functional_matches_module_and_takes_int_shape(device):
    x = torch.randn(4, 5, 24, device=device)
    weight = random_weight(24, torch.float32).to(device)
    module = gtnorm.RMSNorm(24, eps=1e-6, device=device)
    module.load_state_dict({"weight": weight})
    assert torch.equal(gtnorm.rms_norm(x, 24, weight, 1e-6), module(x))
    assert torch.equal(gtnorm.rms_norm(x, (24,), weight, 1e-6), gtnorm.rms_norm(x, torch.Size([24]), weight, 1e-6))


@pytest.mark.parametrize(
    "make_x",
    [
        lambda device: torch.randn(12, 6, 10, device=device).transpose(0, 1),  # leading dims permuted
        lambda device: torch.randn(10, 7 * 2, device=device)[:, ::2],  # strided rows
        lambda device: torch.randn(9, 8, device=device).t(),  # the normalised dim itself strided
    ],
    ids=["transposed", "strided", "strided_last_dim"],
)
def test_non_contiguous_input(device, make_x):
    # Made on the device: a copy from another device would come out contiguous.
    x = make_x(device).requires_grad_()
    assert not x.is_contiguous()
    n_cols = x.shape[-1]
    weight = random_weight(n_cols, torch.float32).to(device).requires_grad_()
    y = gtnorm.rms_norm(x, n_cols, weight, 1e-6)
    grad_y = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, (x, weight), grad_y)
    x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    y64 = torch.nn.functional.rms_norm(x64, (n_cols,), w64, 1e-6)
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), grad_y.double())
    for actual, expected in ((y, y64), (dx, dx64), (dw, dw64)):
        assert rel_error(actual, expected) < FLOAT32_TOL


@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 3, 8)], ids=str)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_affine"])
def test_empty_input(device, shape, affine):
    module = gtnorm.RMSNorm(8, elementwise_affine=affine, device=device)
    x = torch.randn(shape, device=device).requires_grad_()
    y = module(x)
    assert y.shape == shape
    y.sum().backward()
    assert x.grad.shape == shape
    if affine:
        assert torch.equal(module.weight.grad, torch.zeros(8, device=device))


def _backward_results(x, weight, grad_y):
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    y = gtnorm.rms_norm(x, x.shape[-1], weight)
    return (y, *torch.autograd.grad(y, (x, weight), grad_y))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_backward_is_bitwise_deterministic(device, dtype):
    n_rows, n_cols = (300_000, 64) if HAS_CUDA else (600, 33)
    cfg = rms_norm_launch_config(n_rows, n_cols, dtype, device, backward=True)
    assert 1 < cfg.n_programs < triton_cdiv(n_rows, cfg.block_m), "the test must span programs that loop"
    x = torch.randn(n_rows, n_cols, device=device, dtype=dtype)
    weight = random_weight(n_cols, dtype).to(device)
    grad_y = torch.randn(n_rows, n_cols, device=device, dtype=dtype)
    first = _backward_results(x, weight, grad_y)
    for _ in range(2):
        again = _backward_results(x, weight, grad_y)
        for name, a, b in zip(("y", "dx", "dw"), first, again, strict=True):
            assert torch.equal(a, b), name


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def test_state_dict_round_trip_both_ways():
    theirs = torch.nn.RMSNorm((3, 5), eps=1e-5)
    with torch.no_grad():
        theirs.weight.copy_(random_weight((3, 5), torch.float32))
    ours = gtnorm.RMSNorm((3, 5), eps=1e-5)
    assert isinstance(ours, torch.nn.RMSNorm)
    assert repr(ours) == repr(theirs)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict())
    assert torch.equal(ours.weight, theirs.weight)
    back = torch.nn.RMSNorm((3, 5), eps=1e-5)
    back.load_state_dict(ours.state_dict())
    assert torch.equal(back.weight, theirs.weight)
    assert torch.equal(gtnorm.RMSNorm(7).weight, torch.ones(7))
    assert gtnorm.RMSNorm(7, elementwise_affine=False).state_dict() == {}


def test_module_uses_the_kernels_where_triton_runs(monkeypatch, device):
    calls = []

    def spy(*args, **kwargs):
        calls.append(args)
        return functional.rms_norm(*args, **kwargs)

    monkeypatch.setattr("gtnorm.rmsnorm.module.rms_norm", spy)
    gtnorm.RMSNorm(8, device=device)(torch.randn(3, 8, device=device))
    assert len(calls) == 1


def test_module_falls_back_to_torch_where_triton_cannot_run(monkeypatch):
    # Without the interpreter, CPU tensors cannot run Triton (true on a CUDA machine too).
    monkeypatch.setenv("TRITON_INTERPRET", "0")

    def must_not_run(*args, **kwargs):
        raise AssertionError("the Triton path ran")

    monkeypatch.setattr("gtnorm.rmsnorm.module.rms_norm", must_not_run)
    ours, theirs = make_pair((6,), 1e-6, torch.float32, "cpu")
    x = torch.randn(4, 3, 6)
    grad_y = torch.randn(4, 3, 6)
    for actual, expected in zip(forward_backward(ours, x, grad_y), forward_backward(theirs, x, grad_y), strict=True):
        assert torch.equal(actual, expected)


def test_functional_does_not_fall_back(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="gtnorm.rms_norm"):
        gtnorm.rms_norm(torch.randn(4, 6), 6)


# --- bad input: a clear error naming the argument, raised before any kernel launch --------------------------


@pytest.fixture
def no_launch(monkeypatch):
    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError("a kernel was launched")

    monkeypatch.setattr(functional, "rms_norm_forward_kernel", NoLaunch())
    monkeypatch.setattr(functional, "rms_norm_backward_kernel", NoLaunch())


def _x(*shape, dtype=torch.float32):
    return torch.randn(shape, device=DEVICE).to(dtype)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: gtnorm.rms_norm([1.0, 2.0], 2), TypeError, "x must be a torch.Tensor"),
        (lambda: gtnorm.rms_norm(_x(4, 8, dtype=torch.float64), 8), TypeError, "float16, bfloat16 or float32"),
        (lambda: gtnorm.rms_norm(_x(4, 8).to(torch.int32), 8), TypeError, "x must be float16"),
        (lambda: gtnorm.rms_norm(_x(4, 8), 7), ValueError, "normalized_shape"),
        (lambda: gtnorm.rms_norm(_x(4, 8), (4, 7)), ValueError, "normalized_shape"),
        (lambda: gtnorm.rms_norm(_x(8), (2, 8)), ValueError, "normalized_shape"),
        (lambda: gtnorm.rms_norm(_x(4, 8), ()), ValueError, "normalized_shape"),
        (lambda: gtnorm.rms_norm(_x(4, 8), 8.0), TypeError, "normalized_shape"),
        (lambda: gtnorm.rms_norm(_x(4, 8), "8"), TypeError, "normalized_shape"),
        (lambda: gtnorm.rms_norm(_x(1, MAX_FUSED_COLS + 1), MAX_FUSED_COLS + 1), ValueError, "normalized_shape"),
        (lambda: gtnorm.rms_norm(_x(4, 8), 8, _x(7)), ValueError, "weight must have shape"),
        (lambda: gtnorm.rms_norm(_x(4, 2, 4), (2, 4), _x(8)), ValueError, "weight must have shape"),
        (lambda: gtnorm.rms_norm(_x(4, 8), 8, _x(8, dtype=torch.float64)), TypeError, "weight must be float16"),
        (lambda: gtnorm.rms_norm(_x(4, 8), 8, [1.0] * 8), TypeError, "weight must be a torch.Tensor"),
        (lambda: gtnorm.rms_norm(_x(4, 8), 8, torch.ones(8, device="meta")), ValueError, "weight is on meta"),
        (lambda: gtnorm.rms_norm(_x(4, 8), 8, None, -1e-6), ValueError, "eps"),
        (lambda: gtnorm.RMSNorm(8, device=DEVICE)(_x(4, 7)), ValueError, "normalized_shape"),
    ],
    ids=[
        "x_not_tensor", "x_float64", "x_int", "shape_mismatch", "shape_mismatch_2d", "shape_longer_than_x",
        "shape_empty", "shape_float", "shape_str", "row_too_long", "weight_shape", "weight_shape_flat",
        "weight_float64", "weight_not_tensor", "weight_device", "eps_negative", "module_shape",
    ],
)  # fmt: skip
def test_bad_input(no_launch, call, error, match):
    with pytest.raises(error, match=match):
        call()


# --- torch.library integration ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_affine"])
def test_opcheck(device, dtype, affine):
    x = torch.randn(11, 20, device=device, dtype=dtype, requires_grad=True)
    weight = random_weight(20, dtype).to(device).requires_grad_() if affine else None
    torch.library.opcheck(torch.ops.gtnorm.rms_norm_forward.default, (x, weight, 1e-6))
    _, rstd = torch.ops.gtnorm.rms_norm_forward(x.detach(), weight, 1e-6)
    grad_y = torch.randn(11, 20, device=device, dtype=dtype)
    weight = weight.detach() if affine else None
    torch.library.opcheck(torch.ops.gtnorm.rms_norm_backward.default, (grad_y, x.detach(), weight, rstd))


def _compiled_matches_eager(backend, device, dtype, shape, dynamic=None):
    module = gtnorm.RMSNorm(shape[-1], device=device, dtype=dtype)
    with torch.no_grad():
        module.weight.copy_(random_weight(shape[-1], dtype))
    compiled = torch.compile(module, fullgraph=True, backend=backend, dynamic=dynamic)
    for rows in (shape[0], shape[0] + 3):  # a second size: a recompile, or the dynamic graph reused
        x = torch.randn(rows, *shape[1:], device=device, dtype=dtype)
        grad_y = torch.randn(rows, *shape[1:], device=device, dtype=dtype)
        compiled_results = forward_backward(compiled, x, grad_y)
        for actual, expected in zip(compiled_results, forward_backward(module, x, grad_y), strict=True):
            assert torch.equal(actual, expected)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_traces_with_torch_compile_fullgraph(device, dynamic):
    """Dynamo + AOTAutograd through the custom ops (no Inductor, so it runs on the CPU too)."""
    torch._dynamo.reset()
    _compiled_matches_eager("aot_eager", device, torch.float32, (2, 3, 16), dynamic)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_torch_compile_fullgraph_inductor(dtype):
    torch._dynamo.reset()
    _compiled_matches_eager("inductor", DEVICE, dtype, (4, 128, 8, 64))


def test_module_float64_falls_back_to_torch():
    """float64 (which the kernels do not take) runs torch's own RMSNorm instead of raising."""
    norm = gtnorm.RMSNorm(8, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(8, dtype=torch.float64))
    x = torch.randn(5, 8, dtype=torch.float64, device=DEVICE)
    expected = torch.nn.functional.rms_norm(x, (8,), norm.weight.to(DEVICE), 1e-6)
    assert torch.equal(norm.to(DEVICE)(x), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_module_refuses_negative_eps(dtype):
    with pytest.raises(ValueError, match="eps must be non-negative"):
        gtnorm.RMSNorm(8, eps=-1e-6)
    norm = gtnorm.RMSNorm(8).to(DEVICE, dtype)
    norm.eps = -1e-6  # set after construction: refused when it would be used, on either path
    with pytest.raises(ValueError, match="eps must be non-negative"):
        norm(torch.randn(3, 8, dtype=dtype, device=DEVICE))
