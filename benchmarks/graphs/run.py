"""The graph benchmark: a norm on q and k + graph-transformer attention on Anemoi-sized graphs, in the ways listed
at the end of --help (variants.py; Anemoi's fused-QK-norm kernel where its path is given).

    python -m benchmarks.graphs [--suite full|small|tiny | --graphs NAME ...] [--dtype bfloat16]
                                [--heads 16] [--channels 64] [--variants ...] [--out DIR] [--no-plot] [--no-check]
                                [--quick | --no-quick] [--isolate | --no-isolate]

For every graph: forward and forward+backward time and peak memory of each variant, the fused variant's time
against the HBM floor and its speedup over the others, and its error against the PyG reference. Results go
to DIR/results.json, results.md and results.png, rewritten after every graph so an interrupted run keeps
what it measured. With a GPU the default is the full suite.

Graphs too large for every variant (h_to_era_o1280, the 9 km decoder: not in any suite, by name only): each mode of
each variant whose predicted peak memory (memory.py) exceeds the GPU's is reported as "OOM: predicted ..." without
being run, one that runs out anyway as "OOM"; with --isolate (the default for catalog.ISOLATED_GRAPHS) every variant
runs in a child process of its own, so that a kernel that crashes (an illegal memory access leaves the CUDA context
unusable) is reported as "crash: <error>" and the other variants are measured in clean processes. Each child's
output is kept in DIR/isolated/<graph>/<variant>.log.

Without a GPU the default is quick mode (quick.py; its time on a CPU: at the end of --help): the fused kernels,
through the Triton interpreter, checked once against the PyG reference on a tiny encoder, processor and decoder,
the PyG path timed, and the committed GPU results summarised. --no-quick times
every variant through the interpreter instead (slow, and those times only show that the harness works).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch_geometric
import triton

import gtnorm
from benchmarks.graphs.accuracy import check_accuracy
from benchmarks.graphs.catalog import ISOLATED_GRAPHS, SUITES, graph_names, load_graph
from benchmarks.graphs.measure import (
    MIB,
    Measurement,
    Settings,
    TimingSettings,
    copy_bandwidth,
    free_memory,
    guarded,
    hbm_floor_bytes,
    is_crash,
    measure_call,
)
from benchmarks.graphs.memory import Sizes, inputs_bytes, memory_table, predicted_oom
from benchmarks.graphs.quick import PYG_TIMED_CALLS, QUICK_GRAPHS, one_thread_on_cpu, run_quick
from benchmarks.graphs.report import MODES, NOT_PERFORMANCE, markdown, write_outputs
from benchmarks.graphs.usage import epilog
from benchmarks.graphs.variants import (
    COMPILED_VARIANTS,
    CUDA_ONLY_VARIANTS,
    PEER_VARIANTS,
    VARIANTS,
    BenchInputs,
    build_variant,
    make_inputs,
)
from gtnorm._runtime import resolve_eps

CPU_DEFAULTS = dict(suite="tiny", heads=2, channels=16)
GPU_DEFAULTS = dict(suite="full", heads=16, channels=64)
COMPILE_SKIPPED_ON_CPU = "skipped: torch.compile on the CPU is slow and says nothing about the GPU"
CUDA_ONLY_SKIPPED_ON_CPU = "skipped: a CUDA-only kernel (no Triton interpreter path)"
PEER_SKIPPED = "skipped: a kernel from outside this repository, run when its path is given (--anemoi-fused-qk)"
REPO = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_S = 900.0  # one variant of one graph in its own process (--isolate): compile, inputs, measurement


def parse_args(argv: list[str] | None, on_gpu: bool) -> argparse.Namespace:
    defaults = GPU_DEFAULTS if on_gpu else CPU_DEFAULTS
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.graphs",
        description=__doc__,
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--suite",
        choices=sorted(SUITES),
        help=f"a named set of graphs (default here: {defaults['suite']}; in quick mode on a CPU "
        f"{', '.join(QUICK_GRAPHS)})",
    )
    which.add_argument(
        "--graphs",
        nargs="+",
        choices=graph_names(),
        metavar="NAME",
        help=f"graphs by name, instead of a suite: {', '.join(graph_names())}",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=list(VARIANTS),
        metavar="VARIANT",
        help=f"which variants to run (default: all of {', '.join(VARIANTS)})",
    )
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--heads", type=int, default=defaults["heads"], help="H (default here: %(default)s)")
    parser.add_argument(
        "--channels", type=int, default=defaults["channels"], help="C, channels per head (default here: %(default)s)"
    )
    parser.add_argument(
        "--eps",
        type=float,
        default=None,
        help="RMSNorm eps, passed explicitly to every variant (default: what torch.nn.RMSNorm uses)",
    )
    parser.add_argument("--warmup-ms", type=float, default=25.0, help="GPU: do_bench warm-up time per measurement")
    parser.add_argument("--rep-ms", type=float, default=100.0, help="GPU: do_bench measuring time per measurement")
    parser.add_argument(
        "--reps",
        type=int,
        default=None,
        help=f"CPU: timed calls per measurement (median; default: {PYG_TIMED_CALLS} rounds after an untimed one in "
        "quick mode, where only PyG is timed; else 1 call, no warm-up)",
    )
    parser.add_argument(
        "--anemoi-fused-qk",
        type=Path,
        metavar="PATH",
        help="Anemoi's fused-QK-norm kernel: a checkout of ecmwf/anemoi-core's feat/triton-gt-fused-qk-norm branch, "
        "or the folder of its gt.py, norm.py, utils.py (variant anemoi_fused_qk; GPU only)",
    )
    parser.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run every variant of a graph in a child process of its own (default: only for "
        f"{', '.join(sorted(ISOLATED_GRAPHS))})",
    )
    parser.add_argument(
        "--skip-predicted-oom",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="GPU: report a mode whose predicted peak memory exceeds the device's as OOM without running it "
        "(default: %(default)s)",
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: benchmarks/out/<date-time>)")
    parser.add_argument("--no-plot", action="store_true", help="do not draw results.png")
    parser.add_argument("--no-check", action="store_true", help="skip the accuracy check against PyG")
    parser.add_argument(
        "--quick",
        action=argparse.BooleanOptionalAction,
        default=not on_gpu,
        help="check the fused op once per graph against PyG, time only PyG, summarise the committed GPU results "
        "(default here: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = Path(__file__).resolve().parents[1] / "out" / time.strftime("%Y%m%d-%H%M%S")
    return args


def main(argv: list[str] | None = None) -> dict:
    on_gpu = torch.cuda.is_available()
    args = parse_args(argv, on_gpu)
    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = getattr(torch, args.dtype)
    cpu_reps = args.reps or (PYG_TIMED_CALLS if args.quick else 1)
    timing = TimingSettings(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, cpu_reps=cpu_reps)
    settings = Settings(
        dtype=dtype,
        heads=args.heads,
        channels=args.channels,
        eps=args.eps if args.eps is not None else resolve_eps(None, dtype),
        variants=tuple(v for v in VARIANTS if v in args.variants),
        timing=timing,
        check=not args.no_check,
        peer_paths={"anemoi_fused_qk": args.anemoi_fused_qk} if args.anemoi_fused_qk else {},
    )
    names = graphs_to_run(args, on_gpu)
    if args.quick:
        with one_thread_on_cpu(device):
            meta = run_metadata(device, settings, bandwidth=None)
            return run_quick(names, settings, device, args.out, meta)

    if not on_gpu:
        print(NOT_PERFORMANCE.replace("**", ""))
        print(
            f"Defaults on the CPU (flags override them): the '{CPU_DEFAULTS['suite']}' suite, "
            f"H={CPU_DEFAULTS['heads']}, C={CPU_DEFAULTS['channels']}, one call per measurement. No peak memory; "
            f"compiled variants {COMPILE_SKIPPED_ON_CPU}."
        )
    print(
        f"graphs: {', '.join(names)}; {args.dtype}, H={settings.heads}, C={settings.channels}, "
        f"eps={settings.eps:g}; output: {args.out}",
        flush=True,
    )

    bandwidth = copy_bandwidth(device)
    print(f"copy bandwidth: {bandwidth / 1e9:.1f} GB/s (bytes read + written)", flush=True)
    run_start = time.perf_counter()
    results = {"meta": run_metadata(device, settings, bandwidth), "graphs": []}
    device_bytes = torch.cuda.get_device_properties(device).total_memory if on_gpu else None
    for index, name in enumerate(names, 1):
        start = time.perf_counter()
        graph = load_graph(name, verbose=True)
        isolate = args.isolate if args.isolate is not None else name in ISOLATED_GRAPHS
        results["graphs"].append(
            benchmark_graph(
                graph, settings, device, bandwidth, f"[{index}/{len(names)}]",
                device_bytes=device_bytes if args.skip_predicted_oom else None,
                isolated_out=args.out / "isolated" / name if isolate else None,
            )
        )  # fmt: skip
        results["graphs"][-1]["seconds"] = round(time.perf_counter() - start, 1)
        del graph
        free_memory()
        write_outputs(results, args.out, plot=not args.no_plot)

    print()
    print(markdown(results))
    print(
        f"wrote {args.out}/results.json, results.md"
        + ("" if args.no_plot else ", results.png")
        + f" ({time.perf_counter() - run_start:.0f} s)"
    )
    return results


def graphs_to_run(args: argparse.Namespace, on_gpu: bool) -> list[str]:
    """--graphs, else --suite, else the default: QUICK_GRAPHS in quick mode on a CPU, else the device's suite."""
    if args.graphs:
        return list(args.graphs)
    if args.suite is None and args.quick and not on_gpu:
        return list(QUICK_GRAPHS)
    return list(SUITES[args.suite or (GPU_DEFAULTS if on_gpu else CPU_DEFAULTS)["suite"]])


