"""What finding layouts costs inside Anemoi's blocks: gtnorm's drop-in as shipped against the same module and
inputs with every lookup served from the layouts prebuilt for its graph (benchmarks/anemoi/prebuilt_layouts.py:
no compare, no sync). Two ways a step gets its edge_index:

- "clone": a fresh edge_index clone every step; the shipped side finds its layout by content (a device compare
  and a host sync per new tensor, gtnorm/triton/layout_cache.py);
- "provider": as Anemoi's models do, from a StaticGraphProvider's ``get_edges(batch_size=1)`` inside the timed
  step on both sides (both pay Anemoi's own sync there). The shipped side's provider is converted by
  ``gtnorm.anemoi.use_gtnorm_attention`` (its expansion, and the mappers' chunks, registered by provenance: found
  by identity, no sync); the prebuilt side's is Anemoi's own.

Per module and way: a training step (forward + backward, Anemoi's default gradient checkpointing) and inference
(``torch.inference_mode``) under autocast, LayerNorm QK norm (Anemoi's default); median GPU time of each side,
shipped / prebuilt, and the host time of one step from an idle GPU (until the call returns). Both sides' outputs
and input gradients are compared before anything is timed.

    python -m benchmarks.anemoi.layout_reuse --out benchmarks/out/anemoi-layout-reuse

Needs a CUDA device and anemoi-models. Writes results.json and results.md.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch
from anemoi.models.layers.graph_provider import StaticGraphProvider
from torch_geometric.data import HeteroData

import gtnorm.anemoi
from benchmarks.anemoi.prebuilt_layouts import PrebuiltLayouts
from benchmarks.anemoi.run import DTYPES, MODULES, ModelSpec, Problem, build_modules, make_problem, run_environment
from benchmarks.graphs.catalog import load_graph
from benchmarks.graphs.measure import TimingSettings, clear_grads, free_memory, measure_call, relative_error
from benchmarks.graphs.report import write_result_files

SIDES = ("shipped", "prebuilt")
MODES = {"train": "training step", "infer": "inference"}
WAYS = ("clone", "provider")  # how a step gets its edge_index (module docstring)
NORM = "layer"  # Anemoi's default QueryNorm / KeyNorm
# Both sides run the same kernels on the same layout: only accumulation order outside gtnorm (cuBLAS, Anemoi's
# scatters) may differ between calls.
AGREEMENT = 1e-3


def make_provider(problem: Problem) -> StaticGraphProvider:
    """Anemoi's StaticGraphProvider holding the problem's graph (batch size 1 expands it to the same content)."""
    num_src = problem.x[0].shape[0]
    num_dst = num_src if problem.kind == "processor" else problem.x[1].shape[0]
    graph = HeteroData()
    graph["edge_index"] = problem.edge_index
    graph["edge_attr"] = problem.edge_attr.detach()
    return StaticGraphProvider(graph, ["edge_attr"], num_src, num_dst, trainable_size=0)


def edge_sources(problem: Problem, way: str) -> dict:
    """side -> a call that returns the problem with the edge_index of one step, got the given way."""
    if way == "clone":

        def fresh_clone() -> Problem:
            return replace(problem, edge_index=problem.edge_index.clone())

        return dict.fromkeys(SIDES, fresh_clone)
    anemoi_provider = make_provider(problem).to(problem.edge_index.device)
    providers = {
        "shipped": gtnorm.anemoi.use_gtnorm_attention(copy.deepcopy(anemoi_provider)),
        "prebuilt": anemoi_provider,
    }

    def from_provider(provider) -> Callable[[], Problem]:
        # The problem's edge_attr (a leaf, so that its gradient is compared), the provider's edge_index.
        return lambda: replace(problem, edge_index=provider.get_edges(batch_size=1)[1])

    return {side: from_provider(provider) for side, provider in providers.items()}


def make_steps(module: torch.nn.Module, new_edges, dtype: torch.dtype, device: torch.device) -> dict:
    """mode -> a call of one step that returns the module's output, each with the edge_index ``new_edges`` gives."""

    def infer() -> torch.Tensor:
        module.eval()
        with torch.inference_mode(), torch.autocast(device.type, dtype=dtype):
            return new_edges().forward(module)

    out = infer()
    # Outside inference_mode (a normal tensor), from a fixed seed: the same for both sides' steps.
    generator = torch.Generator(device).manual_seed(0)
    grad_out = torch.randn(out.shape, generator=generator, device=device, dtype=out.dtype)

    def train() -> torch.Tensor:
        module.train()
        with torch.autocast(device.type, dtype=dtype):
            out = new_edges().forward(module)
        out.backward(grad_out)
        return out

    return {"train": train, "infer": infer}


