"""The benchmark's quick mode (the default without CUDA): a check and a pointer, not a measurement of the kernels.

Through the Triton interpreter the kernels take seconds per call, and those seconds say nothing about a GPU. So
per graph the fused op runs forward+backward once and is compared with the PyG reference (output and all six
gradients, the same check as the full benchmark's), the PyG path is timed (it runs natively here), and at the
end the committed GPU results are summarised: those are the performance figures.
"""

from __future__ import annotations

import contextlib
import json
import math
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from benchmarks.graphs.accuracy import check_accuracy
from benchmarks.graphs.catalog import load_graph
from benchmarks.graphs.measure import Settings, free_memory, guarded, interleaved_cpu_medians_ms, measure_call
from benchmarks.graphs.report import MODES
from benchmarks.graphs.variants import build_variant, make_inputs
from benchmarks.results_date import run_date

REPO = Path(__file__).resolve().parents[2]
# The committed GPU run of this benchmark: what quick mode and the README show (python -m benchmarks.report).
COMMITTED_GPU_RESULTS = REPO / "benchmarks" / "results" / "h200" / "graphs"
PYG_TIMED_CALLS = 25  # CPU default: median of this many rounds of the PyG path (milliseconds each on tiny graphs)
# An encoder, the processor and a decoder of the tiny suite: each kind of graph a model runs. Through the
# interpreter their checks take 16, 26 and 36 s of one core; the suite's fourth graph, dop_enc_tiny (another
# encoder), 42 s more, which would take a loaded 2-core machine past 3 minutes (--suite tiny runs it).
QUICK_GRAPHS = ("era_to_h_tiny", "h_to_h_tiny", "h_to_era_tiny")
HEARTBEAT_S = 10.0  # a line at least this often while an interpreter step runs
# What `bash run.sh bench` costs on a CPU, as measured (docs/cpu.md lists the runs); the README and run.sh say the same
# (tests/test_readme.py), the benchmark's --help takes it from here.
CPU_RUN_TIME = "about 2 minutes on 2 cores with two busy processes beside it"
# What one edge costs the check through the interpreter, in ms of one core (H=2, C=16; the interpreter runs the
# kernels' loops once per edge, so the cost grows with the edges): measured on the four tiny graphs, triton 3.9,
# with the repeated language patches skipped (interpreter.py). The estimate printed before the checks start.
INTERPRETER_MS_PER_EDGE = 15.0
# Above this estimate a run is GPU-sized: it says so, and how to run it on a GPU, before it starts.
GPU_SIZED_S = 300.0
# bf16 is judged against PyG's own bf16 rounding (the verdict); float32 has no such yardstick, so a fixed bound.
FLOAT32_TOLERANCE = 1e-4

INTRO = (
    "Quick mode{reason}: the fused Triton kernels run once per graph (forward and backward) and are checked against "
    "the PyG reference, run in the same dtype and in float32; the PyG path is timed{where}. {interpreter}The GPU "
    "performance figures are the committed results, summarised at the end (full tables: {committed}/results.md). "
    "The full benchmark (every variant timed, a plot): `bash run.sh bench` on a CUDA machine, or --no-quick."
)


