"""The Launcher (gtnorm/triton/launcher.py): its key separates exactly the calls Triton specialises apart, and a
launch from its cache runs the same binary as Triton's own path."""

from __future__ import annotations

import itertools

import pytest
import torch
import triton
import triton.language as tl
from triton.backends.compiler import BaseBackend

from gtnorm._runtime import TRITON_VERSION
from gtnorm.triton.launcher import DIRECT_LAUNCH_MIN_TRITON, Launcher, specialization_key
from tests.conftest import DEVICE, HAS_CUDA

DIRECT = TRITON_VERSION >= DIRECT_LAUNCH_MIN_TRITON


def _sample_arguments() -> list:
    base = torch.zeros(64, dtype=torch.float32)
    tensors = [base, base[1:], base[4:], base.to(torch.float16), base.to(torch.float16)[8:], base.to(torch.float16)[1:]]
    tensors += [base.to(torch.bfloat16), base.to(torch.int32)[2:], base.to(torch.int64), base.to(torch.int64)[1:]]
    ints = [0, 1, 2, 15, 16, 17, 32, -1, -16, 2**31 - 1, 2**31, 2**31 + 16, -(2**31), -(2**31) - 1, 2**63 - 16]
    ints += [2**63, 2**64 - 16]
    return tensors + ints + [0.0, 1.0, 0.5, True, False]


@pytest.mark.skipif(not DIRECT, reason="this triton's launches always take its own path")
def test_key_separates_what_triton_specialises_apart():
    """Equal keys exactly where Triton's own specialiser (that of the installed version) gives equal results: a
    key that merged two of its classes would launch a binary compiled for another kind of argument."""
    from triton.runtime.jit import native_specialize_impl

    samples = _sample_arguments()
    triton_spec = [native_specialize_impl(BaseBackend, a, False, True, True) for a in samples]
    keys = [specialization_key(a) for a in samples]
    rows = list(zip(samples, triton_spec, keys, strict=True))
    for (a, spec_a, key_a), (b, spec_b, key_b) in itertools.combinations(rows, 2):
        assert (key_a == key_b) == (spec_a == spec_b), (a, b, spec_a, spec_b)


@triton.jit
def _scaled_copy_kernel(src_ptr, dst_ptr, n, scale, OFFSET: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask) * scale + OFFSET, mask=mask)


def _launch_and_check(launcher, src, n, scale=2.0, offset=1, block=32):
    dst = torch.full_like(src, float("nan"))
    launcher[(triton.cdiv(n, block),)](src, dst, n, scale, OFFSET=offset, BLOCK=block)
    expected = src[:n] * scale + offset
    torch.testing.assert_close(dst[:n], expected, rtol=0, atol=0)


def test_launches_as_triton_does(monkeypatch):
    """Every kind of argument the key tells apart, launched in turn (aligned then misaligned, n = 1, n a multiple
    of 16, other constexprs and dtypes): each gives Triton's result."""
    launcher = Launcher(_scaled_copy_kernel)
    base = torch.randn(200, device=DEVICE)
    for src, n in [(base, 100), (base[1:], 100), (base[4:], 96), (base, 1), (base[3:], 1), (base, 160)]:
        _launch_and_check(launcher, src, n)
        _launch_and_check(launcher, src, n)  # again: from the cache where there is one
    _launch_and_check(launcher, base, 100, offset=3, block=64)
    _launch_and_check(launcher, base.half(), 100, scale=0.5)
    _launch_and_check(launcher, base.half()[1:], 100, scale=0.5)


@pytest.mark.skipif(not (HAS_CUDA and DIRECT), reason="interpreted or older triton: every launch takes its path")
def test_cached_launches_skip_tritons_path(monkeypatch):
    launcher = Launcher(_scaled_copy_kernel)
    base = torch.randn(200, device=DEVICE)
    calls = []
    run = _scaled_copy_kernel.run
    monkeypatch.setattr(_scaled_copy_kernel, "run", lambda *a, **k: calls.append(1) or run(*a, **k))
    for _ in range(3):
        _launch_and_check(launcher, base, 100)
    assert len(calls) == 1
    _launch_and_check(launcher, base[1:], 100)  # misaligned: another key, Triton's path once
    _launch_and_check(launcher, base[1:], 100)
    assert len(calls) == 2
    launcher.clear()
    _launch_and_check(launcher, base, 100)
    assert len(calls) == 3


@pytest.mark.skipif(not (HAS_CUDA and DIRECT), reason="interpreted or older triton: every launch takes its path")
def test_run_time_arguments_by_name_take_tritons_path(monkeypatch):
    """A run-time argument passed by name is never frozen into a cached launch (nor kept alive by the cache)."""
    launcher = Launcher(_scaled_copy_kernel)
    calls = []
    run = _scaled_copy_kernel.run
    monkeypatch.setattr(_scaled_copy_kernel, "run", lambda *a, **k: calls.append(1) or run(*a, **k))
    base = torch.randn(200, device=DEVICE)
    for _ in range(3):  # the same arguments each time: a cached launch would skip Triton's path from the second on
        dst = torch.full_like(base, float("nan"))
        launcher[(4,)](base, dst, n=100, scale=2.0, OFFSET=0, BLOCK=32)
        torch.testing.assert_close(dst[:100], base[:100] * 2.0, rtol=0, atol=0)
    assert len(calls) == 3


@pytest.mark.skipif(not HAS_CUDA, reason="the interpreter has no compiled binaries")
def test_launch_hooks_take_tritons_path(monkeypatch):
    """A profiler's launch hook sees every launch."""
    launcher = Launcher(_scaled_copy_kernel)
    base = torch.randn(200, device=DEVICE)
    _launch_and_check(launcher, base, 100)
    seen = []
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda metadata: seen.append(1))
    _launch_and_check(launcher, base, 100)
    _launch_and_check(launcher, base, 100)
    assert len(seen) == 2


@pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs")
def test_cached_launch_is_captured_by_a_cuda_graph():
    launcher = Launcher(_scaled_copy_kernel)
    src = torch.randn(100, device=DEVICE)
    dst = torch.zeros_like(src)
    launcher[(4,)](src, dst, 100, 3.0, OFFSET=0, BLOCK=32)  # compiled and cached before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launcher[(4,)](src, dst, 100, 3.0, OFFSET=0, BLOCK=32)
    src.copy_(torch.randn_like(src))
    dst.zero_()
    graph.replay()
    torch.testing.assert_close(dst, src * 3.0, rtol=0, atol=0)


def test_older_triton_takes_its_own_path(monkeypatch):
    """Below DIRECT_LAUNCH_MIN_TRITON every launch goes through kernel[grid] (whose calling convention differs)."""
    from gtnorm.triton import launcher as launcher_module

    monkeypatch.setattr(launcher_module, "TRITON_VERSION", (3, 3))
    launcher = Launcher(_scaled_copy_kernel)
    calls = []
    run = _scaled_copy_kernel.run
    monkeypatch.setattr(_scaled_copy_kernel, "run", lambda *a, **k: calls.append(1) or run(*a, **k))
    base = torch.randn(200, device=DEVICE)
    for _ in range(3):
        _launch_and_check(launcher, base, 100)
    assert len(calls) == 3