def host_ms(fn, device: torch.device, leaves, reps: int) -> float:
    """Median time until ``fn`` returns, started on an idle device: what the host spends on a step, including any
    wait for the device inside it."""
    times = []
    for _ in range(reps):
        clear_grads(leaves)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    clear_grads(leaves)
    return 1e3 * statistics.median(times)


def _results(step, leaves, problem: Problem) -> list[torch.Tensor]:
    """The step's output and the problem's input gradients (none in inference)."""
    clear_grads(leaves)
    out = step().detach().float()
    grads = [t.grad.float() for t in problem.leaves() if t.grad is not None]
    clear_grads(leaves)
    return [out, *grads]


def check_agreement(module, problem: Problem, steps: dict, prebuilt: PrebuiltLayouts) -> dict:
    """Records the shipped lookups' layouts, then runs each step on both sides (``steps``: side -> mode -> step)
    and compares: raises if the served layouts are not the graph's or the results differ. Returns, per mode, the
    lookups per step and the results' largest relative difference."""
    leaves = [*problem.leaves(), *module.parameters()]
    checked = {}
    for mode in MODES:
        prebuilt.lookups = 0
        with prebuilt.recording():
            shipped = _results(steps["shipped"][mode], leaves, problem)
        lookups, prebuilt.lookups = prebuilt.lookups, 0
        with prebuilt.serving(check=True):
            served = _results(steps["prebuilt"][mode], leaves, problem)
        if prebuilt.lookups != lookups or lookups == 0:
            raise RuntimeError(f"{mode}: {lookups} shipped lookups per step but {prebuilt.lookups} served")
        difference = max(relative_error(s, p) for s, p in zip(shipped, served, strict=True))
        if difference > AGREEMENT:
            raise RuntimeError(f"{mode}: shipped and prebuilt results differ by {difference:.2e}")
        checked[mode] = {"lookups_per_step": lookups, "max_rel_difference": difference}
    return checked


def measure_row(
    module, problem: Problem, dtype, settings: TimingSettings, device, rounds: int, host_reps: int, way: str = "clone"
):
    """Both sides' times per mode, each step getting its edge_index ``way`` (WAYS), measured in ``rounds``
    alternating rounds (the side first in one round is second in the next); ms and host_ms are the medians over
    rounds."""
    sources = edge_sources(problem, way)
    steps = {side: make_steps(module, sources[side], dtype, device) for side in SIDES}
    prebuilt = PrebuiltLayouts()
    row = {mode: check_agreement(module, problem, steps, prebuilt)[mode] for mode in MODES}
    leaves = {"train": [*problem.leaves(), *module.parameters()], "infer": []}
    sides = {"shipped": nullcontext, "prebuilt": prebuilt.serving}
    for mode in MODES:
        row[mode] |= {side: {"ms": [], "host_ms": []} for side in SIDES}
    for round_index in range(rounds):
        for side in SIDES if round_index % 2 == 0 else SIDES[::-1]:
            with sides[side]():
                for mode, step in steps[side].items():
                    measured = measure_call(step, device, settings, leaves[mode])
                    if not measured.ok:
                        raise RuntimeError(f"{side} {mode}: {measured.status}")
                    row[mode][side]["ms"].append(measured.ms)
                    row[mode][side]["host_ms"].append(host_ms(step, device, leaves[mode], host_reps))
    for mode in MODES:
        for side in SIDES:
            row[mode][side] |= {f"median_{k}": statistics.median(row[mode][side][k]) for k in ("ms", "host_ms")}
        row[mode]["ratio"] = row[mode]["shipped"]["median_ms"] / row[mode]["prebuilt"]["median_ms"]
    return row