def run_metadata(device: torch.device, settings: Settings, bandwidth: float | None) -> dict:
    on_gpu = device.type == "cuda"
    timing = settings.timing
    return {
        "device": (
            torch.cuda.get_device_name(device)
            if on_gpu
            else f"CPU, {torch.get_num_threads()} thread(s), Triton interpreter"
        ),
        "performance_figures": on_gpu,
        "triton_interpreter": not on_gpu,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "torch_geometric": torch_geometric.__version__,
        "gtnorm": gtnorm.__version__,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "dtype": str(settings.dtype).removeprefix("torch."),
        "heads": settings.heads,
        "channels": settings.channels,
        "eps": settings.eps,
        "timing": (
            f"CUDA events, median (triton.testing.do_bench, warm-up {timing.warmup_ms:g} ms, "
            f"measure {timing.rep_ms:g} ms, L2 flushed between calls)"
            if on_gpu
            else f"time.perf_counter, median of {timing.cpu_reps} call(s), no warm-up"
        ),
        "copy_bandwidth_bytes_per_s": bandwidth,
    }


def graph_sizes(graph, settings: Settings) -> Sizes:
    element_size = torch.empty((), dtype=settings.dtype).element_size()
    return Sizes(graph.num_src, graph.num_dst, graph.num_edges, settings.heads, settings.channels, element_size)


