"""Where the GPU waits during the whole model's training step: the gaps between its kernels, each named by the
kernel that ends it and by what the host was running when that kernel was launched.

    python -m benchmarks.model.idle --graph o320_r6 --norm layer --mapper-chunks 4 --variant gtnorm/blocks
    python -m benchmarks.model.idle ... --call infer     # the inference call instead of the training step

A step's wall time is its kernels' time plus the GPU's idle time; benchmarks.model.profile prints both sums (at O320
with LayerNorm, v43: 11.6 ms of gtnorm's 307.6 ms step with no kernel running). Here the steps are profiled twice
(torch.profiler, read back from the Chrome trace it exports). First with the GPU's activity alone: the host runs
at its own speed, so the idle time is the step's, and each gap is named by the kernel after it. Then with the host's
ops recorded too, which costs the host time per op (at O320, v45: a 347 ms step against 305 ms unprofiled, and
gaps where the host then falls behind that the first pass does not have): each gap is named by the host's ops at
the launch of the kernel after it, and by what the host ran when the gap opened; launched after the GPU ran dry,
the host was late; launched before, the kernel waited on something else (a copy, an event). A host sync shows as a
gap that opens inside the op that syncs (v45: ``aten::copy_``, Anemoi's graph provider reading its node counts).
The encoder's, processor's and decoder's forwards run under labels of those names; gaps in the backward are named by
the autograd node that runs on the engine's thread (a checkpoint's recompute runs inside its node). Each gap also
has its place in the call (``at_us``: from the call's start, marked in the first pass by a one-cycle kernel the
host launches first, which the gaps and the busy time leave out), so that the first pass's gaps, named by kernels
only, can be placed beside the forward's module times (benchmarks.model.profile).

A sync shows as a gap only after the op that waits, and in that op's kernels' names, not its own (v47: Anemoi's
output bounding indexes with a CPU tensor, a blocking copy that the gaps showed as a short gap before a pageable
memcpy at the forward's end, while the host waited 12-17 ms a call). So each pass also lists the host's waits:
CUDA runtime and driver calls of at least ``--min-wait-us``, each named by the call and, in the traced pass, by the
host's ops around it, and placed in its call. A kernel launch that waits is the launch queue full (the host ahead
of the GPU by the queue's depth: no cost); any other long call is a sync or a blocking copy.
"""

from __future__ import annotations

import argparse
import bisect
import json
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.model.profile import MODULES, ModuleHooks, warmed_call
from benchmarks.model.run import add_case_arguments, case_of_arguments, git_commit

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
HOST_CATEGORIES = ("cpu_op", "user_annotation")
STEP_LABEL = "idle_probe_step"
STEP_MARKER = "spin_kernel("  # in the name of torch.cuda._sleep's kernel (at::cuda::...): launched at each call's start
_AUTOGRAD_NODE = "autograd::engine::evaluate_function: "


@dataclass(frozen=True)
class Gap:
    start_us: float  # when the GPU ran dry (trace clock)
    length_us: float
    host_late: bool  # the kernel after the gap was launched after the gap opened
    label: str  # what the host ran at that launch (enclosing_label)
    opened_in: str  # what the launching thread ran when the gap opened (enclosing_label)
    next_kernel: str  # the kernel (or copy) that ends the gap
    at_us: float | None = None  # start_us from the start of its call (None: before the first call's start)


def enclosing_label(stack: list[str]) -> str:
    """A launch's host stack (outermost first) as a short label: the module label, the autograd node and the
    innermost op, those that are present."""
    module = next((name for name in stack if name in MODULES), None)
    node = next((name[len(_AUTOGRAD_NODE) :] for name in reversed(stack) if name.startswith(_AUTOGRAD_NODE)), None)
    parts = [module, node, stack[-1] if stack else "(no op)"]
    return " > ".join(dict.fromkeys(part for part in parts if part))


