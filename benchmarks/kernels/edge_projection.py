"""The fused edge projection against Anemoi's lin_edge materialised before the kernels, in one run:

    python -m benchmarks.kernels.edge_projection [--suite full|small|tiny] [--dtype bfloat16] [--out DIR]

Both variants (benchmarks/graphs/variants.py) take raw attributes [M, 11] (float32, requiring grad, as Anemoi's
trainable edge parameters do) and lin_edge's float32 weight and bias, with LayerNorm on q and k (Anemoi's
default): ``lin_edge_fused_layer`` forms e = F.linear(...) in the operands' dtype (as autocast runs lin_edge) and
calls the fused LayerNorm kernels on it; ``fused_projection`` hands the raw attributes to the kernels. Per graph:

- correctness: output and every gradient (q, k, v, raw attributes, lin_edge weight and bias, norm parameters) of
  both against the materialised path run in float32 on the same values; the fused variant passes where its error
  is at most 1.5x the materialised one's + 1e-3 (the tests' rule);
- forward and forward+backward time (CUDA events, median), peak memory of one call and what it adds to the
  inputs ("extra": e, de and everything else the call allocates);
- the fused time as % of its HBM floor (``projection_floor_bytes``) and the speedup over the materialised path.

The materialised edge features the other benchmark variants take as input (BenchInputs.edge_attr) are dropped
first, so the memory columns show only what these two variants allocate. Writes DIR/edge_projection.json and
prints a table at the end. With a GPU the default is the full suite; without one the tiny suite runs through the
Triton interpreter (a smoke test: its times say nothing).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks.graphs.catalog import SUITES, load_graph
from benchmarks.graphs.measure import (
    MIB,
    TimingSettings,
    clear_grads,
    copy_bandwidth,
    free_memory,
    guarded,
    hbm_floor_bytes,
    measure_call,
    relative_error,
)
from benchmarks.graphs.variants import (
    PROJECTION_VARIANTS,
    BenchInputs,
    EdgeProjectionInputs,
    build_variant,
    cast_inputs,
    edge_projection_inputs,
    make_inputs,
)
from gtnorm._runtime import resolve_eps

RESULT_NAMES = ("out", "dq", "dk", "dv", "dx", "dW", "db", "dwq", "dbq", "dwk", "dbk")
# d k_norm_bias is 0 in exact arithmetic (tests/graphs.py, key_bias_error): a relative error means nothing there.
REPORTED_ONLY = ("dbk",)
# The norm parameters' gradients each norm kind has.
NORM_RESULTS = {"layer": ("dwq", "dbq", "dwk", "dbk"), "rms": ("dwq", "dwk"), "none": ()}


def projection_floor_bytes(layout, row_bytes: int, edge_dim: int, feature_bytes: int = 4) -> tuple[int, int]:
    """Bytes the fused projection cannot avoid moving, (forward, forward + backward): measure.hbm_floor_bytes
    without the edge features' rows (e read in the forward, e read and de written in the backward), with the raw
    attributes instead (read in the forward, read and d(attributes) written in the backward). The weight and bias
    ([D + 1, H * C], read in each pass and their gradients written once) are a few tens of kB, left out."""
    forward, total = hbm_floor_bytes(layout, row_bytes)
    edges, attributes = layout.num_edges, layout.num_edges * edge_dim * feature_bytes
    return forward - edges * row_bytes + attributes, total - 3 * edges * row_bytes + 3 * attributes


def outputs_and_grads(name: str, inputs: BenchInputs) -> list[torch.Tensor]:
    variant = build_variant(name, inputs)
    clear_grads(variant.leaves)
    out = variant.forward()
    grads = torch.autograd.grad(out, variant.leaves, inputs.grad_out)
    return [out.detach(), *grads]


def float32_copy(inputs: BenchInputs) -> BenchInputs:
    """The same values in float32, as fresh leaves, the projection inputs included."""
    exact = cast_inputs(inputs, torch.float32)
    exact.projection_norm, exact.projection_edge_dim = inputs.projection_norm, inputs.projection_edge_dim
    projection = edge_projection_inputs(inputs, inputs.projection_edge_dim)
    fresh = [t.detach().clone().requires_grad_() for t in projection.leaves]
    exact.edge_projection = EdgeProjectionInputs(*fresh)
    return exact


def check(inputs: BenchInputs) -> dict:
    """{variant: {result: error against the float32 materialised path}}, "passed", or why there is none."""

    def run() -> dict:
        reference = outputs_and_grads("lin_edge_fused_layer", float32_copy(inputs))
        names = [n for n in RESULT_NAMES if n in NORM_RESULTS[inputs.projection_norm] or n not in NORM_RESULTS["layer"]]
        errors = {}
        for name in PROJECTION_VARIANTS:
            results = outputs_and_grads(name, inputs)
            errors[name] = {n: relative_error(a, b) for n, a, b in zip(names, results, reference, strict=True)}
            del results
            free_memory()
        fused, materialised = errors["fused_projection"], errors["lin_edge_fused_layer"]
        errors["passed"] = all(fused[n] <= 1.5 * materialised[n] + 1e-3 for n in names if n not in REPORTED_ONLY)
        return errors

    errors, status = guarded(run)
    free_memory()
    return errors if errors is not None else {"status": status}


def benchmark_graph(
    name: str, dtype, heads: int, channels: int, device, timing, bandwidth: float, norm="layer", edge_dim=11
) -> dict:
    graph = load_graph(name, verbose=True)
    print(f"{name}: {graph.num_src} -> {graph.num_dst} nodes, {graph.num_edges} edges", flush=True)
    inputs = make_inputs(graph, heads, channels, dtype, device, resolve_eps(None, dtype))
    inputs.projection_norm, inputs.projection_edge_dim = norm, edge_dim
    projection = edge_projection_inputs(inputs)
    inputs.edge_attr = inputs.edge_attr.new_empty((0,))  # the other variants' e: not an input of these two
    free_memory()
    row_bytes = heads * channels * inputs.query.element_size()
    floor = {
        "materialised": hbm_floor_bytes(inputs.layout, row_bytes),
        "fused": projection_floor_bytes(inputs.layout, row_bytes, projection.edge_features.shape[1]),
    }
    result = {
        "graph": name,
        "norm": norm,
        "edge_dim": edge_dim,
        "num_src": graph.num_src,
        "num_dst": graph.num_dst,
        "num_edges": graph.num_edges,
        "floor_ms": {k: [1e3 * b / bandwidth for b in v] for k, v in floor.items()},
        "accuracy": check(inputs),
        "variants": {},
    }
    print(f"{name}: accuracy {result['accuracy']}", flush=True)
    for variant_name in PROJECTION_VARIANTS:
        variant = build_variant(variant_name, inputs)
        modes = {
            "fwd": lambda v=variant: _without_grad(v.forward),
            "fwd_bwd": lambda v=variant, g=inputs.grad_out: v.forward().backward(g),
        }
        result["variants"][variant_name] = {}
        for mode, call in modes.items():
            measured = measure_call(call, device, timing, variant.leaves)
            result["variants"][variant_name][mode] = vars(measured)
            print(f"{name} {variant_name:22s} {mode:8s} {measured}", flush=True)
            free_memory()
    del inputs, projection
    free_memory()
    return result


def _without_grad(forward):
    with torch.no_grad():
        return forward()


def table(results: list[dict]) -> str:
    lines = [
        "| graph | variant | fwd ms | fwd+bwd ms | fwd+bwd peak MiB (extra) | speedup fwd / fwd+bwd | "
        "% of own floor fwd / fwd+bwd | check |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        base = r["variants"].get("lin_edge_fused_layer", {})
        for name, modes in r["variants"].items():
            ms = [modes[m]["ms"] for m in ("fwd", "fwd_bwd")]
            speedup = [
                f"{base[m]['ms'] / t:.2f}x" if t and base.get(m, {}).get("ms") else "-"
                for m, t in zip(("fwd", "fwd_bwd"), ms, strict=True)
            ]
            floor = r["floor_ms"]["fused" if name == "fused_projection" else "materialised"]
            pct = [f"{100 * f / t:.0f}%" if t else "-" for f, t in zip(floor, ms, strict=True)]
            peak, extra = modes["fwd_bwd"]["peak_mib"], modes["fwd_bwd"]["extra_mib"]
            memory = f"{peak:.0f} ({extra:.0f})" if peak is not None else "-"
            times = [f"{t:.3f}" if t else modes[m]["status"] for t, m in zip(ms, ("fwd", "fwd_bwd"), strict=True)]
            accuracy = r["accuracy"]
            passed = accuracy.get("passed", accuracy.get("status")) if name == "fused_projection" else ""
            lines.append(
                f"| {r['graph']} {r['norm']} | {name} | {times[0]} | {times[1]} | {memory} | {' / '.join(speedup)} | "
                f"{' / '.join(pct)} | {passed} |"
            )
    lines.append("")
    lines.append("Errors against the float32 materialised path (fused / materialised):")
    for r in results:
        errors = r["accuracy"]
        if "fused_projection" not in errors:
            lines.append(f"- {r['graph']}: {errors}")
            continue
        pairs = ", ".join(
            f"{n} {errors['fused_projection'][n]:.1e} / {errors['lin_edge_fused_layer'][n]:.1e}"
            for n in errors["fused_projection"]
        )
        lines.append(f"- {r['graph']}: {pairs}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    on_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=list(SUITES), default="full" if on_gpu else "tiny")
    parser.add_argument("--graphs", nargs="*", help="graph names instead of a suite")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--heads", type=int, default=16 if on_gpu else 2)
    parser.add_argument("--channels", type=int, default=64 if on_gpu else 16)
    parser.add_argument("--out", type=Path, default=None, help="folder for edge_projection.json")
    parser.add_argument("--norms", nargs="+", default=["layer"], choices=["layer", "rms", "none"])
    parser.add_argument("--edge-dim", type=int, default=11, help="D, raw attributes per edge")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = getattr(torch, args.dtype)
    timing = TimingSettings()
    bandwidth = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name() if on_gpu else 'cpu'}: copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    results = []
    for name in args.graphs or SUITES[args.suite]:
        for norm in args.norms:
            results.append(
                benchmark_graph(name, dtype, args.heads, args.channels, device, timing, bandwidth, norm, args.edge_dim)
            )
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "edge_projection.json").write_text(json.dumps(results, indent=1, default=str))
    print()
    print(f"{args.dtype}, H = {args.heads}, C = {args.channels}, raw attributes [M, {args.edge_dim}] float32; peak MiB")
    print("fwd+bwd call (extra: over what was allocated before it); speedup: lin_edge_fused_layer's time / this")
    print(table(results))
    print(f"(MiB = {MIB} bytes)")
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