def run_quick(names: list[str], settings: Settings, device: torch.device, out: Path, meta: dict) -> dict:
    on_gpu = device.type == "cuda"
    intro = INTRO.format(
        reason="" if on_gpu else " (no CUDA device here)",
        where="" if on_gpu else " on the CPU",
        interpreter=""
        if on_gpu
        else "Here the kernels run through the Triton interpreter (TRITON_INTERPRET=1), ~1 ms per program: "
        "its times are not reported. ",
        committed=COMMITTED_GPU_RESULTS.relative_to(REPO),
    )
    print(textwrap.fill(intro, width=115))
    print(
        f"graphs: {', '.join(names)}; {str(settings.dtype).removeprefix('torch.')}, H={settings.heads}, "
        f"C={settings.channels}, eps={settings.eps:g}; output: {out}",
        flush=True,
    )
    meta = {**meta, "mode": "quick"}
    if not on_gpu:
        meta["timing"] = (
            f"time.perf_counter on {torch.get_num_threads()} thread(s), forward and forward+backward in turn, "
            f"median of {settings.timing.cpu_reps} rounds after one untimed round"
        )
    results = {"meta": meta, "graphs": []}
    start = time.perf_counter()
    graphs = [load_graph(name, verbose=True) for name in names]
    if not on_gpu:
        print(textwrap.fill(interpreter_estimate(graphs), width=115), flush=True)
    for index, graph in enumerate(graphs, 1):
        results["graphs"].append(check_graph(graph, settings, device, f"[{index}/{len(names)}] {graph.name}", start))
        free_memory()
    results["verdict"] = verdict(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(quick_markdown(results))
    print()
    print(quick_markdown(results))
    print(committed_gpu_header())
    print(committed_gpu_summary())
    print(f"wrote {out}/results.json, results.md ({time.perf_counter() - start:.0f} s)")
    print(results["verdict"]["line"], flush=True)
    return results


def interpreter_estimate(graphs: list) -> str:
    """What the checks will cost here, said before they start; for a GPU-sized run, where to run it instead."""
    edges = sum(graph.num_edges for graph in graphs)
    seconds = edges * INTERPRETER_MS_PER_EDGE / 1e3
    text = (
        f"Estimate: {edges:,} edges through the Triton interpreter, about {_duration(seconds)} of one core "
        f"({INTERPRETER_MS_PER_EDGE:g} ms per edge), more on a busy machine."
    )
    if seconds > GPU_SIZED_S:
        text += (
            " This is a GPU-sized run: on a machine with an NVIDIA GPU the same command checks these graphs in "
            "seconds and times every variant. Here, `bash run.sh bench` checks three tiny graphs (an encoder, the "
            "processor and a decoder) and `bash run.sh bench --suite tiny` adds a fourth. Ctrl-C stops this run."
        )
    return text


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds / 3600:.1f} hours"


def verdict(results: dict) -> dict:
    """{"pass": bool, "line": one line that says pass or fail and against what}. In bf16 / fp16 the fused op
    passes on a graph when its worst relative error against the PyG path run in float32 (over the output and
    the six gradients) is no larger than the PyG path's own in that dtype: the fused op is at least as close to
    the exact result as the reference implementation. In float32, against FLOAT32_TOLERANCE."""
    dtype = results["meta"]["dtype"]
    failures, fused_worst, bar_worst = [], 0.0, 0.0
    for graph in results["graphs"]:
        accuracy = graph["accuracy"]
        if dtype == "float32":
            fused, bar = accuracy.get("fused vs pyg"), FLOAT32_TOLERANCE
        else:
            fused, bar = accuracy.get("fused vs pyg fp32"), accuracy.get("pyg vs pyg fp32")
            if not isinstance(bar, dict):
                failures.append(f"{graph['name']}: no float32 reference ({bar})")
                continue
            bar = max(bar.values())
        if not isinstance(fused, dict):
            failures.append(f"{graph['name']}: the fused op gave no result ({fused})")
            continue
        worst = max(fused.values(), key=lambda error: (math.isnan(error), error))  # a NaN is the worst
        fused_worst, bar_worst = max(fused_worst, worst), max(bar_worst, bar)
        if not worst <= bar:  # NaN fails too
            failures.append(f"{graph['name']}: worst error {worst:.1e} > {bar:.1e}")
    bound = (
        f"within a relative error of {FLOAT32_TOLERANCE:g} of the PyG path"
        if dtype == "float32"
        else f"no farther from the PyG path in float32 than the PyG path in {dtype} is"
    )
    checked = "the fused kernels' output and six gradients"
    if failures:
        line = f"FAIL: {checked} must be {bound}, and are not on " + "; ".join(failures)
    else:
        worst = f"fused {fused_worst:.1e}" + ("" if dtype == "float32" else f", PyG {dtype} {bar_worst:.1e}")
        line = f"PASS: on {len(results['graphs'])} graphs {checked} are {bound} (worst relative error: {worst})"
    return {"pass": not failures, "line": line}


