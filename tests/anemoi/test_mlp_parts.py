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


def test_under_autocast_the_forward_is_the_modules_and_the_backward_as_accurate():
    """Under autocast (CPU, bf16) the op uses the modules' dtypes and kernels: the output is theirs bitwise. Its
    gradients sum the parts' low-precision GEMMs in fp32, so they are not theirs bitwise: against float64, no
    worse than 1.5x the modules' own error under the same autocast."""
    norm, mlp = _modules("cpu", torch.float32)
    x = torch.randn(300, CHANNELS, requires_grad=True)
    params = [*norm.parameters(), *mlp.parameters()]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, actual = mlp(norm(x)), mlp_in_parts(x, norm, mlp, 64)
    assert actual.dtype == expected.dtype == torch.bfloat16
    assert torch.equal(actual, expected)
    grad = torch.randn_like(expected)
    norm64, mlp64 = _modules("cpu")
    norm64.load_state_dict(norm.state_dict()), mlp64.load_state_dict(mlp.state_dict())
    x64 = x.detach().double().requires_grad_()
    exact = _grads(mlp64(norm64(x64)), x64, [*norm64.parameters(), *mlp64.parameters()], grad.double())
    for a, e, ex in zip(_grads(actual, x, params, grad), _grads(expected, x, params, grad), exact, strict=True):
        assert a.dtype == e.dtype
        op_error, modules_error = (a.double() - ex).norm() / ex.norm(), (e.double() - ex).norm() / ex.norm()
        assert op_error <= 1.5 * modules_error + 1e-7, (op_error.item(), modules_error.item())


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


def test_the_op_passes_torch_s_op_checks(device):
    norm, mlp = _modules(device)
    first, _, second = mlp.mlp
    x = torch.randn(23, CHANNELS, dtype=torch.float64, device=device, requires_grad=True)
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
