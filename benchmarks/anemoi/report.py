"""The in-block benchmark's results as results.json, results.md and results.png, and the short table printed last."""

from __future__ import annotations

from pathlib import Path

from benchmarks.graphs.report import write_result_files

MODES = {"train": "training step", "infer": "inference"}


def write_outputs(results: dict, out_dir: Path, plot: bool = True) -> None:
    write_result_files(results, out_dir, markdown(results), write_plot if plot and results["rows"] else None)


def speedup(row: dict, mode: str, anemoi: str = "anemoi", gtnorm: str = "gtnorm") -> float | None:
    """Anemoi's time / gtnorm's time (above 1: gtnorm is faster), eager against eager unless sides are named."""
    return _ratio(row, anemoi, gtnorm, mode)


def best_speedup(row: dict, mode: str) -> float | None:
    """Anemoi's faster mode (eager or compiled) against gtnorm's faster mode."""
    best = {side: _best_ms(row, side, mode) for side in ("anemoi", "gtnorm")}
    return best["anemoi"] / best["gtnorm"] if None not in best.values() else None


def _best_ms(row: dict, side: str, mode: str) -> float | None:
    times = [_ok(row, s, mode).get("ms") for s in (side, f"{side}_compiled")]
    times = [t for t in times if t]
    return min(times) if times else None


def _ok(row: dict, side: str, mode: str) -> dict:
    measured = row.get(side, {}).get(mode, {})
    return measured if measured.get("status") == "ok" else {}


def _ratio(row: dict, numerator: str, denominator: str, mode: str, quantity: str = "ms") -> float | None:
    """numerator's ``quantity`` over denominator's (e.g. ms: the second side's speed-up over the first)."""
    a, g = _ok(row, numerator, mode).get(quantity), _ok(row, denominator, mode).get(quantity)
    return a / g if a and g else None  # None: failed, or not measured (memory without CUDA)


def memory_saving(row: dict, mode: str, anemoi: str = "anemoi", gtnorm: str = "gtnorm") -> float | None:
    """1 - gtnorm's extra peak memory / Anemoi's (above 0: gtnorm needs less)."""
    ratio = _ratio(row, gtnorm, anemoi, mode, "extra_mib")
    return 1.0 - ratio if ratio is not None else None


