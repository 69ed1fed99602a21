"""The benchmark's quick mode (the default without CUDA): a check and a pointer, not a measurement of the kernels.

Through the Triton interpreter the kernels take seconds per call, and those seconds say nothing about a GPU. So
per graph the fused op runs forward+backward once and is compared with the PyG reference (output and all six
gradients, the same check as the full benchmark's), the PyG path is timed (it runs natively here), and at the
end the committed GPU results are summarised: those are the performance figures.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from benchmarks.graphs.accuracy import check_accuracy
from benchmarks.graphs.catalog import load_graph
from benchmarks.graphs.measure import Settings, free_memory, measure_call
from benchmarks.graphs.report import MODES
from benchmarks.graphs.variants import build_variant, make_inputs

REPO = Path(__file__).resolve().parents[2]
# The committed GPU run of this benchmark: what quick mode and the README show (python -m benchmarks.report).
COMMITTED_GPU_RESULTS = REPO / "benchmarks" / "results" / "h200" / "graphs"
PYG_TIMED_CALLS = 10  # CPU default: median of this many calls of the PyG path (milliseconds each on tiny graphs)

INTRO = """\
Quick mode{reason}: the fused Triton kernels run once per graph (forward and backward) and are checked
against the PyG reference; the PyG path is timed{where}. {interpreter}The GPU performance figures are the
committed results, summarised at the end (full tables: {committed}/results.md).
The full benchmark (every variant timed, a plot): `bash run.sh bench` on a CUDA machine, or --no-quick."""


def run_quick(names: list[str], settings: Settings, device: torch.device, out: Path, meta: dict) -> dict:
    on_gpu = device.type == "cuda"
    print(
        INTRO.format(
            reason="" if on_gpu else " (no CUDA device here)",
            where="" if on_gpu else " on the CPU",
            interpreter=""
            if on_gpu
            else "Here the kernels run through the Triton interpreter (TRITON_INTERPRET=1), ~1 ms per program: "
            "its times are not reported.\n",
            committed=COMMITTED_GPU_RESULTS.relative_to(REPO),
        )
    )
    print(
        f"graphs: {', '.join(names)}; {str(settings.dtype).removeprefix('torch.')}, H={settings.heads}, "
        f"C={settings.channels}, eps={settings.eps:g}; output: {out}",
        flush=True,
    )
    results = {"meta": {**meta, "mode": "quick"}, "graphs": []}
    start = time.perf_counter()
    for index, name in enumerate(names, 1):
        graph = load_graph(name, verbose=True)
        results["graphs"].append(check_graph(graph, settings, device, f"[{index}/{len(names)}] {name}"))
        free_memory()
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(quick_markdown(results))
    print()
    print(quick_markdown(results))
    print(committed_gpu_summary())
    print(f"wrote {out}/results.json, results.md ({time.perf_counter() - start:.0f} s)")
    return results


def check_graph(graph, settings: Settings, device: torch.device, tag: str) -> dict:
    lo, mean, hi = graph.in_degree_stats()
    print(
        f"{tag}: {graph.kind}, {graph.num_src} -> {graph.num_dst} nodes, {graph.num_edges} edges, "
        f"in-degree {lo}/{mean:.1f}/{hi} (min/mean/max)",
        flush=True,
    )
    inputs = make_inputs(graph, settings.heads, settings.channels, settings.dtype, device, settings.eps)
    how = "compiled" if device.type == "cuda" else "through the Triton interpreter"
    print(f"{tag}: fused forward+backward ({how}) against PyG ... ", end="", flush=True)
    start = time.perf_counter()
    # The fused RMSNorm only: the LayerNorm mode doubles the interpreter's time, and the tests cover it.
    accuracy = check_accuracy(inputs, layer_norm=False)
    print(f"done ({time.perf_counter() - start:.1f} s)", flush=True)
    for comparison, errors in accuracy.items():
        print(f"{tag}:   {comparison}: {_errors_text(errors)}", flush=True)

    pyg = build_variant("pyg", inputs)
    calls = {"fwd": lambda: _without_grad(pyg.forward), "fwd_bwd": lambda: pyg.forward().backward(inputs.grad_out)}
    pyg_ms = {}
    for mode, call in calls.items():
        measured = measure_call(call, device, settings.timing, pyg.leaves)
        pyg_ms[mode] = measured.ms if measured.ok else measured.status
    print(f"{tag}: pyg {_pyg_text(pyg_ms)}", flush=True)
    return {
        "name": graph.name,
        "kind": graph.kind,
        "num_src": graph.num_src,
        "num_dst": graph.num_dst,
        "num_edges": graph.num_edges,
        "accuracy": accuracy,
        "pyg_ms": pyg_ms,
    }


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
    return " / ".join(f"{v:.3f}" if isinstance(v, float) else v for v in pyg_ms.values()) + " ms (fwd / fwd+bwd)"


def quick_markdown(results: dict) -> str:
    meta = results["meta"]
    lines = [
        f"## Quick check on {meta['device']} ({meta['dtype']}, H={meta['heads']}, C={meta['channels']})",
        "",
        "Worst relative error ‖a − b‖ / ‖b‖ over the output and the six gradients (dq, dk, dv, de, dwq, dwk); "
        f"'pyg fp32' is the PyG path run in float32 on the same values. PyG time: {meta['timing']}.",
        "",
        "| graph | kind | nodes (src → dst) | edges | fused vs pyg fp32 | pyg vs pyg fp32 | fused vs pyg "
        "| pyg ms fwd / fwd+bwd |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for g in results["graphs"]:
        acc = g["accuracy"]
        lines.append(
            f"| {g['name']} | {g['kind']} | {g['num_src']} → {g['num_dst']} | {g['num_edges']} "
            f"| {_worst(acc.get('fused vs pyg fp32'))} | {_worst(acc.get('pyg vs pyg fp32'))} "
            f"| {_worst(acc.get('fused vs pyg'))} | {_pyg_text(g['pyg_ms']).removesuffix(' ms (fwd / fwd+bwd)')} |"
        )
    return "\n".join(lines) + "\n"


def committed_gpu_summary(folder: Path = COMMITTED_GPU_RESULTS) -> str:
    """The committed GPU run as one markdown table (times, speedup, % of the HBM floor, memory); the README
    shows the same table (tests/benchmarks/test_quick.py keeps the two equal)."""
    results = json.loads((folder / "results.json").read_text())
    meta = results["meta"]
    torch_version = meta["torch"].split("+")[0]
    lines = [
        f"GPU results ({meta['device']}, {meta['dtype']}, H={meta['heads']}, C={meta['channels']}, RMSNorm on q "
        f"and k; torch {torch_version}, triton {meta['triton']}; from {folder.relative_to(REPO)}/). "
        "Times in ms, forward / forward+backward:",
        "",
        "| graph | nodes (src → dst) | edges | pyg | pyg compiled | unfused | fused | fused speedup over pyg "
        "compiled | fused % of HBM floor | extra memory fwd+bwd, MiB: pyg compiled / fused | LayerNorm: "
        "fused_layer speedup over anemoi_layer |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for g in results["graphs"]:
        v = g["variants"]
        times = [
            " / ".join(_ms(v[name][mode]) for mode in MODES) for name in ("pyg", "pyg_compiled", "unfused", "fused")
        ]
        speedup = " / ".join(_factor(g["fused_speedup"]["pyg_compiled"][mode]) for mode in MODES)
        floor = " / ".join(f"{g['fused_pct_of_floor'][mode]:.0f}%" for mode in MODES)
        memory = f"{v['pyg_compiled']['fwd_bwd']['extra_mib']:.0f} / {v['fused']['fwd_bwd']['extra_mib']:.0f}"
        layer = " / ".join(_factor(_over(v, "anemoi_layer", "fused_layer", mode)) for mode in MODES)
        lines.append(
            f"| {g['name']} ({g['kind']}) | {g['num_src']:,} → {g['num_dst']:,} | {g['num_edges']:,} | "
            + " | ".join(times)
            + f" | {speedup} | {floor} | {memory} | {layer} |"
        )
    lines += [
        "",
        "pyg: torch.nn.RMSNorm + PyG MessagePassing (eager; compiled: torch.compile); unfused: gtnorm.rms_norm + "
        "the attention kernels without the norm; fused: the norm inside the attention kernels. % of HBM floor: "
        "the time it takes to move every byte that must move once at the measured copy bandwidth, over the "
        "fused time. anemoi_layer: torch's LayerNorm on q and k + Anemoi's Triton kernel; fused_layer: gtnorm with "
        "the LayerNorm inside its kernels.",
    ]
    return "\n".join(lines) + "\n"


def _over(variants: dict, slower: str, faster: str, mode: str) -> float | None:
    a, b = variants.get(slower, {}).get(mode, {}), variants.get(faster, {}).get(mode, {})
    return a["ms"] / b["ms"] if a.get("status") == "ok" and b.get("status") == "ok" else None


def _ms(measured: dict) -> str:
    return f"{measured['ms']:.2f}" if measured["status"] == "ok" else measured["status"].split(":")[0]


def _factor(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}×"
