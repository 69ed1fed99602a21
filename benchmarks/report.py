"""The report command: the result tables of the README and of the docs pages, and the README's figure, from the
committed results.

    python -m benchmarks.report            # rewrite the pages' generated sections and the figure
    python -m benchmarks.report --check    # exit 1 where a page and the results disagree (CI's test)

One results folder per device and kind of run (``benchmarks/results/<device>/<kind>/``, each with a README that
names command and code); a new run replaces its folder, then this command brings the pages up to date. Each
generated section sits between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->`` on the page PAGES names, and
its caption names the GPU and the date of the run (benchmarks/results_date.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.anemoi.report import _measured, best_speedup, memory_saving, speedup
from benchmarks.graphs.quick import COMMITTED_GPU_RESULTS, REPO, committed_gpu_summary
from benchmarks.model.report import DEFAULT_MAPPER_CHUNKS
from benchmarks.model.report import readme_table as model_readme_table
from benchmarks.results_date import run_date

RESULTS = REPO / "benchmarks" / "results"
IN_BLOCK = RESULTS / "h200" / "anemoi"
# The bare op on the other GPU kind, from its own run (its table sits in docs/performance.md).
H100_GRAPHS = RESULTS / "h100" / "graphs"
WHOLE_MODEL = RESULTS / "h200" / "model"
WHOLE_MODEL_O320 = RESULTS / "h200" / "model-o320"  # compiled variants each in its own process
WHOLE_MODEL_O800 = RESULTS / "h200" / "model-o800"  # each variant in its own process
WHOLE_MODEL_HIGH_RESOLUTION = RESULTS / "h200" / "model-o1280"  # each variant in its own process (memory binds)
WHOLE_MODEL_LATITUDE = RESULTS / "h200" / "model-latitude"  # the graphs numbered as anemoi-graphs numbers them
WHOLE_MODEL_MODES = RESULTS / "h200" / "model-modes"  # every compile mode of both sides in one row
WHOLE_MODEL_LAST_CHUNK = RESULTS / "h200" / "model-lastchunk"  # the decoder's last chunk kept; O96 every mode
WHOLE_MODEL_O96_OFF = RESULTS / "h200" / "model-o96-off"  # O96 without a QK norm, every mode on both sides
WHOLE_MODEL_O1280_MODES = RESULTS / "h200" / "model-o1280-modes"  # O1280 at 4 and 16 chunks; the whole mode there
SEVERAL_GPUS = RESULTS / "h200x2" / "distributed"
FIGURE = RESULTS / "h200" / "speedup.png"
README = REPO / "README.md"
DOCS = REPO / "docs"
# The page of each generated section: the README keeps the bare op's table, the topics' pages the others.
PAGES = {
    "model": README,
    "kernel": README,
    "kernel-h100": DOCS / "performance.md",
    "in-block": DOCS / "anemoi.md",
    "several-gpus": DOCS / "several-gpus.md",
}
NORM_NAMES = {"layer": "LayerNorm", "rms": "RMSNorm", "off": "off"}


def _load(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _ms(row: dict, side: str, mode: str) -> str:
    return _measured(row, side, mode, "ms", ".1f")


def in_block_table(folder: Path = IN_BLOCK) -> str:
    """Anemoi's modules, eager and compiled on both sides: speed-ups and the training step's memory saving."""
    results = _load(folder)
    meta = results["meta"]
    model = meta["model"]
    lines = [
        f"{meta['device']}, run of {run_date(folder)}; anemoi-models {meta['anemoi_models']}, "
        f"torch {meta['torch'].split('+')[0]}; "
        f"{model['num_channels']} channels, {model['num_heads']} heads, {model['processor_layers']}-layer "
        f"processor, batch {meta['batch_size']}, checkpointing {'on' if meta['gradient_checkpointing'] else 'off'}, "
        f"torch.compile mode {meta['compile_mode']}, medians of {meta['rounds']} alternating rounds; from "
        f"{folder.relative_to(REPO).as_posix()}/. Speed-up = Anemoi's time / gtnorm's; best = each side's faster "
        "mode. Training step ms, Anemoi → gtnorm, eager and compiled:",
        "",
        "| module | QK norm | autocast | step eager | step compiled | step ×, eager / compiled / best "
        "| inference ×, eager / compiled / best | memory saved (step, eager / compiled) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in results["rows"]:
        modes = {}
        for mode in ("train", "infer"):
            compiled = speedup(row, mode, "anemoi_compiled", "gtnorm_compiled")
            modes[mode] = f"{_x(speedup(row, mode))} / {_x(compiled)} / {_x(best_speedup(row, mode))}"
        memory = f"{_pct(memory_saving(row, 'train'))} / "
        memory += _pct(memory_saving(row, "train", "anemoi_compiled", "gtnorm_compiled"))
        lines.append(
            f"| {row['module']} | {NORM_NAMES[row['norm']]} | {row['dtype']} "
            f"| {_ms(row, 'anemoi', 'train')} → {_ms(row, 'gtnorm', 'train')} "
            f"| {_ms(row, 'anemoi_compiled', 'train')} → {_ms(row, 'gtnorm_compiled', 'train')} "
            f"| {modes['train']} | {modes['infer']} | {memory} |"
        )
    return "\n".join(lines) + "\n"


def several_gpus_table(folder: Path = SEVERAL_GPUS) -> str:
    """Training steps and inference on 1 and 2 GPUs, both sharding strategies, Anemoi against gtnorm, each eager
    and compiled (where the run compiled that strategy)."""
    results = _load(folder)
    meta = results["meta"]
    checks = results["checks"]
    worst = max(c.get("max_rel_error", float("inf")) for c in checks)
    passed = sum(bool(c["ok"]) for c in checks)
    compiled_checks = sum(c.get("mode") == "compiled" for c in checks)
    lines = [
        f"{meta['gpus']} x {meta['device']} ({meta['backend']}), run of {run_date(folder)}; {meta['dtype']}, "
        f"{NORM_NAMES[meta['norm']]} QK "
        f"norm, {meta['model']['processor_layers']}-layer processor; from {folder.relative_to(REPO).as_posix()}/: "
        f"{passed} of {len(checks)} sharded-against-whole checks pass ({compiled_checks} of them gtnorm compiled; "
        f"training step and inference; largest relative error {worst:.1e}). Step ms, eager / compiled; × = each "
        "side's faster mode against the other's:",
        "",
        "| GPUs, strategy | Anemoi step | gtnorm step | step × | inference × | peak GiB per GPU, Anemoi / gtnorm "
        "(faster mode) | scaling efficiency, Anemoi / gtnorm (eager; compiled) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = {(r["gpus"], r["strategy"], r["side"], r.get("mode", "eager")): r for r in results["rows"]
            if r["status"] == "ok"}  # fmt: skip
    for gpus, strategy in sorted({key[:2] for key in rows}):
        sides = {side: {mode: rows.get((gpus, strategy, side, mode)) for mode in ("eager", "compiled")}
                 for side in ("anemoi", "gtnorm")}  # fmt: skip
        if not all(sides[side]["eager"] for side in sides):
            continue

        def fastest(side, key, sides=sides):
            return min((r for r in sides[side].values() if r), key=lambda r: r[key])

        def steps(side, sides=sides):
            return " / ".join("–" if r is None else f"{r['ms']:.1f}" for r in sides[side].values())

        def peak(row):
            return max(row.get("peak_mib_per_gpu") or [row["peak_mib"]]) / 1024

        def efficiency(side, sides=sides):
            return "; ".join(f"{r['efficiency']:.2f}" for r in sides[side].values() if r and r.get("efficiency"))

        step_a, step_g = fastest("anemoi", "ms"), fastest("gtnorm", "ms")
        infer_a, infer_g = fastest("anemoi", "infer_ms"), fastest("gtnorm", "infer_ms")
        label = str(gpus) if gpus == 1 else f"{gpus}, {strategy}"
        scaling = "–" if gpus == 1 else f"{efficiency('anemoi')} / {efficiency('gtnorm')}"
        lines.append(
            f"| {label} | {steps('anemoi')} | {steps('gtnorm')} | {_x(step_a['ms'] / step_g['ms'])} "
            f"| {_x(infer_a['infer_ms'] / infer_g['infer_ms'])} | {peak(step_a):.1f} / {peak(step_g):.1f} "
            f"| {scaling} |"
        )
    return "\n".join(lines) + "\n"


def model_table(
    folders: tuple[Path, ...] = (
        WHOLE_MODEL, WHOLE_MODEL_O320, WHOLE_MODEL_O800, WHOLE_MODEL_HIGH_RESOLUTION, WHOLE_MODEL_LATITUDE,
        WHOLE_MODEL_MODES, WHOLE_MODEL_LAST_CHUNK, WHOLE_MODEL_O96_OFF, WHOLE_MODEL_O1280_MODES,
    ),
) -> str:
    """The whole model (anemoi-training's default config): each side's fastest compile mode, step and inference;
    the rows of every folder's results, in order, less those a later folder measured again (same graph, norm and
    mapper chunks: the newer run replaces them)."""
    loaded = [_load(folder) for folder in folders]
    key = lambda row: (row["graph"], row["norm"], row.get("mapper_chunks", DEFAULT_MAPPER_CHUNKS))  # noqa: E731
    rows = []
    for at, result in enumerate(loaded):
        newer = {key(row) for later in loaded[at + 1 :] for row in later["rows"]}
        rows += [row for row in result["rows"] if key(row) not in newer]
    results = {"meta": loaded[0]["meta"], "rows": rows}
    return model_readme_table(results, " and ".join(f"{folder.relative_to(REPO).as_posix()}/" for folder in folders))


def sections() -> dict[str, str]:
    return {
        "model": model_table(),
        "kernel": committed_gpu_summary(COMMITTED_GPU_RESULTS),
        "kernel-h100": committed_gpu_summary(H100_GRAPHS),
        "in-block": in_block_table(),
        "several-gpus": several_gpus_table(),
    }


def page_with(text: str, generated: dict[str, str], page: str = "README.md") -> str:
    """``text`` (of ``page``) with every generated section replaced; a missing marker is a ValueError."""
    for name, body in generated.items():
        start, end = f"<!-- report:{name} -->\n", f"<!-- /report:{name} -->"
        if start not in text or end not in text:
            raise ValueError(f"{page} lacks the markers of the generated section {name!r}: {start.strip()}")
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + start + body + end + tail
    return text


def speedup_points() -> dict[str, list[tuple[int, float]]]:
    """(edges, gtnorm's speed-up over Anemoi) per series: the bare op with LayerNorm (against torch's LayerNorm,
    eager and compiled, + Anemoi's kernel) and with RMSNorm (against Anemoi's fused-QK-norm kernel), and the in-block
    LayerNorm rows, eager against eager and compiled against compiled (training step)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for graph in _load(COMMITTED_GPU_RESULTS)["graphs"]:
        variants = graph["variants"]
        for label, anemoi, gtnorm in (
            ("bare op, LayerNorm (vs LayerNorm + Anemoi's kernel)", "anemoi_layer", "fused_layer"),
            ("bare op, LayerNorm (vs compiled LayerNorm + Anemoi's kernel)", "anemoi_compiled_layer", "fused_layer"),
            ("bare op, RMSNorm (vs Anemoi's fused-QK kernel)", "anemoi_fused_qk", "fused"),
        ):
            a, g = variants.get(anemoi, {}).get("fwd_bwd", {}), variants.get(gtnorm, {}).get("fwd_bwd", {})
            if a.get("status") == "ok" and g.get("status") == "ok":
                series.setdefault(label, []).append((graph["num_edges"], a["ms"] / g["ms"]))
    for row in _load(IN_BLOCK)["rows"]:
        if row["norm"] != "layer":
            continue
        for label, sides in (
            ("in Anemoi's modules, eager step", ("anemoi", "gtnorm")),
            ("in Anemoi's modules, compiled step", ("anemoi_compiled", "gtnorm_compiled")),
        ):
            value = speedup(row, "train", *sides)
            if value is not None:
                series.setdefault(label, []).append((row["edges"], value))
    return {label: sorted(points) for label, points in series.items()}


