"""gtnorm/anemoi/mlp_parts.py: the mapper block's destination MLP in row parts as one op (compiled blocks)."""

from __future__ import annotations

import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

import torch  # noqa: E402
from anemoi.models.layers.mlp import MLP  # noqa: E402
from anemoi.utils.config import DotDict  # noqa: E402
from torch import nn  # noqa: E402

from gtnorm.anemoi import mlp_parts  # noqa: E402
from gtnorm.anemoi.mlp_parts import fits_mlp_op, mlp_in_parts  # noqa: E402

KERNELS = DotDict({"Linear": nn.Linear, "LayerNorm": nn.LayerNorm, "Activation": nn.GELU})
CHANNELS, HIDDEN = 16, 64


def _modules(device, dtype=torch.float64, **norm_options):
    norm = nn.LayerNorm(CHANNELS, **norm_options)
    mlp = MLP(CHANNELS, HIDDEN, CHANNELS, layer_kernels=KERNELS, layer_norm=False)
    norm, mlp = norm.to(device, dtype), mlp.to(device, dtype)
    with torch.no_grad():  # away from LayerNorm's initial 1 and 0, so that a wrong use of them shows
        for p in norm.parameters():
            p.normal_()
    return norm, mlp


_NAMES = ["norm weight", "norm bias", "weight1", "bias1", "weight2", "bias2"]


def _grads(y, x, params, grad):
    return torch.autograd.grad(y, [x, *params], grad)


@pytest.mark.parametrize("norm_options", [{}, {"elementwise_affine": False}, {"bias": False}])
def test_matches_the_modules_in_float64(norm_options, device):
    """Output and every gradient those of mlp(norm(x)), parts of 10 rows for 53 (the last one short)."""
    norm, mlp = _modules(device, **norm_options)
    assert fits_mlp_op(norm, mlp)
    x = torch.randn(53, CHANNELS, dtype=torch.float64, device=device, requires_grad=True)
    params = [*norm.parameters(), *mlp.parameters()]
    expected = mlp(norm(x))
    grad = torch.randn_like(expected)
    actual = mlp_in_parts(x, norm, mlp, 10)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    for a, e in zip(_grads(actual, x, params, grad), _grads(expected, x, params, grad), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_as_accurate_as_the_modules(dtype, device):
    """In fp32 and under bf16 autocast the op's LayerNorm is gtnorm's row kernel (fp32 math), its GEMMs and GELU
    torch's in the modules' dtypes: its output and every gradient, against float64, no further than 2.5x the
    modules' own error in the same dtypes. The op rounds at other places (the norm's output straight to bf16, the
    parts' GEMMs summed in fp32), so its error is another draw of the same size: over 40 seeds the largest ratio
    was 1.75 (the norm weight's gradient)."""
    norm, mlp = _modules(device, torch.float32)
    x = torch.randn(300, CHANNELS, device=device, requires_grad=True)
    params = [*norm.parameters(), *mlp.parameters()]
    with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        expected, actual = mlp(norm(x)), mlp_in_parts(x, norm, mlp, 64)
    assert actual.dtype == expected.dtype
    grad = torch.randn_like(expected)
    norm64, mlp64 = _modules(device)
    norm64.load_state_dict(norm.state_dict()), mlp64.load_state_dict(mlp.state_dict())
    x64 = x.detach().double().requires_grad_()
    exact_out = mlp64(norm64(x64))
    exact = [exact_out, *_grads(exact_out, x64, [*norm64.parameters(), *mlp64.parameters()], grad.double())]
    actuals = [actual, *_grads(actual, x, params, grad)]
    expecteds = [expected, *_grads(expected, x, params, grad)]
    for name, a, e, ex in zip(["out", "x", *_NAMES], actuals, expecteds, exact, strict=True):
        assert a.dtype == e.dtype, name
        op_error, modules_error = (a.double() - ex).norm() / ex.norm(), (e.double() - ex).norm() / ex.norm()
        assert op_error <= 2.5 * modules_error + 1e-6, (name, op_error.item(), modules_error.item())


def count_parts(monkeypatch) -> list[int]:
    """The rows of every part the op computes, forward or again in its backward (mlp_parts._part_activations),
    appended as they run."""
    rows, part_activations = [], mlp_parts._part_activations

    def counted(part, *args, **kwargs):
        rows.append(part.shape[0])
        return part_activations(part, *args, **kwargs)

    monkeypatch.setattr(mlp_parts, "_part_activations", counted)
    return rows


def test_backward_is_deterministic_and_runs_part_by_part(monkeypatch, device):
    """Two backwards are bitwise equal; the forward computes each part once, the backward recomputes each once."""
    norm, mlp = _modules(device, torch.float32)
    x = torch.randn(45, CHANNELS, device=device, requires_grad=True)
    params = [*norm.parameters(), *mlp.parameters()]
    calls = count_parts(monkeypatch)
    y = mlp_in_parts(x, norm, mlp, 20)
    grad = torch.randn_like(y)
    first = _grads(y, x, params, grad)
    assert calls == [20, 20, 5, 20, 20, 5]
    second = _grads(mlp_in_parts(x, norm, mlp, 20), x, params, grad)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])  # torch's LayerNorm, then gtnorm's kernels
def test_the_op_passes_torch_s_op_checks(dtype, device):
    norm, mlp = _modules(device, dtype)
    first, _, second = mlp.mlp
    x = torch.randn(23, CHANNELS, dtype=dtype, device=device, requires_grad=True)
    args = (x, norm.weight, norm.bias, first.weight, first.bias, second.weight, second.bias, 7, norm.eps, "none", None)
    torch.library.opcheck(torch.ops.gtnorm.mlp_in_parts.default, args)


def test_other_modules_are_not_taken():
    """Only a torch LayerNorm over the channels, then Linear, GELU, Linear with no LayerNorm after."""
    norm, mlp = _modules("cpu")
    assert fits_mlp_op(norm, mlp)
    assert not fits_mlp_op(nn.RMSNorm(CHANNELS), mlp)
    assert not fits_mlp_op(nn.LayerNorm([2, CHANNELS]), mlp)
    assert not fits_mlp_op(norm, MLP(CHANNELS, HIDDEN, CHANNELS, layer_kernels=KERNELS, layer_norm=True))
    assert not fits_mlp_op(norm, MLP(CHANNELS, HIDDEN, CHANNELS, layer_kernels=KERNELS, n_extra_layers=1))
    silu = DotDict({**KERNELS, "Activation": nn.SiLU})
    assert not fits_mlp_op(norm, MLP(CHANNELS, HIDDEN, CHANNELS, layer_kernels=silu, layer_norm=False))