def _stacks_at(intervals: list[tuple[float, float, str]], times: list[float]) -> list[list[str]]:
    """The names of the intervals (start, end, name: one thread's nested host ops) open at each of ``times``,
    outermost first, by one sweep over both in time order."""
    order = sorted(range(len(times)), key=times.__getitem__)
    intervals = sorted(intervals, key=lambda interval: (interval[0], -interval[1]))
    stacks: list[list[str]] = [[] for _ in times]
    open_intervals: list[tuple[float, float, str]] = []
    next_interval = 0
    for index in order:
        t = times[index]
        while next_interval < len(intervals) and intervals[next_interval][0] <= t:
            interval = intervals[next_interval]
            while open_intervals and open_intervals[-1][1] < interval[0]:
                open_intervals.pop()
            open_intervals.append(interval)
            next_interval += 1
        while open_intervals and open_intervals[-1][1] < t:
            open_intervals.pop()
        stacks[index] = [name for start, end, name in open_intervals if start <= t <= end]
    return stacks


def gaps_in_windows(
    events: list[dict], windows: list[tuple[float, float]], min_gap_us: float, start_times: list[float] | None = None
) -> tuple[float, list[Gap]]:
    """(the GPU's busy microseconds, its gaps of at least ``min_gap_us``) between each window's ends (trace clock),
    summed over the windows, from a Chrome trace's events. The GPU is busy where any kernel, copy or memset runs
    (streams merged); the time before a window's first kernel is a gap too (the host launching the step). Each gap's
    at_us counts from the latest of ``start_times`` (the calls' starts; default: the windows') before it; kernels
    whose names hold STEP_MARKER mark those starts and are neither busy time nor a gap's end."""
    activity = sorted(
        (event for event in events if event.get("cat") in GPU_CATEGORIES and STEP_MARKER not in event["name"]),
        key=lambda e: e["ts"],
    )
    starts = _sorted_starts(start_times, windows)
    launches = {
        event["args"]["correlation"]: event
        for event in events
        if event.get("cat") in LAUNCH_CATEGORIES and "correlation" in event.get("args", {})
    }
    busy, raw = 0.0, []
    for start, end in windows:
        busy_end = start
        for event in activity:
            if not start <= event["ts"] <= end:
                continue
            event_end = event["ts"] + event.get("dur", 0.0)
            if event["ts"] - busy_end >= min_gap_us:
                launch = launches.get(event.get("args", {}).get("correlation"))
                raw.append((busy_end, event["ts"] - busy_end, launch, event["name"]))
            busy += max(0.0, event_end - max(event["ts"], busy_end))
            busy_end = max(busy_end, event_end)
    host = _host_ops(events)
    by_thread = defaultdict(list)  # tid -> indices into raw
    for index, (_, _, launch, _) in enumerate(raw):
        if launch is not None:
            by_thread[launch["tid"]].append(index)
    labels = ["(launch not in the trace)"] * len(raw)
    opened_in = list(labels)
    for tid, indices in by_thread.items():
        times = [raw[index][2]["ts"] for index in indices] + [raw[index][0] for index in indices]
        stacks = _stacks_at(host[tid], times)
        for index, at_launch, at_open in zip(indices, stacks[: len(indices)], stacks[len(indices) :], strict=True):
            labels[index], opened_in[index] = enclosing_label(at_launch), enclosing_label(at_open)
    gaps = [
        Gap(gap_start, length, launch is not None and launch["ts"] > gap_start, label, opened, kernel,
            _since_latest(starts, gap_start))
        for (gap_start, length, launch, kernel), label, opened in zip(raw, labels, opened_in, strict=True)
    ]  # fmt: skip
    return busy, gaps


def _host_ops(events: list[dict]) -> dict[int, list[tuple[float, float, str]]]:
    """Each host thread's ops and ranges: (start, end, name)."""
    host = defaultdict(list)
    for event in events:
        if event.get("cat") in HOST_CATEGORIES and event.get("ph") == "X":
            host[event["tid"]].append((event["ts"], event["ts"] + event.get("dur", 0.0), event["name"]))
    return host