@contextlib.contextmanager
def one_thread_on_cpu(device: torch.device) -> Iterator[None]:
    """torch on one thread for quick mode on a CPU, the caller's setting back afterwards. The interpreter is
    single-threaded Python, and on graphs this small the PyG path gains nothing from a second thread; on a shared
    machine a second thread makes every parallel region wait for a free core, which once put single PyG timings
    100x apart in one run."""
    threads = torch.get_num_threads()
    if device.type != "cuda":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def progress(tag: str, what: str, run_start: float, every_s: float = HEARTBEAT_S) -> Iterator[None]:
    """Says when ``what`` starts, every ``every_s`` seconds while it runs, and when it ends, with its time: an
    interpreter step takes up to a minute on a shared 2-core machine, and a silent minute looks like a hang."""
    start = time.perf_counter()
    print(f"{tag}: {what} ...", flush=True)
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every_s):
            print(f"{tag}:   ... {time.perf_counter() - start:.0f} s", flush=True)

    beating = threading.Thread(target=beat, daemon=True)
    beating.start()
    try:
        yield
    finally:
        done.set()
        beating.join()
    now = time.perf_counter()
    print(f"{tag}: {what}: done in {now - start:.1f} s ({now - run_start:.0f} s into the run)", flush=True)


def check_graph(graph, settings: Settings, device: torch.device, tag: str, run_start: float) -> dict:
    lo, mean, hi = graph.in_degree_stats()
    print(
        f"{tag}: {graph.kind}, {graph.num_src} -> {graph.num_dst} nodes, {graph.num_edges} edges, "
        f"in-degree {lo}/{mean:.1f}/{hi} (min/mean/max)",
        flush=True,
    )
    inputs = make_inputs(graph, settings.heads, settings.channels, settings.dtype, device, settings.eps)
    how = "compiled" if device.type == "cuda" else "through the Triton interpreter"
    with progress(tag, f"fused forward+backward ({how}) against PyG", run_start):
        # The fused RMSNorm only: the LayerNorm mode doubles the interpreter's time, and the tests cover it.
        accuracy = check_accuracy(inputs, layer_norm=False)
    for comparison, errors in accuracy.items():
        print(f"{tag}:   {comparison}: {_errors_text(errors)}", flush=True)

    pyg = build_variant("pyg", inputs)
    calls = {"fwd": lambda: _without_grad(pyg.forward), "fwd_bwd": lambda: pyg.forward().backward(inputs.grad_out)}
    pyg_ms = time_pyg(calls, device, settings, pyg.leaves)
    print(f"{tag}: pyg, forward / forward+backward: {_pyg_text(pyg_ms)}", flush=True)
    return {
        "name": graph.name,
        "kind": graph.kind,
        "num_src": graph.num_src,
        "num_dst": graph.num_dst,
        "num_edges": graph.num_edges,
        "accuracy": accuracy,
        "pyg_ms": pyg_ms,
    }


# What a CPU timing row says when its medians contradict each other: no numbers rather than wrong ones.
CONTRADICTED = "not reported: the forward's median came out above forward+backward's (a machine too busy to time)"


def time_pyg(calls: dict, device: torch.device, settings: Settings, leaves) -> dict[str, float | str]:
    """{mode: ms or why not}. On the CPU the modes take turns (interleaved_cpu_medians_ms), the median of
    settings.timing.cpu_reps rounds each; a forward slower than forward+backward is reported as CONTRADICTED."""
    if device.type == "cuda":
        timed = {mode: measure_call(call, device, settings.timing, leaves) for mode, call in calls.items()}
        return {mode: m.ms if m.ok else m.status for mode, m in timed.items()}
    medians, status = guarded(lambda: interleaved_cpu_medians_ms(calls, settings.timing.cpu_reps, leaves))
    if medians is None:
        return dict.fromkeys(calls, status)
    if medians["fwd"] > medians["fwd_bwd"]:
        return dict.fromkeys(calls, CONTRADICTED)
    return medians


def _without_grad(forward):
    with torch.no_grad():
        return forward()


