"""The in-block benchmark's results as results.json, results.md and results.png, and the short table printed last."""

from __future__ import annotations

from pathlib import Path

from benchmarks.graphs.report import write_result_files

MODES = {"train": "training step", "infer": "inference"}


def write_outputs(results: dict, out_dir: Path, plot: bool = True) -> None:
    write_result_files(results, out_dir, markdown(results), write_plot if plot and results["rows"] else None)


def speedup(row: dict, mode: str) -> float | None:
    """Anemoi's time / gtnorm's time (above 1: gtnorm is faster)."""
    return _ratio(row, "anemoi", "gtnorm", mode)


def _ratio(row: dict, numerator: str, denominator: str, mode: str, quantity: str = "ms") -> float | None:
    """numerator's ``quantity`` over denominator's (e.g. ms: the second side's speed-up over the first)."""
    a, g = (row.get(side, {}).get(mode, {}) for side in (numerator, denominator))
    if a.get("status") != "ok" or g.get("status") != "ok" or not a.get(quantity) or not g.get(quantity):
        return None  # failed, or not measured (memory without CUDA)
    return a[quantity] / g[quantity]


def memory_saving(row: dict, mode: str) -> float | None:
    """1 - gtnorm's extra peak memory / Anemoi's (above 0: gtnorm needs less)."""
    a, g = (row.get(side, {}).get(mode, {}) for side in ("anemoi", "gtnorm"))
    if a.get("status") != "ok" or g.get("status") != "ok" or not a["extra_mib"]:
        return None
    return 1.0 - g["extra_mib"] / a["extra_mib"]


def _cell(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _measured(row: dict, side: str, mode: str, key: str, fmt: str) -> str:
    m = row.get(side, {}).get(mode, {})
    return _cell(m.get(key), fmt) if m.get("status") == "ok" else m.get("status", "–").split(":")[0]


def markdown(results: dict) -> str:
    meta, model = results["meta"], results["meta"]["model"]
    lines = [
        "# gtnorm in Anemoi's blocks: anemoi-models' Triton backend vs gtnorm.anemoi",
        "",
        f"{meta['device']}; torch {meta['torch']}, triton {meta['triton']}, anemoi-models {meta['anemoi_models']}. "
        f"{model['num_channels']} channels, {model['num_heads']} heads of "
        f"{model['num_channels'] // model['num_heads']}, MLP ratio {model['mlp_hidden_ratio']:g}; processor of "
        f"{model['processor_layers']} layers; batch 1; gradient checkpointing on (Anemoi's default). Times: median "
        f"ms (triton.testing.do_bench), the median over {meta.get('rounds', 1)} round(s) of every side in turn. "
        "Memory: extra peak MiB of one call over what was allocated before it. "
        "Speed-up = Anemoi's time / gtnorm's; saving = 1 - gtnorm's extra memory / Anemoi's. Output error: "
        "gtnorm's inference output against Anemoi's (norm-wise relative). gtnorm runs lin_edge inside the kernels "
        "where the block allows it (as shipped); materialised e: the same with FUSE_EDGE_PROJECTION off; fusion "
        "gain = that training step / gtnorm's, fusion memory = gtnorm's extra training memory / that one's.",
        "",
        "| module | QK norm | autocast | train ms Anemoi | train ms gtnorm | train speed-up | infer ms Anemoi "
        "| infer ms gtnorm | infer speed-up | train extra MiB Anemoi | gtnorm | saving | infer saving | output error "
        "| train ms gtnorm, materialised e | fusion gain | fusion memory |",
        "|" + " --- |" * 17,
    ]
    for row in results["rows"]:
        cells = [
            row["module"],
            row["norm"],
            row["dtype"],
            _measured(row, "anemoi", "train", "ms", ".2f"),
            _measured(row, "gtnorm", "train", "ms", ".2f"),
            _cell(speedup(row, "train"), ".2f") + "×",
            _measured(row, "anemoi", "infer", "ms", ".2f"),
            _measured(row, "gtnorm", "infer", "ms", ".2f"),
            _cell(speedup(row, "infer"), ".2f") + "×",
            _measured(row, "anemoi", "train", "extra_mib", ".0f"),
            _measured(row, "gtnorm", "train", "extra_mib", ".0f"),
            _cell(memory_saving(row, "train"), ".0%"),
            _cell(memory_saving(row, "infer"), ".0%"),
            _cell(row.get("output_rel_error"), ".1e"),
            _measured(row, "gtnorm_materialised_e", "train", "ms", ".2f"),
            _cell(_ratio(row, "gtnorm_materialised_e", "gtnorm", "train"), ".2f") + "×",
            _cell(_ratio(row, "gtnorm", "gtnorm_materialised_e", "train", "extra_mib"), ".2f") + "×",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Run time: {meta.get('wall_s', 0):.0f} s."]
    return "\n".join(lines) + "\n"


def print_summary(results: dict) -> None:
    print(f"\n{results['meta']['device']}: gtnorm.anemoi vs Anemoi's Triton backend (speed-up x, memory saving %)")
    print(f"{'module':<18} {'norm':<6} {'dtype':<5} {'train':>7} {'infer':>7} {'train mem':>10} {'infer mem':>10}")
    for row in results["rows"]:
        print(
            f"{row['module']:<18} {row['norm']:<6} {row['dtype']:<5} "
            f"{_cell(speedup(row, 'train'), '6.2f')}x {_cell(speedup(row, 'infer'), '6.2f')}x "
            f"{_cell(memory_saving(row, 'train'), '9.0%')} {_cell(memory_saving(row, 'infer'), '9.0%')}"
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
        values = [speedup(r, mode) or 0.0 for r in rows]
        top.bar([x + (i - 0.5) * width for x in xs], values, width, label=name, color=f"C{i}")
    top.axhline(1.0, color="black", linewidth=0.8)
    top.set_ylabel("speed-up over Anemoi's Triton backend (×)")
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