@dataclass(frozen=True)
class Wait:
    call: str  # the CUDA runtime or driver call: cudaStreamSynchronize, cudaMemcpyAsync, cudaLaunchKernel, ...
    length_us: float
    label: str  # what the host ran around it (enclosing_label)
    at_us: float | None = None  # its start from the start of its call


def host_waits(
    events: list[dict], windows: list[tuple[float, float]], min_wait_us: float, start_times: list[float] | None = None
) -> list[Wait]:
    """The CUDA runtime and driver calls of at least ``min_wait_us`` that start inside the windows (trace clock):
    where the host waited on the device (module docstring), each named by the host's ops around it and placed from
    the latest of ``start_times`` (default: the windows' starts) before it."""
    starts = _sorted_starts(start_times, windows)
    calls = [
        event
        for event in events
        if event.get("cat") in LAUNCH_CATEGORIES
        and event.get("dur", 0.0) >= min_wait_us
        and any(start <= event["ts"] <= end for start, end in windows)
    ]
    host = _host_ops(events)
    by_thread = defaultdict(list)
    for event in calls:
        by_thread[event.get("tid")].append(event)
    waits = []
    for tid, thread_calls in by_thread.items():
        stacks = _stacks_at(host.get(tid, []), [event["ts"] for event in thread_calls])
        waits += [
            Wait(event["name"], event["dur"], enclosing_label(stack), _since_latest(starts, event["ts"]))
            for event, stack in zip(thread_calls, stacks, strict=True)
        ]
    return sorted(waits, key=lambda wait: -wait.length_us)


def summarize_waits(waits: list[Wait], steps: int, top: int = 10) -> list[dict]:
    """Per-step ms of the host's waits by call and label, the largest first, with their places (ms)."""
    by_key: dict[str, list] = defaultdict(lambda: [0, 0.0, set()])
    for wait in waits:
        entry = by_key[f"{wait.call} in {wait.label}"]
        entry[0] += 1
        entry[1] += wait.length_us / 1e3
        if wait.at_us is not None:
            entry[2].add(round(wait.at_us / 1e3))
    ranked = sorted(by_key.items(), key=lambda item: -item[1][1])[:top]
    return [
        {"wait": key, "waits": count / steps, "ms": ms / steps, "at_ms": sorted(places)}
        for key, (count, ms, places) in ranked
    ]


def _sorted_starts(start_times: list[float] | None, windows: list[tuple[float, float]]) -> list[float]:
    """The calls' starts that places count from: ``start_times``, or else the windows' starts."""
    return sorted(start_times if start_times is not None else (start for start, _ in windows))


def _since_latest(starts: list[float], t: float) -> float | None:
    """t less the latest of the sorted ``starts`` not after it; None if there is none."""
    index = bisect.bisect_right(starts, t)
    return t - starts[index - 1] if index else None


def call_starts(events: list[dict]) -> list[float]:
    """When each profiled call started on the GPU: its STEP_MARKER kernel (the first pass launches one first)."""
    return sorted(event["ts"] for event in events if event.get("cat") == "kernel" and STEP_MARKER in event["name"])


def host_label(gap: Gap) -> str:
    """What the host ran at the launch after the gap, and before it what it ran when the gap opened where that
    differs ("that -> the launch's")."""
    return gap.label if gap.opened_in == gap.label else f"{gap.opened_in} -> {gap.label}"


