"""The graph benchmark: a norm on q and k + graph-transformer attention on Anemoi-sized graphs, in the ways listed
at the end of --help (variants.py; Anemoi's fused-QK-norm kernel where its path is given).

    python -m benchmarks.graphs [--suite full|small|tiny | --graphs NAME ...] [--dtype bfloat16]
                                [--heads 16] [--channels 64] [--variants ...] [--out DIR] [--no-plot] [--no-check]
                                [--quick | --no-quick]

For every graph: forward and forward+backward time and peak memory of each variant, the fused variant's time
against the HBM floor and its speedup over the others, and its error against the PyG reference. Results go
to DIR/results.json, results.md and results.png, rewritten after every graph so an interrupted run keeps
what it measured. With a GPU the default is the full suite.

Without a GPU the default is quick mode (quick.py; its time on a CPU: at the end of --help): the fused kernels,
through the Triton interpreter, checked once against the PyG reference on a tiny encoder, processor and decoder,
the PyG path timed, and the committed GPU results summarised. --no-quick times
every variant through the interpreter instead (slow, and those times only show that the harness works).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch_geometric
import triton

import gtnorm
from benchmarks.graphs.accuracy import check_accuracy
from benchmarks.graphs.catalog import SUITES, graph_names, load_graph
from benchmarks.graphs.measure import (
    MIB,
    Measurement,
    Settings,
    TimingSettings,
    copy_bandwidth,
    free_memory,
    guarded,
    hbm_floor_bytes,
    measure_call,
)
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
    for index, name in enumerate(names, 1):
        start = time.perf_counter()
        graph = load_graph(name, verbose=True)
        results["graphs"].append(benchmark_graph(graph, settings, device, bandwidth, f"[{index}/{len(names)}]"))
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


def benchmark_graph(graph, settings: Settings, device: torch.device, bandwidth: float, tag: str) -> dict:
    tag = f"{tag} {graph.name}"
    lo, mean, hi = graph.in_degree_stats()
    print(
        f"{tag}: {graph.kind}, {graph.num_src} -> {graph.num_dst} nodes, {graph.num_edges} edges, "
        f"in-degree {lo}/{mean:.1f}/{hi} (min/mean/max)",
        flush=True,
    )
    torch._dynamo.reset()  # a fresh compile per graph: no recompile limit, no shapes carried over
    inputs = make_inputs(graph, settings.heads, settings.channels, settings.dtype, device, settings.eps)
    floor_fwd, floor_fwd_bwd = hbm_floor_bytes(inputs.layout, inputs.query[0].numel() * inputs.query.element_size())
    result = {
        "name": graph.name,
        "kind": graph.kind,
        "description": graph.description,
        "num_src": graph.num_src,
        "num_dst": graph.num_dst,
        "num_edges": graph.num_edges,
        "in_degree": {"min": lo, "mean": mean, "max": hi},
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
    for name in settings.variants:
        result["variants"][name] = measure_variant(name, inputs, device, settings, tag)
        free_memory()
    del inputs
    free_memory()
    result.update(compare_with_fused(result))
    return result


def measure_variant(
    name: str, inputs: BenchInputs, device: torch.device, settings: Settings, tag: str
) -> dict[str, dict]:
    """{mode: Measurement as a dict} for forward (under no_grad) and forward+backward."""
    timing = settings.timing
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
        m = measure_call(calls[mode], device, timing, variant.leaves) if calls else Measurement(status)
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
