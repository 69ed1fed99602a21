"""gtnorm/anemoi/output_head.py: the decoder's output head (LayerNorm, Linear) as one op."""

from __future__ import annotations

import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

import torch  # noqa: E402
from torch import nn  # noqa: E402

from gtnorm.anemoi.output_head import fits_output_head, output_head  # noqa: E402

CHANNELS, OUTPUTS = 48, 7


def _head(device, dtype=torch.float64, **norm_options) -> nn.Sequential:
    head = nn.Sequential(nn.LayerNorm(CHANNELS, **norm_options), nn.Linear(CHANNELS, OUTPUTS)).to(device, dtype)
    with torch.no_grad():  # away from LayerNorm's initial 1 and 0, so that a wrong use of them shows
        for p in head[0].parameters():
            p.normal_()
    return head


def _grads(y, x, params, grad):
    return torch.autograd.grad(y, [x, *params], grad)


@pytest.mark.parametrize("norm_options", [{}, {"elementwise_affine": False}, {"bias": False}])
def test_matches_the_modules_in_float64(norm_options, device):
    head = _head(device, **norm_options)
    assert fits_output_head(head)
    x = torch.randn(53, CHANNELS, dtype=torch.float64, device=device, requires_grad=True)
    params = list(head.parameters())
    expected = head(x)
    grad = torch.randn_like(expected)
    actual = output_head(x, head)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    for a, e in zip(_grads(actual, x, params, grad), _grads(expected, x, params, grad), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("dtype", "autocast"), [(torch.float32, None), (torch.float16, torch.float16),
                                                 (torch.float32, torch.bfloat16)])  # fmt: skip
def test_as_accurate_as_the_modules(dtype, autocast, device):
    """The op's LayerNorm is gtnorm's row kernel where Triton runs (fp32 math, its output in the GEMM's dtype),
    its GEMMs torch's in the modules' dtypes: its output and every gradient, against float64, no further than 2.5x
    the modules' own error in the same dtypes (another draw of the same size: the norm's output is rounded once,
    where the modules round an fp32 output)."""
    if dtype == torch.float16 and device.type == "cpu":
        pytest.skip("fp16 GEMMs on the CPU are not what this checks")
    head = _head(device, torch.float32)
    x = torch.randn(300, CHANNELS, device=device).to(dtype).requires_grad_()
    if dtype != torch.float32:
        head = head.to(dtype)
    params = list(head.parameters())
    with torch.autocast(device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        expected, actual = head(x), output_head(x, head)
    assert actual.dtype == expected.dtype
    grad = torch.randn_like(expected)
    head64 = _head(device)
    head64.load_state_dict(head.state_dict())
    x64 = x.detach().double().requires_grad_()
    exact_out = head64(x64)
    exact = [exact_out, *_grads(exact_out, x64, list(head64.parameters()), grad.double())]
    actuals = [actual, *_grads(actual, x, params, grad)]
    expecteds = [expected, *_grads(expected, x, params, grad)]
    for name, a, e, ex in zip(["out", "x", "norm weight", "norm bias", "weight", "bias"], actuals, expecteds, exact,
                              strict=True):  # fmt: skip
        assert a.dtype == e.dtype, name
        op_error, modules_error = (a.double() - ex).norm() / ex.norm(), (e.double() - ex).norm() / ex.norm()
        assert op_error <= 2.5 * modules_error + 1e-6, (name, op_error.item(), modules_error.item())


def test_backward_is_deterministic(device):
    head = _head(device, torch.float32)
    x = torch.randn(301, CHANNELS, device=device, requires_grad=True)
    grad = torch.randn(301, OUTPUTS, device=device)
    first = _grads(output_head(x, head), x, list(head.parameters()), grad)
    second = _grads(output_head(x, head), x, list(head.parameters()), grad)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])  # torch's LayerNorm, then gtnorm's kernels
def test_the_op_passes_torch_s_op_checks(dtype, device):
    norm, linear = _head(device, dtype)
    x = torch.randn(23, CHANNELS, dtype=dtype, device=device, requires_grad=True)
    args = (x, norm.weight, norm.bias, linear.weight, linear.bias, norm.eps, None)
    torch.library.opcheck(torch.ops.gtnorm.output_head.default, args)


def test_other_heads_are_not_taken():
    assert fits_output_head(_head("cpu"))
    assert not fits_output_head(nn.Sequential(nn.RMSNorm(CHANNELS), nn.Linear(CHANNELS, OUTPUTS)))
    assert not fits_output_head(nn.Sequential(nn.LayerNorm([2, CHANNELS]), nn.Linear(CHANNELS, OUTPUTS)))
    assert not fits_output_head(nn.Sequential(nn.Linear(CHANNELS, OUTPUTS)))
    assert not fits_output_head(nn.Sequential(nn.LayerNorm(CHANNELS), nn.Linear(CHANNELS, OUTPUTS), nn.GELU()))
    assert not fits_output_head(nn.Linear(CHANNELS, OUTPUTS))