def _cell(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _measured(row: dict, side: str, mode: str, key: str, fmt: str) -> str:
    m = row.get(side, {}).get(mode, {})
    return _cell(m.get(key), fmt) if m.get("status") == "ok" else m.get("status", "–").split(":")[0]


SIDE_NAMES = {
    "anemoi": "Anemoi",
    "anemoi_compiled": "Anemoi compiled",
    "gtnorm": "gtnorm",
    "gtnorm_compiled": "gtnorm compiled",
}
COMPILED = ("anemoi_compiled", "gtnorm_compiled")


def markdown(results: dict) -> str:
    meta, model = results["meta"], results["meta"]["model"]
    sides = list(SIDE_NAMES)
    lines = [
        "# gtnorm in Anemoi's blocks: anemoi-models' Triton backend vs gtnorm.anemoi, eager and compiled",
        "",
        f"{meta['device']}; torch {meta['torch']}, triton {meta['triton']}, anemoi-models {meta['anemoi_models']}. "
        f"{model['num_channels']} channels, {model['num_heads']} heads of "
        f"{model['num_channels'] // model['num_heads']}, MLP ratio {model['mlp_hidden_ratio']:g}; processor of "
        f"{model['processor_layers']} layers; batch 1; gradient checkpointing on (Anemoi's default); a new "
        "edge_index tensor every call (gtnorm's registered as its graph provider does). Compiled: "
        f"torch.compile(module), mode {meta.get('compile_mode', 'default')}. Times: median ms "
        f"(triton.testing.do_bench, at least {meta.get('min_calls', 1)} timed calls), the median over "
        f"{meta.get('rounds', 1)} round(s) of every side in turn. Memory: extra peak MiB of one call over what was "
        "allocated before it. compiled × = Anemoi compiled / gtnorm compiled; best × = Anemoi's faster mode / "
        "gtnorm's faster mode. First call: seconds of the first training step (compiling included), apart from the "
        "timed steps. Output error: gtnorm's inference output against Anemoi's (norm-wise relative).",
        "",
    ]
    for mode, name in MODES.items():
        lines += [
            f"## {name}",
            "",
            "| module | QK norm | autocast | "
            + " | ".join(f"ms {SIDE_NAMES[s]}" for s in sides)
            + " | eager × | compiled × | best × | "
            + " | ".join(f"extra MiB {SIDE_NAMES[s]}" for s in sides)
            + (" | first call s Anemoi compiled | first call s gtnorm compiled |" if mode == "train" else " |"),
            "|" + " --- |" * (3 + 2 * len(sides) + 3 + (2 if mode == "train" else 0)),
        ]
        for row in results["rows"]:
            cells = [row["module"], row["norm"], row["dtype"]]
            cells += [_measured(row, s, mode, "ms", ".2f") for s in sides]
            cells += [
                _cell(speedup(row, mode), ".2f") + "×",
                _cell(speedup(row, mode, "anemoi_compiled", "gtnorm_compiled"), ".2f") + "×",
                _cell(best_speedup(row, mode), ".2f") + "×",
            ]
            cells += [_measured(row, s, mode, "extra_mib", ".0f") for s in sides]
            if mode == "train":
                cells += [_measured(row, s, mode, "first_call_s", ".1f") for s in COMPILED]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    errors = ", ".join(
        f"{r['module']} {r['norm']} {r['dtype']}: {_cell(r.get('output_rel_error'), '.1e')}" for r in results["rows"]
    )
    lines += [f"Output error: {errors}.", "", f"Run time: {meta.get('wall_s', 0):.0f} s."]
    return "\n".join(lines) + "\n"


def print_summary(results: dict) -> None:
    print(f"\n{results['meta']['device']}: gtnorm.anemoi vs Anemoi's Triton backend (speed-up x, memory saving %)")
    print(f"{'module':<18} {'norm':<6} {'dtype':<5} {'mode':<6} {'eager':>7} {'compiled':>9} {'best':>7} {'mem':>6}")
    for row in results["rows"]:
        for mode in MODES:
            print(
                f"{row['module']:<18} {row['norm']:<6} {row['dtype']:<5} {mode:<6} "
                f"{_cell(speedup(row, mode), '6.2f')}x "
                f"{_cell(speedup(row, mode, 'anemoi_compiled', 'gtnorm_compiled'), '8.2f')}x "
                f"{_cell(best_speedup(row, mode), '6.2f')}x {_cell(memory_saving(row, mode), '6.0%')}"
            )


def write_plot(results: dict, path: Path) -> None:
    """Speed-ups (training step, inference) and training memory saving per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    labels = [f"{r['module']}\n{r['norm']} {r['dtype']}" for r in rows]
    xs = range(len(rows))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(3 + 0.55 * len(rows), 7), constrained_layout=True)
    width = 0.4
    for i, (mode, name) in enumerate(MODES.items()):
        values = [best_speedup(r, mode) or 0.0 for r in rows]
        top.bar([x + (i - 0.5) * width for x in xs], values, width, label=name, color=f"C{i}")
    top.axhline(1.0, color="black", linewidth=0.8)
    top.set_ylabel("speed-up, faster mode of each (×)")
    top.legend(fontsize=8)
    for i, (mode, name) in enumerate(MODES.items()):
        values = [100 * (memory_saving(r, mode) or 0.0) for r in rows]
        bottom.bar([x + (i - 0.5) * width for x in xs], values, width, label=name, color=f"C{i}")
    bottom.axhline(0.0, color="black", linewidth=0.8)
    bottom.set_ylabel("extra peak memory saved (%)")
    for ax in (top, bottom):
        ax.set_xticks(list(xs), labels, rotation=90, fontsize=7)
    fig.suptitle(f"gtnorm.anemoi in Anemoi's blocks, {results['meta']['device']}")
    fig.savefig(path, dpi=110)
    plt.close(fig)
