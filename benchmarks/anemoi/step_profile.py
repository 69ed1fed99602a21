"""Where a block's step goes, Anemoi's Triton backend against gtnorm's drop-in: host time, GPU time, launches and
host syncs per training step or inference call (the level-5 / O96 blocks are host-bound, so their in-block
ratios say more about the host path than about the kernels).

    python -m benchmarks.anemoi.step_profile --modules "encoder O96->r5" "processor r5" --norm off

Per side: wall ms per step (synchronised), host ms per step (the calls returned, before the final sync), GPU
kernel ms per step, kernels launched and host syncs (cudaStreamSynchronize / cudaDeviceSynchronize) per step, and
the kernels that took most GPU time. Needs a CUDA device and anemoi-models, as ``python -m benchmarks.anemoi``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

from benchmarks.anemoi.run import (
    COMPILE_MODES,
    DTYPES,
    MODULES,
    NORMS,
    SIDES,
    ModelSpec,
    build_modules,
    inference_call,
    make_problem,
    training_call,
)
from benchmarks.graphs.catalog import load_graph
from benchmarks.graphs.measure import clear_grads

SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize")
TOP_KERNELS = 8
TOP_FUNCTIONS = 25


def step_calls(module: torch.nn.Module, problem, dtype: torch.dtype, device: torch.device) -> dict:
    """{"train": a training step, "infer": inference}, as ``python -m benchmarks.anemoi`` times them."""
    infer = inference_call(module, problem, dtype, device)
    grad_out = torch.randn_like(infer())  # outside inference_mode: a normal tensor
    train_step = training_call(module, problem, dtype, device, grad_out)
    leaves = [*problem.leaves(), *module.parameters()]

    def train():  # gradients reset first, as do_bench's grad_to_none does: no accumulation kernels in the step
        clear_grads(leaves)
        train_step()

    return {"train": train, "infer": infer}


def profile_call(fn, device: torch.device, steps: int, warmup: int = 3) -> dict:
    """Per-step wall, host and GPU time (ms), kernels, host syncs and the top kernels of ``steps`` calls of fn, and
    the torch ops with most host time (self CPU, every thread: the backward runs on autograd's device thread)."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    host = time.perf_counter() - start
    synchronize()
    wall = time.perf_counter() - start
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
        synchronize()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_time_total > 0 and e.device_type == torch.autograd.DeviceType.CUDA]
    top = sorted(kernels, key=lambda e: -e.device_time_total)[:TOP_KERNELS]
    return {
        "wall_ms": 1e3 * wall / steps,
        "host_ms": 1e3 * host / steps,
        "gpu_ms": sum(e.device_time_total for e in kernels) / steps / 1e3 if device.type == "cuda" else None,
        "kernels": sum(e.count for e in kernels) / steps,
        "syncs": sum(e.count for e in events if e.key in SYNC_EVENTS) / steps,
        "top": [(e.key, e.device_time_total / steps / 1e3, e.count / steps) for e in top],
        "events": events,  # the ops' table is formatted only when asked for (--ops)
    }


def python_profile(fn, steps: int, warmup: int = 3) -> str:
    """cProfile of ``steps`` calls of fn: the functions with most own time, then most time inside them."""
    for _ in range(warmup):
        fn()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        fn()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).strip_dirs()
    stats.sort_stats("tottime").print_stats(TOP_FUNCTIONS)
    stats.sort_stats("cumulative").print_stats(TOP_FUNCTIONS)
    return text.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.anemoi.step_profile", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--modules", nargs="+", choices=list(MODULES), default=["encoder O96->r5", "processor r5"])
    parser.add_argument("--norm", choices=list(NORMS), default="off")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp16")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--python", action="store_true", help="add a cProfile of each side's step (host Python)")
    parser.add_argument("--ops", action="store_true", help="add the torch ops with most host time per side")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=["anemoi", "gtnorm"])
    parser.add_argument("--compile-mode", default="default", choices=COMPILE_MODES, help="of the compiled sides")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.anemoi.step_profile needs a CUDA device (as benchmarks.anemoi)")
    device, spec = torch.device("cuda"), ModelSpec()
    for name in args.modules:
        kind, graph_name = MODULES[name]
        graph = load_graph(graph_name)
        print(f"## {name} ({graph_name}: {graph.num_src} -> {graph.num_dst}, {graph.num_edges} edges), "
              f"QK norm {args.norm}, {args.dtype}")  # fmt: skip
        torch._dynamo.reset()
        modules = build_modules(spec, kind, args.norm, device, args.compile_mode)
        problem = make_problem(spec, kind, graph, device)
        for side in args.sides:
            for mode, fn in step_calls(modules[side], problem, DTYPES[args.dtype], device).items():
                p = profile_call(fn, device, args.steps)
                print(f"{side:15s} {mode}: wall {p['wall_ms']:.2f} ms, host {p['host_ms']:.2f} ms, "
                      f"GPU {p['gpu_ms']:.2f} ms, {p['kernels']:.0f} kernels, {p['syncs']:.1f} host syncs")  # fmt: skip
                for key, ms, count in p["top"]:
                    print(f"    {ms:7.3f} ms  x{count:5.1f}  {key[:90]}")
                if args.ops:
                    table = p["events"].table(
                        sort_by="self_cpu_time_total", row_limit=TOP_FUNCTIONS, max_name_column_width=70
                    )
                    print(f"torch ops over {args.steps} steps (totals):\n{table}")
                if args.python:
                    print(python_profile(fn, args.steps))
        del modules, problem
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