def write_figure(path: Path = FIGURE) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (label, points), marker in zip(speedup_points().items(), "osD^v", strict=True):
        ax.plot(*zip(*points, strict=True), marker=marker, linestyle="none", markersize=7, label=label)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("edges in the graph (level 5 / O96 on the left, level 6 / O320 and the DOP encoder on the right)")
    ax.set_ylabel("gtnorm's speed-up over Anemoi (x)")
    ax.set_title(f"gtnorm against Anemoi, forward+backward, {_load(IN_BLOCK)['meta']['device']}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def updated_pages() -> dict[Path, tuple[str, str]]:
    """{page: (its text now, its text with the generated sections brought up to date)}."""
    generated = sections()
    pages = {}
    for path in dict.fromkeys(PAGES.values()):
        text = path.read_text()
        names = {name: generated[name] for name, page in PAGES.items() if page == path}
        pages[path] = text, page_with(text, names, path.relative_to(REPO).as_posix())
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare the pages with the results")
    args = parser.parse_args(argv)
    pages = updated_pages()
    names = ", ".join(path.relative_to(REPO).as_posix() for path in pages)
    if args.check:
        stale = [path.relative_to(REPO).as_posix() for path, (text, updated) in pages.items() if text != updated]
        if stale:
            print(f"{', '.join(stale)}: generated sections differ from the results: run python -m benchmarks.report")
            return 1
        print(f"{names} agree with the committed results")
        return 0
    for path, (_, updated) in pages.items():
        path.write_text(updated)
    write_figure()
    print(f"wrote {names} and {FIGURE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