def benchmark_graph(
    graph,
    settings: Settings,
    device: torch.device,
    bandwidth: float,
    tag: str,
    device_bytes: int | None = None,
    isolated_out: Path | None = None,
) -> dict:
    """One graph's results. ``device_bytes``: the GPU's memory, against which each variant's predicted peak is
    checked (None: run everything); ``isolated_out``: run each variant in a child process, its files there."""
    tag = f"{tag} {graph.name}"
    lo, mean, hi = graph.in_degree_stats()
    print(
        f"{tag}: {graph.kind}, {graph.num_src} -> {graph.num_dst} nodes, {graph.num_edges} edges, "
        f"in-degree {lo}/{mean:.1f}/{hi} (min/mean/max)",
        flush=True,
    )
    sizes = graph_sizes(graph, settings)
    skips = {name: dict.fromkeys(MODES) for name in settings.variants}
    if device_bytes is not None:
        skips = {name: predicted_oom(name, sizes, device_bytes) for name in settings.variants}
        if any(any(modes.values()) for modes in skips.values()):
            print(f"{tag}: predicted peak memory, device {device_bytes / 2**30:.0f} GiB:", flush=True)
            print(memory_table(settings.variants, sizes), flush=True)
    if isolated_out is not None:
        return benchmark_graph_isolated(graph, settings, bandwidth, tag, skips, sizes, isolated_out)
    torch._dynamo.reset()  # a fresh compile per graph: no recompile limit, no shapes carried over
    inputs = make_inputs(graph, settings.heads, settings.channels, settings.dtype, device, settings.eps)
    floor_fwd, floor_fwd_bwd = hbm_floor_bytes(inputs.layout, inputs.query[0].numel() * inputs.query.element_size())
    result = {
        **graph_fields(graph),
        "inputs_mib": inputs.nbytes() / MIB,
        "floor": {
            "fwd_bytes": floor_fwd,
            "fwd_bwd_bytes": floor_fwd_bwd,
            "fwd_ms": 1e3 * floor_fwd / bandwidth,
            "fwd_bwd_ms": 1e3 * floor_fwd_bwd / bandwidth,
        },
        "accuracy": None,
    }
    if settings.check:
        print(f"{tag}: accuracy check (fused, pyg, pyg in fp32; forward+backward) ...", flush=True)
        result["accuracy"] = check_accuracy(inputs)
        free_memory()
        for comparison, errors in result["accuracy"].items():
            text = errors if isinstance(errors, str) else ", ".join(f"{k} {v:.1e}" for k, v in errors.items())
            print(f"{tag}:   {comparison}: {text}", flush=True)
    result["variants"] = {}
    crashed = None
    for name in settings.variants:
        if crashed is not None:
            lost = f"skipped: the CUDA context was lost to {crashed}'s crash (--isolate runs each variant apart)"
            result["variants"][name] = {mode: asdict(Measurement(lost)) for mode in MODES}
            continue
        result["variants"][name] = measure_variant(name, inputs, device, settings, tag, skips[name])
        if any(is_crash(m["status"]) for m in result["variants"][name].values()):
            crashed = name
        free_memory()
    del inputs
    free_memory()
    result.update(compare_with_fused(result))
    return result


