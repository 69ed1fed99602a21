"""gtnorm.layer_norm / gtnorm.layernorm.LayerNorm (Triton kernels) against torch.nn.LayerNorm.

Accuracy is the relative Frobenius error against torch.nn.LayerNorm run in float64 on the same inputs (the
low-precision inputs, parameters and upstream gradient upcast), with the same parameters and eps:
- float32: 1e-5 for y, dx, dw and db;
- float16/bfloat16: at most 2x torch.nn.LayerNorm's own error in that dtype against the same float64 reference
  (4x for bfloat16 under the Triton interpreter, which rounds float32 to bfloat16 by truncation), plus 1e-3.
Every output and scratch buffer starts as NaN (POISON_OUTPUTS), so an element the kernels forget to write fails.
"""

from __future__ import annotations

import pytest
import torch

from gtnorm import _runtime
from gtnorm._runtime import interpreter_active
from gtnorm.layernorm import LayerNorm, layer_norm
from gtnorm.layernorm import functional as layer_norm_functional
from tests.conftest import DEVICE, HAS_CUDA
from tests.graphs import rel_error

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (x shape, normalized_shape): [N, C], [N, H, C], [B, N, H, C], odd C, several normalised dims.
SHAPES = [((13, 7), (7,)), ((6, 4, 33), (33,)), ((2, 5, 3, 100), (100,)), ((40, 64), (64,)), ((3, 2, 5, 6), (5, 6))]
GPU_SHAPES = [((4096, 64), (64,)), ((2, 512, 8, 128), (128,)), ((777, 1024), (1024,)), ((37, 3, 5000), (5000,))]
AFFINE = [(True, True), (True, False), (False, False)]
FLOAT32_TOL = 1e-5
LOW_PRECISION_FLOOR = 1e-3


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    monkeypatch.setattr(_runtime, "POISON_OUTPUTS", True)


def make_pair(normalized_shape, dtype, device, *, weight=True, bias=True, eps=1e-5):
    """(gtnorm LayerNorm, torch.nn.LayerNorm) holding the same random parameters (far from ones and zeros)."""
    kwargs = dict(eps=eps, elementwise_affine=weight, bias=bias, device=device, dtype=dtype)
    ours, theirs = LayerNorm(normalized_shape, **kwargs), torch.nn.LayerNorm(normalized_shape, **kwargs)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn(p.shape, dtype=torch.float64).to(dtype) * 0.5 + (1.0 if p is theirs.weight else 0.0))
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def forward_backward(module: torch.nn.Module, x: torch.Tensor, grad_y: torch.Tensor) -> dict:
    """{name: tensor} of y, dx and every parameter's gradient, on a leaf copy of x."""
    x = x.detach().clone().requires_grad_()
    y = module(x)
    params = dict(module.named_parameters())
    grads = torch.autograd.grad(y, [x, *params.values()], grad_y.to(y.dtype))
    # rsplit: a torch.compile'd module names them _orig_mod.weight, ...
    names = [f"d{name.rsplit('.', 1)[-1]}" for name in params]
    return {"y": y, "dx": grads[0], **dict(zip(names, grads[1:], strict=True))}


def float64_reference(theirs: torch.nn.LayerNorm, x, grad_y) -> dict:
    reference = torch.nn.LayerNorm(
        theirs.normalized_shape, eps=theirs.eps, elementwise_affine=theirs.weight is not None,
        bias=theirs.bias is not None, dtype=torch.float64,
    )  # fmt: skip
    reference.load_state_dict({k: v.double().cpu() for k, v in theirs.state_dict().items()})
    return forward_backward(reference, x.double().cpu(), grad_y.double().cpu())


