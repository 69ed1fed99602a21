"""How the harness measures: median time, peak memory of one call, copy bandwidth and the HBM floor.

On a GPU times come from CUDA events (``triton.testing.do_bench``: warm-up, L2 flush between calls, median).
On the CPU, where Triton runs through its interpreter, a plain ``time.perf_counter`` loop stands in; those
numbers only show that the harness works.
"""

from __future__ import annotations

import gc
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch
import triton.testing

T = TypeVar("T")

MIB = 2**20


@dataclass
class Measurement:
    """One variant in one mode (forward, or forward+backward). ``status`` is "ok", "OOM" (or "OOM: predicted ..."
    where it was not run), "crash: ...", "error: ..." or "skipped: ..."; the numbers are None unless it is "ok"
    (memory is None on the CPU as well)."""

    status: str = "ok"
    ms: float | None = None
    peak_mib: float | None = None  # torch.cuda.max_memory_allocated during one call: inputs included
    extra_mib: float | None = None  # that peak minus what was allocated just before the call (inputs, dO, ...)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class TimingSettings:
    warmup_ms: float = 25.0  # GPU: do_bench's warm-up budget
    rep_ms: float = 100.0  # GPU: do_bench's measuring budget (it picks the number of calls from it)
    # GPU: at least this many timed calls, the budget raised where rep_ms would allow fewer. do_bench times
    # rep_ms / (one call's time) calls: 2 for a 25 ms step in a 50 ms budget, whose median is then the mean of two
    # host-bound steps, each of which the shared host can slow by up to 2x (benchmarks/NOTES.md, v23).
    min_calls: int = 1
    cpu_reps: int = 1  # CPU: timed calls (no warm-up)


@dataclass(frozen=True)
class Settings:
    """One run of the graph benchmark: what every graph is measured with."""

    dtype: torch.dtype
    heads: int
    channels: int
    eps: float
    variants: tuple[str, ...]
    timing: TimingSettings
    check: bool
    peer_paths: dict = field(default_factory=dict)  # peer variant -> the path its kernel loads from


# Messages of CUDA errors that leave the process's CUDA context unusable (every later kernel fails too).
CRASH_MARKERS = ("illegal memory access", "misaligned address", "device-side assert", "unspecified launch failure",
                 "an illegal instruction")  # fmt: skip


def is_crash(status: str) -> bool:
    return status.startswith("crash")


def guarded(fn: Callable[[], T]) -> tuple[T | None, str]:
    """(fn(), "ok"), or (None, why) when it raises, so that one failing variant does not end the run: running
    out of GPU memory gives "OOM" (also when torch.compile wraps it), a CUDA error that poisons the context (an
    illegal memory access, ...) "crash: <message>", anything else "error: <type>: <message>"."""
    try:
        return fn(), "ok"
    except Exception as exc:  # noqa: BLE001 - any failure is a result to report
        if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower():
            return None, oom_status(str(exc))
        message = (str(exc).strip().splitlines() or [""])[0][:200]
        if any(marker in str(exc).lower() for marker in CRASH_MARKERS):
            return None, f"crash: {type(exc).__name__}: {message}"
        return None, f"error: {type(exc).__name__}: {message}"


def oom_status(message: str) -> str:
    """ "OOM", with what the allocator said where it said it: the request and what torch held at the time
    ("OOM: 12.6 GiB asked, 70.1 GiB allocated")."""
    asked = re.search(r"Tried to allocate ([\d.]+ [KMG]iB)", message)
    held = re.search(r"([\d.]+ [KMG]iB) is allocated by PyTorch", message)
    if asked is None or held is None:
        return "OOM"
    return f"OOM: {asked.group(1)} asked, {held.group(1)} allocated"


def free_memory() -> None:
    """Gives back what the last variant left (cached blocks, compiled graphs' buffers) before the next one."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def clear_grads(tensors: Sequence[torch.Tensor]) -> None:
    for t in tensors:
        t.grad = None


def measure_call(
    fn: Callable[[], object], device: torch.device, settings: TimingSettings, leaves: Sequence[torch.Tensor]
) -> Measurement:
    """Time and peak memory of ``fn``, or why there are none ("OOM", "error: ..."). ``leaves`` are the tensors
    that receive gradients: set to None before every call, so that forward+backward is timed without the
    accumulation into existing .grad tensors, and after the last one, so no gradient outlives the measurement.
    """

    def measure() -> Measurement:
        if device.type != "cuda":
            # The interpreter compiles nothing worth leaving out, and each call takes seconds: no warm-up.
            return Measurement("ok", _cpu_median_ms(fn, settings.cpu_reps, leaves))
        fn()  # Triton and torch.compile compile here; errors surface before anything is timed
        peak, extra = _peak_memory_mib(fn, device, leaves)
        return Measurement("ok", _gpu_median_ms(fn, settings, leaves), peak, extra)

    measured, status = guarded(measure)
    clear_grads(leaves)
    return measured if measured is not None else Measurement(status)


def retime_call(
    fn: Callable[[], object], device: torch.device, settings: TimingSettings, leaves: Sequence[torch.Tensor]
) -> float | None:
    """measure_call's time alone, for another round of a call already measured (warm); None if it fails now."""
    if device.type != "cuda":
        ms = _cpu_median_ms(fn, settings.cpu_reps, leaves)
    else:
        ms, _ = guarded(lambda: _gpu_median_ms(fn, settings, leaves))
    clear_grads(leaves)
    return ms