def markdown(results: dict) -> str:
    meta = results["meta"]
    lines = [
        "# Layouts found by content vs handed over, inside Anemoi's blocks",
        "",
        f"{meta['device']}; torch {meta['torch']}, anemoi-models {meta['anemoi_models']}; {meta['dtype']} autocast, "
        f"LayerNorm QK norm, batch 1, gradient checkpointing on. Shipped: gtnorm.anemoi as it is. Prebuilt: the same "
        "module and inputs, every lookup served from the layouts recorded for the graph. edge_index: how each step "
        "gets it; clone: a fresh clone every step (shipped: found by content, a device compare and a host sync per "
        "new tensor); provider: Anemoi's StaticGraphProvider.get_edges(batch_size=1) inside the step on both sides "
        "(shipped: the provider converted by use_gtnorm_attention, its edges registered by provenance, found with no "
        "sync; prebuilt: Anemoi's own). ms: median GPU time "
        f"(do_bench), median over {meta['rounds']} alternating rounds; ratio = shipped / prebuilt. Host ms: one "
        "step from an idle GPU until the call returns. Lookups: layout lookups per step. Difference: largest "
        "relative difference of outputs and input gradients between the sides.",
        "",
        "| module | edges | mode | edge_index | lookups | ms shipped | ms prebuilt | ratio | host ms shipped "
        "| host ms prebuilt | difference |",
        "|" + " --- |" * 11,
    ]
    for row in results["rows"]:
        for mode, name in MODES.items():
            m = row[mode]
            cells = [
                row["module"], f"{row['edges']:,}", name, row.get("way", "clone"), str(m["lookups_per_step"]),
                f"{m['shipped']['median_ms']:.2f}", f"{m['prebuilt']['median_ms']:.2f}", f"{m['ratio']:.3f}",
                f"{m['shipped']['median_host_ms']:.2f}", f"{m['prebuilt']['median_host_ms']:.2f}",
                f"{m['max_rel_difference']:.1e}",
            ]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for way in WAYS:
        rows = [row for row in results["rows"] if row.get("way", "clone") == way]
        worst = {name: max((row[mode]["ratio"] for row in rows), default=None) for mode, name in MODES.items()}
        summary = ", ".join(f"{name} {ratio:.3f}" for name, ratio in worst.items() if ratio is not None)
        if summary:
            lines.append(f"Largest ratio, edge_index by {way}: {summary} (target: at most 1.05).")
    lines.append(f"Run time: {meta.get('wall_s', 0):.0f} s.")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.anemoi.layout_reuse", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/anemoi-layout-reuse"), help="output folder")
    parser.add_argument("--modules", nargs="+", choices=list(MODULES), default=list(MODULES), help="rows to run")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp16", help="autocast dtype")
    parser.add_argument("--rep-ms", type=float, default=200.0, help="do_bench's measuring budget per timing")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of both sides")
    parser.add_argument("--host-reps", type=int, default=5, help="steps timed on the host per side and round")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS), help="how steps get their edge_index")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.anemoi.layout_reuse needs a CUDA device")
    device = torch.device("cuda")
    spec = ModelSpec()
    settings = TimingSettings(warmup_ms=25.0, rep_ms=args.rep_ms)
    results = {
        "meta": {
            **run_environment(device, spec),
            "dtype": args.dtype,
            "norm": NORM,
            "rounds": args.rounds,
        },
        "rows": [],
    }
    start = time.perf_counter()
    for name in args.modules:
        kind, graph_name = MODULES[name]
        problem = make_problem(spec, kind, load_graph(graph_name, verbose=True), device)
        module = build_modules(spec, kind, NORM, device)["gtnorm"]
        for way in args.ways:
            row = measure_row(module, problem, DTYPES[args.dtype], settings, device, args.rounds, args.host_reps, way)
            row |= {"module": name, "graph": graph_name, "edges": problem.edge_index.shape[1], "way": way}
            results["rows"].append(row)
            print(f"[{time.perf_counter() - start:6.0f} s] {name}, edge_index by {way}: done", flush=True)
        del module, problem
        free_memory()
    results["meta"]["wall_s"] = time.perf_counter() - start
    text = markdown(results)
    write_result_files(results, args.out, text)
    print(text)
    return results


if __name__ == "__main__":
    main()