def summarize(window_us: float, busy_us: float, gaps: list[Gap], steps: int, key=host_label, top: int = 20) -> dict:
    """Per-step ms: the wall, the GPU busy and idle time, the gaps found (host late or not) and the labels (``key``
    of a gap) whose gaps sum to the most."""
    by_label: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0, set()])  # count, ms, of which host late, places
    for gap in gaps:
        entry = by_label[key(gap)]
        entry[0] += 1
        entry[1] += gap.length_us / 1e3
        entry[2] += gap.length_us / 1e3 if gap.host_late else 0.0
        if gap.at_us is not None:
            entry[3].add(round(gap.at_us / 1e3))  # to the ms: the same place in every call counts once
    ranked = sorted(by_label.items(), key=lambda item: -item[1][1])[:top]
    return {
        "wall_ms": window_us / 1e3 / steps,
        "busy_ms": busy_us / 1e3 / steps,
        "idle_ms": (window_us - busy_us) / 1e3 / steps,
        "gaps": len(gaps) / steps,
        "gaps_ms": sum(gap.length_us for gap in gaps) / 1e3 / steps,
        "host_late_ms": sum(gap.length_us for gap in gaps if gap.host_late) / 1e3 / steps,
        "by_label": [
            {
                "label": label,
                "gaps": count / steps,
                "ms": ms / steps,
                "host_late_ms": late / steps,
                "at_ms": sorted(places),
            }
            for label, (count, ms, late, places) in ranked
        ],
        "longest": [asdict(gap) for gap in sorted(gaps, key=lambda gap: -gap.length_us)[:top]],
    }


def format_summary(name: str, s: dict, min_gap_us: float, traced: bool = True) -> str:
    """The summary as text; ``traced``: the host's ops were recorded, so whether it was late is known."""
    late = f", of which the host was late for {s['host_late_ms']:.1f}" if traced else ""
    lines = [
        f"{name}: call wall {s['wall_ms']:.1f} ms, GPU busy {s['busy_ms']:.1f}, idle {s['idle_ms']:.1f}; "
        f"{s['gaps']:.0f} gaps of >= {min_gap_us:g} us: {s['gaps_ms']:.1f} ms{late}",
        f"    {'gaps':>6s} {'ms':>7s} {'late ms':>8s}  {'at ms':<20s}  "
        + ("host at the launch after the gap" if traced else "kernel after the gap"),
    ]
    lines += [
        f"    {row['gaps']:6.1f} {row['ms']:7.2f} {row['host_late_ms']:8.2f}  {_places(row.get('at_ms', [])):<20s}  "
        f"{row['label'][:160]}"
        for row in s["by_label"]
    ]
    if s.get("host_waits"):
        lines.append(f"    host waits (runtime calls of >= {s['min_wait_us']:g} us; a launch waits on a full queue):")
        lines.append(f"    {'waits':>6s} {'ms':>7s}  {'at ms':<20s}  call in the host's ops")
        lines += [
            f"    {row['waits']:6.1f} {row['ms']:7.2f}  {_places(row['at_ms']):<20s}  {row['wait'][:160]}"
            for row in s["host_waits"]
        ]
    return "\n".join(lines)


def _places(at_ms: list[int], shown: int = 5) -> str:
    """Where in the call a label's gaps fall (ms from its start), the first few."""
    text = ",".join(str(ms) for ms in at_ms[:shown])
    return text + (",..." if len(at_ms) > shown else "")


class ModuleLabels(ModuleHooks):
    """record_function ranges around the forward of the model's encoder, processor and decoder."""

    def __init__(self, model: torch.nn.Module):
        self.open: dict[str, torch.autograd.profiler.record_function] = {}
        super().__init__(model)

    def before(self, name: str) -> None:
        self.open[name] = torch.autograd.profiler.record_function(name)
        self.open[name].__enter__()

    def after(self, name: str) -> None:
        self.open.pop(name).__exit__(None, None, None)


def _trace_events(prof: torch.profiler.profile) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())["traceEvents"]


CALLS = ("train", "infer")


def model_waits(
    events: list[dict], windows: list[tuple[float, float]], min_wait_us: float, steps: int, starts=None
) -> list[dict]:
    # cudaDeviceSynchronize left out: the probe's own torch.cuda.synchronize() after the calls; a model's syncs come
    # as stream syncs (item(), tolist(), a blocking copy) or as copies that wait.
    waits = [w for w in host_waits(events, windows, min_wait_us, starts) if w.call != "cudaDeviceSynchronize"]
    return summarize_waits(waits, steps)