def measure_variant(
    name: str, inputs: BenchInputs, device: torch.device, settings: Settings, tag: str, skip: dict | None = None
) -> dict[str, dict]:
    """{mode: Measurement as a dict} for forward (under no_grad) and forward+backward. ``skip``: {mode: the status to
    report instead of running it (a predicted OOM), or None}."""
    timing = settings.timing
    skip = skip or {}
    if all(skip.get(mode) for mode in MODES):
        for mode in MODES:
            print(f"{tag} {name:22s} {MODES[mode]:17s} ... {skip[mode]}", flush=True)
        return {mode: asdict(Measurement(skip[mode])) for mode in MODES}
    if name in PEER_VARIANTS and name not in settings.peer_paths:
        return {mode: asdict(Measurement(PEER_SKIPPED)) for mode in MODES}
    if name in COMPILED_VARIANTS and device.type != "cuda":
        print(f"{tag} {name:22s} {COMPILE_SKIPPED_ON_CPU}", flush=True)
        return {mode: asdict(Measurement(COMPILE_SKIPPED_ON_CPU)) for mode in MODES}
    if name in CUDA_ONLY_VARIANTS and device.type != "cuda":
        print(f"{tag} {name:22s} {CUDA_ONLY_SKIPPED_ON_CPU}", flush=True)
        return {mode: asdict(Measurement(CUDA_ONLY_SKIPPED_ON_CPU)) for mode in MODES}
    variant, status = guarded(lambda: build_variant(name, inputs, settings.peer_paths))
    calls = {}
    if variant is not None:
        forward, grad_out = variant.forward, inputs.grad_out
        calls = {"fwd": lambda: _without_grad(forward), "fwd_bwd": lambda: forward().backward(grad_out)}
    measured = {}
    for mode in MODES:
        print(f"{tag} {name:22s} {MODES[mode]:17s} ... ", end="", flush=True)
        if skip.get(mode):
            m = Measurement(skip[mode])
        elif calls:
            m = measure_call(calls[mode], device, timing, variant.leaves)
        else:
            m = Measurement(status)
        print(describe(m), flush=True)
        measured[mode] = asdict(m)
        free_memory()
    return measured


