"""Turns the run's results (one JSON-ready dict) into results.json, results.md (also printed) and results.png."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.graphs.accuracy import RESULT_NAMES
from benchmarks.graphs.variants import DESCRIPTIONS

MODES = {"fwd": "forward", "fwd_bwd": "forward+backward"}
NOT_PERFORMANCE = (
    "**These times are NOT performance figures**: there is no CUDA device, so the Triton kernels run through "
    "the Triton interpreter on the CPU (TRITON_INTERPRET=1). This run only shows that the harness works."
)


def write_outputs(results: dict, out_dir: Path, plot: bool = True) -> None:
    write_result_files(results, out_dir, markdown(results), write_plot if plot and results["graphs"] else None)


def write_result_files(results: dict, out_dir: Path, markdown_text: str, draw_plot=None) -> None:
    """results.json and results.md in out_dir, and results.png by ``draw_plot(results, path)`` if given (shared
    with the in-block benchmark, benchmarks/anemoi/report.py)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out_dir / "results.md").write_text(markdown_text)
    if draw_plot is not None:
        try:
            draw_plot(results, out_dir / "results.png")
        except Exception as exc:  # noqa: BLE001 - the numbers are written; a plotting problem must not end the run
            print(f"results.png not written: {type(exc).__name__}: {exc}")


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header, rows) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def _num(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _time_cell(m: dict) -> str:
    return _num(m["ms"], ".3f") if m["status"] == "ok" else m["status"].split(":")[0]


def _memory_cell(m: dict) -> str:
    if m["status"] != "ok":
        return m["status"].split(":")[0]
    if m["peak_mib"] is None:
        return "n/a"
    return f"{m['peak_mib']:.0f} ({m['extra_mib']:.0f})"


def _pair(pair: dict | None, fmt: str, suffix: str = "") -> str:
    if not pair:
        return ""
    return " / ".join(_num(pair[mode], fmt) + (suffix if pair[mode] is not None else "") for mode in MODES)


def markdown(results: dict) -> str:
    meta = results["meta"]
    lines = ["# gtnorm graph benchmark", ""]
    if not meta["performance_figures"]:
        lines += [NOT_PERFORMANCE, ""]
    lines += [
        f"- device: {meta['device']}; torch {meta['torch']}, triton {meta['triton']}, "
        f"torch_geometric {meta['torch_geometric']}, gtnorm {meta['gtnorm']}",
        f"- inputs: q, k, v, e of {meta['dtype']}, H={meta['heads']}, C={meta['channels']}, eps={meta['eps']}; "
        "RMSNorm weights 1 + 0.1·randn, shared by all variants",
        f"- timing: {meta['timing']}; forward runs under torch.no_grad, forward+backward backpropagates a fixed "
        "random dO with leaf grads set to None before every call",
        "- copy bandwidth (device-to-device, bytes read + written): "
        f"{meta['copy_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s",
        "",
        "Variants:",
        *(f"- `{name}`: {text}" for name, text in DESCRIPTIONS.items()),
        "",
        "## Graphs",
        "",
    ]
    lines += _table(
        [
            "graph",
            "kind",
            "source nodes",
            "destination nodes",
            "edges",
            "in-degree min / mean / max",
            "inputs MiB",
            "HBM floor fwd / fwd+bwd (MB)",
            "floor time fwd / fwd+bwd (ms)",
        ],
        [
            [
                g["name"],
                g["kind"],
                g["num_src"],
                g["num_dst"],
                g["num_edges"],
                f"{g['in_degree']['min']} / {g['in_degree']['mean']:.1f} / {g['in_degree']['max']}",
                f"{g['inputs_mib']:.1f}",
                f"{g['floor']['fwd_bytes'] / 1e6:.1f} / {g['floor']['fwd_bwd_bytes'] / 1e6:.1f}",
                f"{g['floor']['fwd_ms']:.3f} / {g['floor']['fwd_bwd_ms']:.3f}",
            ]
            for g in results["graphs"]
        ],
    )
    lines += ["", "## Time and memory", ""]
    if not meta["performance_figures"]:
        lines += [NOT_PERFORMANCE, ""]
    rows, failures = [], {}
    for g in results["graphs"]:
        for name, modes in g["variants"].items():
            rows.append(
                [
                    g["name"],
                    name,
                    _time_cell(modes["fwd"]),
                    _time_cell(modes["fwd_bwd"]),
                    _memory_cell(modes["fwd"]),
                    _memory_cell(modes["fwd_bwd"]),
                    _pair(g["fused_speedup"].get(name), ".3g", "×"),
                    _pair(g["fused_pct_of_floor"], ".3g", "%") if name == "fused" else "",
                ]
            )
            for mode, m in modes.items():
                if m["status"] != "ok":
                    failures.setdefault((name, m["status"]), []).append(f"{g['name']} {MODES[mode]}")
    lines += _table(
        [
            "graph",
            "variant",
            "fwd ms",
            "fwd+bwd ms",
            "fwd MiB peak (extra)",
            "fwd+bwd MiB peak (extra)",
            "fused speedup fwd / fwd+bwd",
            "fused % of floor fwd / fwd+bwd",
        ],
        rows,
    )
    lines += [
        "",
        "- ms: median time of one call. MiB peak: torch.cuda.max_memory_allocated during one call, the inputs "
        "(q, k, v, e, dO, weights, layout) included; (extra): that peak minus what was allocated before the call.",
        "- fused speedup: the variant's time / the fused time.",
        "- fused % of floor: HBM floor time / fused time, where the floor time = bytes that must move once "
        "(fwd: q, k, v, e, out; bwd: q, k, v, e, dO, dq, dk, dv, de; plus index arrays) / copy bandwidth. "
        "100% would mean every byte moved exactly once at copy speed.",
    ]
    if failures:
        every_run = 2 * len(results["graphs"])
        lines += ["", "Not measured:"]
        lines += [
            f"- `{name}`, {'every graph and mode' if len(where) == every_run else ', '.join(where)}: {status}"
            for (name, status), where in failures.items()
        ]
    lines += ["", "## Accuracy (‖a − b‖ / ‖b‖, once per graph, on the inputs above)", ""]
    acc_rows = []
    for g in results["graphs"]:
        for comparison, errors in (g["accuracy"] or {}).items():
            cells = (
                [errors] * len(RESULT_NAMES)
                if isinstance(errors, str)
                else [f"{errors[name]:.2e}" for name in RESULT_NAMES]
            )
            acc_rows.append([g["name"], comparison, *cells])
    if acc_rows:
        lines += _table(["graph", "a vs b", *RESULT_NAMES], acc_rows)
    else:
        lines.append("not run (--no-check)")
    return "\n".join(lines) + "\n"


def write_plot(results: dict, path: Path) -> None:
    """Time (log scale) and, where measured, peak memory per graph and variant; forward and forward+backward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graphs = results["graphs"]
    variants = list(graphs[0]["variants"])
    measured_memory = any(
        m["peak_mib"] is not None for g in graphs for modes in g["variants"].values() for m in modes.values()
    )
    panels = [("ms", "time (ms)")] + ([("peak_mib", "peak memory (MiB)")] if measured_memory else [])
    width = 0.8 / len(variants)
    fig, axes = plt.subplots(
        len(panels), 2, figsize=(4 + 2.4 * len(graphs), 1 + 3.6 * len(panels)), squeeze=False, constrained_layout=True
    )
    for col, (mode, mode_name) in enumerate(MODES.items()):
        for row, (key, label) in enumerate(panels):
            ax = axes[row][col]
            for i, name in enumerate(variants):
                xs = [j + (i - (len(variants) - 1) / 2) * width for j in range(len(graphs))]
                measured = [g["variants"][name][mode] for g in graphs]
                values = [m[key] if m["status"] == "ok" and m[key] is not None else 0 for m in measured]
                ax.bar(xs, values, width, label=name, color=f"C{i}")
                if key == "peak_mib":  # hatched: what was allocated before the call (the inputs)
                    held = [v - m["extra_mib"] if v else 0 for v, m in zip(values, measured, strict=True)]
                    ax.bar(xs, held, width, fill=False, hatch="//", edgecolor="white", linewidth=0)
                for x, m in zip(xs, measured, strict=True):
                    if m["status"] != "ok":  # mark the gap: OOM, error or skipped
                        ax.annotate(
                            m["status"].split(":")[0],
                            (x, 0.02),
                            xycoords=("data", "axes fraction"),
                            rotation=90,
                            ha="center",
                            va="bottom",
                            fontsize=7,
                        )
            if key == "ms":
                ax.set_yscale("log")
            ax.set_xticks(range(len(graphs)), [g["name"] for g in graphs])
            ax.set_title(f"{mode_name}: {label.split(' (')[0]}")
            ax.set_ylabel(label)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(variants), fontsize=8)
    meta = results["meta"]
    title = f"gtnorm: {meta['device']}, {meta['dtype']}, H={meta['heads']}, C={meta['channels']}"
    if measured_memory:
        title += " (hatched: memory allocated before the call)"
    if not meta["performance_figures"]:
        title += "\nTriton interpreter on the CPU: NOT performance figures, no peak memory"
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