def interleaved_cpu_medians_ms(
    calls: dict[str, Callable[[], object]], rounds: int, leaves: Sequence[torch.Tensor] = ()
) -> dict[str, float]:
    """{name: median ms} of CPU calls timed in turn: one untimed call of each first (first-call set-up), then
    ``rounds`` rounds of one call each. Taking turns gives every call the same share of whatever else the
    machine runs, so the forward is not timed in a quiet minute and forward+backward in a busy one."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(rounds + 1):
        for name, fn in calls.items():
            clear_grads(leaves)
            start = time.perf_counter()
            fn()
            if round_:
                times[name].append(time.perf_counter() - start)
    clear_grads(leaves)
    return {name: 1e3 * statistics.median(values) for name, values in times.items()}


def _gpu_median_ms(fn: Callable[[], object], settings: TimingSettings, leaves: Sequence[torch.Tensor]) -> float:
    rep_ms = settings.rep_ms
    if settings.min_calls > 1:
        # Two calls estimate the budget that buys min_calls calls (do_bench estimates from five, then divides).
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(2):
            clear_grads(leaves)
            fn()
        torch.cuda.synchronize()
        rep_ms = max(rep_ms, settings.min_calls * (time.perf_counter() - start) / 2 * 1e3)
    return triton.testing.do_bench(
        fn, warmup=settings.warmup_ms, rep=rep_ms, grad_to_none=list(leaves), return_mode="median"
    )


def _cpu_median_ms(fn: Callable[[], object], reps: int, leaves: Sequence[torch.Tensor] = ()) -> float:
    times = []
    for _ in range(max(reps, 1)):
        clear_grads(leaves)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _peak_memory_mib(
    fn: Callable[[], object], device: torch.device, leaves: Sequence[torch.Tensor]
) -> tuple[float, float]:
    """(peak, extra) MiB of one call: the allocator's high-water mark, and that mark minus the memory already
    allocated before the call (the inputs, dO, the layout, ...)."""
    clear_grads(leaves)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    clear_grads(leaves)
    return peak / MIB, (peak - before) / MIB


def copy_bandwidth(device: torch.device) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting the bytes read plus the bytes written.

    A 1 GiB copy on the GPU (far past L2, so it measures HBM); 64 MiB on the CPU. Median of several copies.
    """
    nbytes = 2**30 if device.type == "cuda" else 64 * MIB
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy = lambda: dst.copy_(src)
    copy()  # first touch of dst's pages
    if device.type == "cuda":
        ms = triton.testing.do_bench(copy, warmup=25, rep=200, return_mode="median")
    else:
        ms = _cpu_median_ms(copy, reps=5)
    return 2 * nbytes / (ms * 1e-3)


def hbm_floor_bytes(layout, row_bytes: int) -> tuple[int, int]:
    """Bytes the op cannot avoid moving, every tensor it reads or writes once: (forward, forward + backward).

    ``layout`` is the graph's gtnorm.GraphLayout; ``row_bytes`` = H * C * element size (one node's or edge's
    features).
    forward:  read q [N_dst], k, v [N_src], e [M]; write out [N_dst]; read the by-destination index arrays.
    backward: read q, dO [N_dst], k, v [N_src], e [M]; write dq [N_dst], dk, dv [N_src], de [M]; read the index
              arrays of both orders (by destination, by source).
    The norm weights ([C]) and per-row statistics are negligible next to these and left out. Gathering k, v (and
    q, dO in the backward) once per edge rather than once per node is extra traffic the floor ignores: the L2
    cache decides how much of it reaches HBM.
    """
    nbytes = lambda *tensors: sum(t.numel() * t.element_size() for t in tensors)
    by_destination = nbytes(*layout.by_dst.tensors())
    by_source = nbytes(*layout.by_src.tensors())
    n_src, n_dst, n_edges = layout.num_src, layout.num_dst, layout.num_edges
    forward = (2 * n_dst + 2 * n_src + n_edges) * row_bytes + by_destination
    backward = (3 * n_dst + 4 * n_src + 2 * n_edges) * row_bytes + by_destination + by_source
    return forward, forward + backward


def relative_error(actual: torch.Tensor, expected: torch.Tensor, chunk_rows: int = 2**16) -> float:
    """‖actual − expected‖ / ‖expected‖, summed in fp64 over row chunks: no full-size fp64 copy of a multi-GB
    edge tensor is ever made."""
    diff_sq = ref_sq = 0.0
    for a, e in zip(actual.split(chunk_rows), expected.split(chunk_rows), strict=True):
        a, e = a.double(), e.double()
        diff_sq += float((a - e).square().sum())
        ref_sq += float(e.square().sum())
    if ref_sq == 0.0:
        return 0.0 if diff_sq == 0.0 else float("inf")
    return (diff_sq / ref_sq) ** 0.5