def _without_grad(forward):
    with torch.no_grad():
        return forward()


def compare_with_fused(result: dict) -> dict:
    """The fused variant's time as % of the floor time (floor / measured) and its speedup over the others."""
    fused = result["variants"].get("fused")
    ok = lambda m: m["status"] == "ok"
    if fused is None:
        return {"fused_pct_of_floor": None, "fused_speedup": {}}
    return {
        "fused_pct_of_floor": {
            mode: 100 * result["floor"][f"{mode}_ms"] / fused[mode]["ms"] if ok(fused[mode]) else None for mode in MODES
        },
        "fused_speedup": {
            name: {
                mode: modes[mode]["ms"] / fused[mode]["ms"] if ok(modes[mode]) and ok(fused[mode]) else None
                for mode in MODES
            }
            for name, modes in result["variants"].items()
            if name != "fused"
        },
    }


def describe(m: Measurement) -> str:
    if not m.ok:
        return m.status
    memory = "" if m.peak_mib is None else f", peak {m.peak_mib:.0f} MiB (+{m.extra_mib:.0f} over the inputs)"
    return f"{m.ms:9.3f} ms{memory}"


def child_command(graph_name: str, variant: str, settings: Settings, out: Path) -> list[str]:
    """The command that measures one variant of one graph in a process of its own, with this run's settings."""
    timing = settings.timing
    command = [
        sys.executable, "-m", "benchmarks.graphs", "--graphs", graph_name, "--variants", variant,
        "--dtype", str(settings.dtype).removeprefix("torch."), "--heads", str(settings.heads),
        "--channels", str(settings.channels), "--eps", repr(settings.eps), "--warmup-ms", repr(timing.warmup_ms),
        "--rep-ms", repr(timing.rep_ms), "--no-check", "--no-plot", "--no-quick", "--no-isolate", "--out", str(out),
    ]  # fmt: skip
    if timing.cpu_reps != 1:
        command += ["--reps", str(timing.cpu_reps)]
    for peer, path in settings.peer_paths.items():
        command += ["--" + peer.replace("_", "-"), str(path)]
    return command