def idle_of_case(case, steps: int, min_gap_us: float, call: str = "train", min_wait_us: float = 100.0) -> dict:
    """Profiles ``steps`` calls (the training step, or inference with ``call="infer"``) of a benchmarks.model Case
    (two unprofiled first) twice and summarises their gaps: "gpu_only", with the GPU's activity alone recorded (the
    host runs at its own speed; the calls back to back, each after a STEP_MARKER kernel, the wall from the host's
    clock), gaps named by the kernel after each; "traced", with the host's ops recorded too (which slows the host:
    the profiler's cost per op), gaps named by the host's ops. Both list the host's waits of at least
    ``min_wait_us`` (host_waits)."""
    if call not in CALLS:
        raise ValueError(f"call must be one of {CALLS}, got {call!r}")
    run = warmed_call(case, call)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            torch.cuda._sleep(1)  # STEP_MARKER: where the call starts on the GPU
            run()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - start) * 1e6
    events = _trace_events(prof)
    gpu_start = min((e["ts"] for e in events if e.get("cat") in GPU_CATEGORIES), default=0.0)
    window, starts = [(gpu_start, float("inf"))], call_starts(events)
    busy, gaps = gaps_in_windows(events, window, min_gap_us, starts)
    gpu_only = summarize(wall_us, busy, gaps, steps, key=lambda gap: gap.next_kernel)
    gpu_only["host_waits"] = model_waits(events, window, min_wait_us, steps, starts)
    gpu_only["min_wait_us"] = min_wait_us

    labels = ModuleLabels(case.model)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            with torch.autograd.profiler.record_function(STEP_LABEL):
                run()
                torch.cuda.synchronize()
    labels.remove()
    events = _trace_events(prof)
    # The host's range only: the trace also holds each range on the GPU's timeline (cat gpu_user_annotation).
    windows = [
        (e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == STEP_LABEL and e.get("cat") == "user_annotation"
    ]
    busy, gaps = gaps_in_windows(events, windows, min_gap_us)
    traced = summarize(sum(end - start for start, end in windows), busy, gaps, len(windows))
    traced["host_waits"] = model_waits(events, windows, min_wait_us, len(windows))
    traced["min_wait_us"] = min_wait_us
    return {"gpu_only": gpu_only, "traced": traced}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model.idle", description=__doc__.split("\n\n")[0])
    add_case_arguments(parser)
    parser.add_argument("--steps", type=int, default=2, help="calls profiled")
    parser.add_argument("--call", choices=CALLS, default="train", help="the training step or the inference call")
    parser.add_argument("--min-gap-us", type=float, default=20.0, help="shorter gaps count as idle time, not listed")
    parser.add_argument("--min-wait-us", type=float, default=100.0, help="shorter runtime calls are not waits")
    parser.add_argument("--out", type=Path, default=None, help="also write the summary as JSON")
    args = parser.parse_args(argv)
    case = case_of_arguments(args, "benchmarks.model.idle")
    summary = idle_of_case(case, args.steps, args.min_gap_us, args.call, args.min_wait_us)
    what = "training step" if args.call == "train" else "inference call"
    print(f"## {args.graph}, QK norm {args.norm}, {args.dtype}, {args.mapper_chunks} mapper chunks: per {what}")
    print("GPU activity alone:")
    print(format_summary(args.variant, summary["gpu_only"], args.min_gap_us, traced=False))
    print("host ops traced too:")
    print(format_summary(args.variant, summary["traced"], args.min_gap_us), flush=True)
    if args.out is not None:
        names = ("graph", "norm", "dtype", "mapper_chunks", "variant", "steps", "call")
        meta = {name: getattr(args, name) for name in names}
        meta |= {"min_gap_us": args.min_gap_us, "min_wait_us": args.min_wait_us}
        meta |= {"device": torch.cuda.get_device_name(), "commit": git_commit()}
        args.out.write_text(json.dumps({"meta": meta, **summary}, indent=1))


if __name__ == "__main__":
    main()