def _errors_text(errors: dict[str, float] | str) -> str:
    return errors if isinstance(errors, str) else ", ".join(f"{k} {v:.1e}" for k, v in errors.items())


def _worst(errors: dict[str, float] | str | None) -> str:
    if errors is None:
        return "–"
    return errors if isinstance(errors, str) else f"{max(errors.values()):.1e}"


def _pyg_text(pyg_ms: dict) -> str:
    """'0.412 / 1.337 ms' (forward / forward+backward), or the one reason there are no times."""
    values = list(pyg_ms.values())
    if len(set(values)) == 1 and isinstance(values[0], str):
        return values[0]
    return " / ".join(f"{v:.3f}" if isinstance(v, float) else v for v in values) + " ms"


def quick_markdown(results: dict) -> str:
    meta = results["meta"]
    lines = [
        f"## Quick check on {meta['device']} ({meta['dtype']}, H={meta['heads']}, C={meta['channels']})",
        "",
        "Worst relative error ‖a − b‖ / ‖b‖ over the output and the six gradients (dq, dk, dv, de, dwq, dwk); "
        f"'pyg fp32' is the PyG path run in float32 on the same values. PyG time: {meta['timing']}.",
        "",
        "| graph | kind | nodes (src → dst) | edges | fused vs pyg fp32 | pyg vs pyg fp32 | fused vs pyg "
        "| pyg fwd / fwd+bwd |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for g in results["graphs"]:
        acc = g["accuracy"]
        lines.append(
            f"| {g['name']} | {g['kind']} | {g['num_src']} → {g['num_dst']} | {g['num_edges']} "
            f"| {_worst(acc.get('fused vs pyg fp32'))} | {_worst(acc.get('pyg vs pyg fp32'))} "
            f"| {_worst(acc.get('fused vs pyg'))} | {_pyg_text(g['pyg_ms'])} |"
        )
    return "\n".join(lines) + "\n"


def committed_gpu_header(folder: Path = COMMITTED_GPU_RESULTS) -> str:
    """What quick mode prints above the committed table: that it was measured elsewhere, when and where."""
    device = json.loads((folder / "results.json").read_text())["meta"]["device"]
    return (
        f"The performance figures, not measured now: the committed run of {run_date(folder)} on {device} "
        f"({folder.relative_to(REPO)}/README.md says how it was made)."
    )


# A run of graphs too large for the main run's device or variants (the 9 km decoder), kept beside it: its rows join
# the main run's table (committed_gpu_summary).
EXTRA_RESULTS_FOLDER = "graphs-o1280"


def committed_gpu_summary(folder: Path = COMMITTED_GPU_RESULTS) -> str:
    """The committed GPU run as one markdown table (times, speedups, % of the HBM floor, memory), with Anemoi's
    kernels as columns, and the rows of its sibling folder EXTRA_RESULTS_FOLDER where that exists; the README
    shows the same table (tests/benchmarks/test_quick.py keeps the two equal)."""
    results = json.loads((folder / "results.json").read_text())
    meta = results["meta"]
    torch_version = meta["torch"].split("+")[0]
    lines = [
        f"GPU results ({meta['device']}, run of {run_date(folder)}; {meta['dtype']}, H={meta['heads']}, "
        f"C={meta['channels']}, RMSNorm on q "
        f"and k; torch {torch_version}, triton {meta['triton']}; from {folder.relative_to(REPO)}/). "
        "Times in ms, forward / forward+backward:",
        "",
        "| graph | nodes (src → dst) | edges | pyg | pyg compiled | unfused | fused | Anemoi main + compiled RMSNorm "
        "| Anemoi fused-QK | fused speedup over pyg compiled | fused fwd+bwd speedup over Anemoi: main + RMSNorm "
        "eager / compiled, fused-QK | fused % of HBM floor | extra memory fwd+bwd, MiB: pyg compiled / fused "
        "| LayerNorm fwd+bwd: fused_layer speedup over anemoi_layer / anemoi_compiled_layer |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    graphs = list(results["graphs"])
    extra = folder.parent / EXTRA_RESULTS_FOLDER
    extra_meta = None
    if (extra / "results.json").is_file():
        extra_results = json.loads((extra / "results.json").read_text())
        extra_meta = extra_results["meta"]
        graphs += extra_results["graphs"]
    for g in graphs:
        v = g["variants"]
        times = [
            _times(v, name)
            for name in ("pyg", "pyg_compiled", "unfused", "fused", "anemoi_compiled_rms", "anemoi_fused_qk")
        ]
        speedup = " / ".join(_factor(_over(v, "pyg_compiled", "fused", mode)) for mode in MODES)
        anemoi = " / ".join(
            _factor(_over(v, name, "fused", "fwd_bwd"), ".2f")
            for name in ("anemoi_rms", "anemoi_compiled_rms", "anemoi_fused_qk")
        )
        floor = " / ".join(_percent((g.get("fused_pct_of_floor") or {}).get(mode)) for mode in MODES)
        memory = f"{_extra_mib(v, 'pyg_compiled')} / {_extra_mib(v, 'fused')}"
        layer = " / ".join(
            _factor(_over(v, anemoi, "fused_layer", "fwd_bwd")) for anemoi in ("anemoi_layer", "anemoi_compiled_layer")
        )
        lines.append(
            f"| {g['name']} ({g['kind']}) | {g['num_src']:,} → {g['num_dst']:,} | {g['num_edges']:,} | "
            + " | ".join(times)
            + f" | {speedup} | {anemoi} | {floor} | {memory} | {layer} |"
        )
    lines += [
        "",
        "pyg: torch.nn.RMSNorm + PyG MessagePassing (eager; compiled: torch.compile); unfused: gtnorm.rms_norm + "
        "the attention kernels without the norm; fused: the norm inside the attention kernels. Anemoi main: "
        "torch's RMSNorm on q and k (eager, or torch.compile'd) + the Triton kernel anemoi-models ships "
        "(anemoi.models.triton.gt, no norm inside); Anemoi fused-QK: the kernel of Anemoi's unreleased "
        "fused-QK-norm branch (RMSNorm inside, no affine weights). % of HBM floor: "
        "the time it takes to move every byte that must move once at the measured copy bandwidth, over the "
        "fused time. anemoi_layer: torch's LayerNorm on q and k + Anemoi's Triton kernel (anemoi_compiled_layer: "
        "the LayerNorm torch.compile'd, as a compiling user runs it); fused_layer: gtnorm with the LayerNorm inside "
        "its kernels. –: not run; OOM: out of GPU memory; crash: the kernel stopped the process (e.g. an illegal "
        "memory access).",
    ]
    if extra_meta is not None:
        names = ", ".join(g["name"] for g in extra_results["graphs"])
        lines[-1] += (
            f" {names}: its own run ({extra_meta['device']}, run of {run_date(extra)}; from "
            f"{extra.relative_to(REPO)}/), each variant in a process of its own."
        )
    return "\n".join(lines) + "\n"


def _times(variants: dict, name: str) -> str:
    if name not in variants:
        return "–"
    return " / ".join(_ms(variants[name][mode]) for mode in MODES)


def _extra_mib(variants: dict, name: str) -> str:
    measured = variants.get(name, {}).get("fwd_bwd")
    if measured is None:
        return "–"
    if measured["status"] != "ok":
        return measured["status"].split(":")[0]
    return f"{measured['extra_mib']:.0f}"


def _percent(x: float | None) -> str:
    return "–" if x is None else f"{x:.0f}%"


def _over(variants: dict, slower: str, faster: str, mode: str) -> float | None:
    a, b = variants.get(slower, {}).get(mode, {}), variants.get(faster, {}).get(mode, {})
    return a["ms"] / b["ms"] if a.get("status") == "ok" and b.get("status") == "ok" else None


def _ms(measured: dict) -> str:
    return f"{measured['ms']:.2f}" if measured["status"] == "ok" else measured["status"].split(":")[0]


def _factor(x: float | None, fmt: str = ".1f") -> str:
    return "–" if x is None else f"{x:{fmt}}×"