def check_against_torch(shape, normalized_shape, dtype, *, weight=True, bias=True, eps=1e-5):
    ours, theirs = make_pair(normalized_shape, dtype, DEVICE, weight=weight, bias=bias, eps=eps)
    x = (torch.randn(shape, device=DEVICE) + 0.5).to(dtype)  # a nonzero mean, so centring matters
    grad_y = torch.randn(shape, device=DEVICE).to(dtype)
    results = forward_backward(ours, x, grad_y)
    expected = float64_reference(theirs, x, grad_y)
    torch_results = forward_backward(theirs, x, grad_y)
    param_grads = {name for name, present in (("dweight", weight), ("dbias", bias)) if present}
    assert results.keys() == expected.keys() == {"y", "dx"} | param_grads
    factor = 4.0 if dtype == torch.bfloat16 and interpreter_active() else 2.0
    for name, actual in results.items():
        assert actual.dtype == dtype and actual.shape == expected[name].shape, name
        error = rel_error(actual, expected[name])
        if dtype == torch.float32:
            assert error < FLOAT32_TOL, (name, error)
        else:
            torch_error = rel_error(torch_results[name], expected[name])
            assert error <= factor * torch_error + LOW_PRECISION_FLOOR, (name, error, torch_error)


@pytest.mark.parametrize("affine", AFFINE, ids=lambda a: f"weight{int(a[0])}-bias{int(a[1])}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,normalized_shape", SHAPES, ids=str)
def test_matches_torch_layernorm(shape, normalized_shape, dtype, affine):
    check_against_torch(shape, normalized_shape, dtype, weight=affine[0], bias=affine[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,normalized_shape", GPU_SHAPES, ids=str)
def test_matches_torch_layernorm_large(shape, normalized_shape, dtype):
    check_against_torch(shape, normalized_shape, dtype)


def test_eps_is_used():
    """Rows of tiny spread make eps a visible part of the variance."""
    ours, theirs = make_pair((16,), torch.float32, DEVICE, eps=0.1)
    x = 1e-2 * torch.randn(9, 16, device=DEVICE)
    assert rel_error(ours(x), theirs(x)) < FLOAT32_TOL
    theirs.eps = 1e-5
    assert rel_error(ours(x), theirs(x)) > 1e-2  # the test can tell them apart


def test_loops_over_row_blocks_with_a_partial_tail(monkeypatch):
    """More row blocks than programs, the last one partial: every program walks several blocks."""
    real_config = layer_norm_functional.layer_norm_launch_config

    def few_programs(*args, **kwargs):
        cfg = real_config(*args, **kwargs)
        return type(cfg)(block_m=4, block_c=cfg.block_c, num_warps=cfg.num_warps, n_programs=3)

    monkeypatch.setattr(layer_norm_functional, "layer_norm_launch_config", few_programs)
    check_against_torch((45, 20), (20,), torch.float32)


def test_parameter_dtypes_may_differ_from_input(device):
    x = torch.randn(10, 24, device=device, dtype=torch.bfloat16)
    weight = (1 + 0.5 * torch.randn(24, device=device)).requires_grad_()
    bias = torch.randn(24, device=device, dtype=torch.float16).requires_grad_()
    y = layer_norm(x, 24, weight, bias)
    assert y.dtype == torch.bfloat16
    dw, db = torch.autograd.grad(y.float().sum(), (weight, bias))
    assert dw.dtype == torch.float32 and db.dtype == torch.float16
    expected = torch.nn.functional.layer_norm(x.double(), (24,), weight.double(), bias.double())
    assert rel_error(y, expected) < 1e-2


def test_empty_input(device):
    x = torch.randn(0, 3, 8, device=device, requires_grad=True)
    weight, bias = torch.ones(8, device=device, requires_grad=True), torch.zeros(8, device=device, requires_grad=True)
    y = layer_norm(x, 8, weight, bias)
    dx, dw, db = torch.autograd.grad(y, (x, weight, bias), torch.ones_like(y))
    assert y.shape == dx.shape == (0, 3, 8)
    assert torch.equal(dw, torch.zeros(8, device=device)) and torch.equal(db, torch.zeros(8, device=device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_backward_is_bitwise_deterministic(device, dtype):
    ours, _ = make_pair((64,), dtype, device)
    x = torch.randn(3000, 64, device=device, dtype=dtype)
    grad_y = torch.randn_like(x)
    first = forward_backward(ours, x, grad_y)
    for _ in range(3):
        again = forward_backward(ours, x, grad_y)
        assert all(torch.equal(again[name], first[name]) for name in first)


def test_state_dict_round_trip_both_ways():
    ours, theirs = make_pair((12,), torch.float32, "cpu")
    assert ours.state_dict().keys() == theirs.state_dict().keys() == {"weight", "bias"}
    fresh = torch.nn.LayerNorm(12)
    fresh.load_state_dict(ours.state_dict())
    assert torch.equal(fresh.weight, theirs.weight) and torch.equal(fresh.bias, theirs.bias)
    assert repr(ours).endswith(repr(theirs)[len("LayerNorm") :])


def test_module_float64_falls_back_to_torch():
    """float64 (which the kernels do not take) runs torch's own LayerNorm instead of raising."""
    ours, theirs = make_pair((8,), torch.float64, DEVICE)
    x = torch.randn(5, 8, dtype=torch.float64, device=DEVICE)
    assert torch.equal(ours(x), theirs(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_module_refuses_negative_eps(dtype):
    with pytest.raises(ValueError, match="eps must be non-negative"):
        LayerNorm(8, eps=-1e-6)
    norm = LayerNorm(8).to(DEVICE, dtype)
    norm.eps = -1e-6  # set after construction: refused when it would be used, on either path
    with pytest.raises(ValueError, match="eps must be non-negative"):
        norm(torch.randn(3, 8, dtype=dtype, device=DEVICE))


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(bias=torch.zeros(5)), ValueError, "bias must have shape"),
        (dict(bias=torch.zeros(8, dtype=torch.float64)), TypeError, "bias must be float16"),
        (dict(bias=[0.0] * 8), TypeError, "bias must be a torch.Tensor"),
        (dict(weight=torch.ones(7)), ValueError, "weight must have shape"),
        (dict(eps=-1.0), ValueError, "eps must be non-negative"),
    ],
    ids=["bias_shape", "bias_dtype", "bias_type", "weight_shape", "negative_eps"],
)
def test_bad_input(monkeypatch, kwargs, error, match):
    def no_launch(*args, **kwargs):
        raise AssertionError("a kernel ran before the input was checked")

    monkeypatch.setattr(layer_norm_functional, "layer_norm_forward_kernel", no_launch)
    with pytest.raises(error, match=match):
        layer_norm(torch.randn(3, 8), 8, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("affine", AFFINE, ids=lambda a: f"weight{int(a[0])}-bias{int(a[1])}")
def test_opcheck(device, dtype, affine):
    x = torch.randn(11, 20, device=device, dtype=dtype, requires_grad=True)
    weight = (1 + torch.randn(20, device=device, dtype=dtype)).requires_grad_() if affine[0] else None
    bias = torch.randn(20, device=device, dtype=dtype).requires_grad_() if affine[1] else None
    torch.library.opcheck(torch.ops.gtnorm.layer_norm_forward.default, (x, weight, bias, 1e-5))
    grad_y = torch.randn(11, 20, device=device, dtype=dtype)
    weight, bias = [p.detach() if p is not None else None for p in (weight, bias)]
    torch.library.opcheck(torch.ops.gtnorm.layer_norm_backward.default, (grad_y, x.detach(), weight, bias, 1e-5))


def _compiled_matches_eager(backend, device, dtype, shape, dynamic=None):
    module, _ = make_pair(shape[-1], dtype, device)
    compiled = torch.compile(module, fullgraph=True, backend=backend, dynamic=dynamic)
    for rows in (shape[0], shape[0] + 3):  # a second size: a recompile, or the dynamic graph reused
        x = torch.randn(rows, *shape[1:], device=device, dtype=dtype)
        grad_y = torch.randn(rows, *shape[1:], device=device, dtype=dtype)
        expected = forward_backward(module, x, grad_y)
        for name, actual in forward_backward(compiled, x, grad_y).items():
            assert torch.equal(actual, expected[name]), name


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


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU path without the interpreter")
def test_functional_needs_triton(monkeypatch):
    monkeypatch.setattr(layer_norm_functional, "check_triton_device", _raise_no_triton)
    with pytest.raises(RuntimeError, match="no Triton"):
        layer_norm(torch.randn(3, 8), 8)


def _raise_no_triton(device, what):
    raise RuntimeError(f"{what}: no Triton on {device}")