def _last_error_line(lines) -> str:
    """The last line of a child's output that names an error (a Python exception's last line), else its last line."""
    lines = [line.strip() for line in lines if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line or "Exception" in line:
            return line[:200]
    return lines[-1][:200] if lines else "no output"


def run_in_child(command: list[str], log_path: Path, tag: str, timeout_s: float = CHILD_TIMEOUT_S) -> tuple[int, str]:
    """Runs ``command`` from the repository root, its output echoed (indented) and written to ``log_path``;
    (exit code, its last error line). A child past ``timeout_s`` is killed (exit code -9)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: collections.deque[str] = collections.deque(maxlen=40)
    with open(log_path, "w") as log:
        child = subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ)
        )
        watchdog = threading.Timer(timeout_s, child.kill)
        watchdog.start()
        try:
            for line in child.stdout:
                log.write(line)
                tail.append(line)
                print(f"{tag}   | {line}", end="", flush=True)
            code = child.wait()
        finally:
            watchdog.cancel()
    return code, _last_error_line(tail)


def measure_variant_in_child(
    graph_name: str, variant: str, settings: Settings, out: Path, tag: str, timeout_s: float = CHILD_TIMEOUT_S
) -> tuple[dict[str, dict], dict | None]:
    """({mode: Measurement as a dict}, the child's graph result or None) for one variant measured in a process of
    its own. A child that dies before writing its result gives "crash: <its last error line>" in both modes."""
    folder = out / variant
    code, error = run_in_child(child_command(graph_name, variant, settings, folder), out / f"{variant}.log", tag,
                               timeout_s)  # fmt: skip
    try:
        graph = json.loads((folder / "results.json").read_text())["graphs"][0]
        measured = graph["variants"][variant]
    except (OSError, ValueError, KeyError, IndexError):
        why = "timed out" if code == -9 else f"exit code {code}"
        crashed = Measurement(f"crash: {why}: {error}")
        return {mode: asdict(crashed) for mode in MODES}, None
    return measured, graph


def graph_fields(graph) -> dict:
    """What a result records of the graph itself."""
    lo, mean, hi = graph.in_degree_stats()
    return {
        "name": graph.name,
        "kind": graph.kind,
        "description": graph.description,
        "num_src": graph.num_src,
        "num_dst": graph.num_dst,
        "num_edges": graph.num_edges,
        "in_degree": {"min": lo, "mean": mean, "max": hi},
    }


def benchmark_graph_isolated(
    graph, settings: Settings, bandwidth: float, tag: str, skips: dict, sizes: Sizes, out: Path
) -> dict:
    """benchmark_graph with every variant in a child process (measure_variant_in_child); the graph's floor comes
    from the first child that measured (its layout), or from the row counts alone if none did."""
    result = {
        **graph_fields(graph),
        "inputs_mib": inputs_bytes(sizes) / MIB,
        "floor": None,
        "accuracy": None,  # the check's fp32 reference does not fit where variants need a process each
        "isolated": True,
        "variants": {},
    }
    free_memory()  # what this process cached (the bandwidth test's 2 GiB) goes back before any child allocates
    for name in settings.variants:
        if all(skips[name].get(mode) for mode in MODES):
            for mode in MODES:
                print(f"{tag} {name:22s} {MODES[mode]:17s} ... {skips[name][mode]}", flush=True)
            result["variants"][name] = {mode: asdict(Measurement(skips[name][mode])) for mode in MODES}
            continue
        print(f"{tag} {name}: in a child process ...", flush=True)
        measured, child = measure_variant_in_child(graph.name, name, settings, out, tag)
        for mode in MODES:
            print(f"{tag} {name:22s} {MODES[mode]:17s} ... {describe(Measurement(**measured[mode]))}", flush=True)
        result["variants"][name] = measured
        if child is not None and result["floor"] is None:
            result["floor"], result["inputs_mib"] = child["floor"], child["inputs_mib"]
    if result["floor"] is None:
        row_bytes = sizes.row
        fwd = (2 * sizes.num_dst + 2 * sizes.num_src + sizes.num_edges) * row_bytes
        fwd_bwd = fwd + (3 * sizes.num_dst + 4 * sizes.num_src + 2 * sizes.num_edges) * row_bytes
        result["floor"] = {"fwd_bytes": fwd, "fwd_bwd_bytes": fwd_bwd, "index_arrays": "left out (no child measured)"}
    for mode in MODES:  # this process's bandwidth, as for every other graph of the run
        result["floor"][f"{mode}_ms"] = 1e3 * result["floor"][f"{mode}_bytes"] / bandwidth
    result.update(compare_with_fused(result))
    return result
