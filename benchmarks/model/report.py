"""The whole-model benchmark's results: results.json, results.md, the summary printed last, and the README's
table (``model_table``, written by ``python -m benchmarks.report``)."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.anemoi.report import _cell, _measured
from benchmarks.anemoi.report import _ok as _ok_status
from benchmarks.graphs.report import write_result_files

GRAPH_NAMES = {
    "o1280_r7": "O1280 → level 7",
    "o800_r7": "O800 → level 7",
    "o320_r6": "O320 → level 6",
    "o96_r5": "O96 → level 5",
    "o2_r0": "O2 → level 0",
}
NORM_NAMES = {"layer": "LayerNorm", "off": "off"}
MODES = {"train": "training step", "infer": "inference"}
TIMED_COLUMNS = (("ms", ".1f"), ("peak_mib", ".0f"))  # per mode, as the table's columns
DEFAULT_MAPPER_CHUNKS = 4  # rows from before the chunk axis ran the config's
DEFAULT_RECOMPILE_LIMIT = 8  # torch's; the first runs raised it to 64 on both sides (their rows say so)
KEEP_OPTION = re.compile(r"keep(\d+)")  # a variant's keep<N>: gtnorm's processor with its last N layers kept


def _ok(row: dict, name: str, mode: str) -> dict:
    """The variant's measurement in ``mode`` if it ran and was timed, else {}."""
    measured = _ok_status(row["variants"], name, mode)
    return measured if measured.get("ms") else {}


def _in_default_config(name: str) -> bool:
    """Whether a variant runs the config as users have it: checkpointing on (``nockpt`` trades memory for time, as
    does ``keep<N>``, gtnorm's processor with its last N layers outside the checkpoints, and ``keepattn``, its
    attention outputs kept for the recompute: explicit choices). ``limit64`` (a user's compile setting, named in the
    table's cells) and ``efull`` keep the config."""
    options = name.split("/")[2:]
    explicit = "nockpt" in options or "keepattn" in options
    return not explicit and not any(KEEP_OPTION.fullmatch(option) for option in options)


def best(row: dict, side: str, mode: str) -> tuple[str, dict] | None:
    """(variant, measurement) of ``side``'s fastest variant in ``mode`` among those that run the default config
    (any compile mode; ``efull`` is the same config with gtnorm's lin_edge materialised)."""
    found = [
        (name, _ok(row, name, mode))
        for name in row["variants"]
        if name.split("/")[0] == side and _in_default_config(name) and _ok(row, name, mode)
    ]
    return min(found, key=lambda item: item[1]["ms"]) if found else None


def best_vs_best(row: dict, mode: str, side: str = "gtnorm") -> tuple | None:
    """(speed-up, Anemoi's best variant, side's best variant, peak MiB Anemoi, peak MiB side): each side's fastest
    variant by one rule (best)."""
    anemoi, ours = best(row, "anemoi", mode), best(row, side, mode)
    if anemoi is None or ours is None:
        return None
    return anemoi[1]["ms"] / ours[1]["ms"], anemoi[0], ours[0], anemoi[1].get("peak_mib"), ours[1].get("peak_mib")


def ratio_range(row: dict, mode: str, anemoi: str, ours: str) -> tuple[float, float] | None:
    """The speed-up's range over the rounds, (Anemoi's fastest round / our slowest, Anemoi's slowest / our
    fastest); None with a single round."""
    a, g = row["variants"][anemoi][mode].get("ms_rounds", []), row["variants"][ours][mode].get("ms_rounds", [])
    if len(a) < 2 or len(g) < 2:
        return None
    return min(a) / max(g), max(a) / min(g)


def failure(row: dict, side: str) -> str | None:
    """Why none of ``side``'s variants gave a training step: the first variant's status (crash, OOM, error)."""
    for name, entry in row["variants"].items():
        if name.split("/")[0] == side:
            status = entry.get("train", {}).get("status", "not run")
            return f"{status[:120]} ({name.split('/')[1]})"
    return None


def markdown(results: dict) -> str:
    meta = results["meta"]
    model, data = meta["model"], meta["data"]
    lines = [
        "# The whole Anemoi model (anemoi-training's default graph transformer): Anemoi vs gtnorm",
        "",
        f"{meta['device']}; torch {meta['torch']}, triton {meta['triton']}, anemoi-models {meta['anemoi_models']}. "
        f"AnemoiModelEncProcDec from anemoi-training 0.17.1's graphtransformer.yaml (benchmarks/model/config.py): "
        f"{model['num_channels']} channels, {model['num_heads']} heads, processor of the row's layers in 4 "
        "checkpointed chunks, mappers in 4 chunks, edge attributes 3 + 8 trainable, 8 trainable node parameters; "
        f"{data['num_variables']} variables, {data['n_step_input']} input steps, batch {meta['batch_size']}, "
        f"{meta['dtype']} autocast. Training step = forward, MSE, backward. Times: median ms over {meta['rounds']} "
        f"rounds (each at least {meta['min_calls']} timed calls; "
        f"{'each variant in its own process' if meta.get('isolated') else 'variants alternating'}). Peak MiB: the "
        "model's parameters and buffers, what the side keeps between steps (where recorded) and the most its step "
        "allocates. First step: seconds, compiling included.",
        "",
        "Variants: SIDE/MODE. anemoi = Anemoi's Triton backend; gtnorm = the built model converted by "
        "use_gtnorm_attention; gtnorm_config = the config switch alone. default = the default `compile:` list "
        "(compiles nothing); blocks = the side's block classes listed; whole = torch.compile(model); /nockpt = the "
        "processor without gradient checkpointing; /keep<N> = gtnorm's processor with its last N layers outside the "
        "checkpoints (layers_outside_checkpoint); /keepattn = gtnorm's processor with its attention outputs kept for "
        "the recompute (keep_attention_outputs). None is picked as a side's fastest: each trades memory for time.",
    ]
    for row in results["rows"]:
        lines += ["", f"## {GRAPH_NAMES.get(row['graph'], row['graph'])}, QK norm {NORM_NAMES[row['norm']]}, "
                  f"{row['layers']} processor layers, mapper chunks {row.get('mapper_chunks', DEFAULT_MAPPER_CHUNKS)}",
                  "", f"Sizes: {row['sizes']}", "",
                  "| variant | step ms | step peak MiB | inference ms | inference peak MiB | first step s "
                  "| modules compiled | output error vs first |", "|" + " --- |" * 8]  # fmt: skip
        variants = row["variants"]
        for name, entry in variants.items():
            timed = [_measured(variants, name, mode, key, fmt) for mode in MODES for key, fmt in TIMED_COLUMNS]
            lines.append(
                f"| {name} | {' | '.join(timed)} "
                f"| {_cell(entry.get('first_step_s'), '.1f')} | {entry.get('compiled_modules', '–')} "
                f"| {_cell(entry.get('output_rel_error'), '.1e')} |"
            )
        for mode, mode_name in MODES.items():
            found = best_vs_best(row, mode)
            if found:
                ratio, anemoi, ours, anemoi_mib, our_mib = found
                lines.append(
                    f"\n{mode_name}: gtnorm's fastest ({ours}) is {ratio:.2f}× Anemoi's fastest ({anemoi}); peak "
                    f"{_cell(anemoi_mib, '.0f')} → {_cell(our_mib, '.0f')} MiB."
                )
    return "\n".join(lines) + "\n"


def write_outputs(results: dict, out_dir: Path) -> None:
    write_result_files(results, out_dir, markdown(results))


def _measured_text(entry: dict) -> str:
    """'X ms, Y MiB' of one variant in one mode, or its status."""
    if not entry.get("ms"):
        return entry.get("status", "not measured")
    peak = f", {entry['peak_mib']:,.0f} MiB" if entry.get("peak_mib") else ""
    return f"{entry['ms']:.1f} ms{peak}"


def print_summary(results: dict) -> None:
    for row in results["rows"]:
        for name, entry in row["variants"].items():
            print(f"{row['graph']} {row['norm']} {row['mapper_chunks']} chunks {name}: "
                  f"step {_measured_text(entry['train'])}; inference {_measured_text(entry['infer'])}")  # fmt: skip
        for mode, mode_name in MODES.items():
            found = best_vs_best(row, mode)
            text = "not measured" if found is None else f"{found[0]:.2f}x ({found[2]} vs {found[1]})"
            print(f"{row['graph']} {row['norm']} {mode_name}: gtnorm best vs Anemoi best {text}")


def _modes(row: dict, side: str) -> list[str]:
    found = [name.split("/", 1)[1] for name in row["variants"] if name.split("/")[0] == side]
    order = ("default", "blocks", "whole")
    return sorted(found, key=lambda mode: (order.index(mode.split("/")[0]) if mode.split("/")[0] in order else 9, mode))


def _side_cell(row: dict, side: str, train: tuple | None, infer: tuple | None) -> str:
    """'step / inference ms (step's mode / inference's mode)', or why the side has no step."""
    if train is None:
        return failure(row, side) or "not run"
    step = row["variants"][train[0]]["train"]["ms"]
    inference = f"{row['variants'][infer[0]]['infer']['ms']:.1f}" if infer else "–"
    return f"{step:.1f} / {inference} ({train[0].split('/', 1)[1]} / {infer[0].split('/', 1)[1] if infer else '–'})"


def _speedup_cell(row: dict, mode: str) -> str:
    found = best_vs_best(row, mode)
    if found is None:
        return "–"
    spread = ratio_range(row, mode, found[1], found[2])
    return f"{found[0]:.2f}×" + (f" ({spread[0]:.2f}–{spread[1]:.2f})" if spread else "")


def _peak(measured: tuple | None, row: dict) -> str:
    if measured is None or measured[1].get("peak_mib") is None:
        return "–"
    kept = "persistent_mib" in row["variants"][measured[0]]
    return f"{measured[1]['peak_mib']:,.0f}" + ("" if kept else "*")


def _run(row: dict, meta: dict) -> dict:
    """The row's run (device, started, commit): its own record, else the results file's."""
    return row.get("run") or {key: meta.get(key) for key in ("device", "started", "commit")}


def _run_text(run: dict) -> str:
    device = (run.get("device") or "").replace("NVIDIA ", "")
    limit = run.get("recompile_limit")
    limit = f", both sides' recompile limit {limit}" if limit and limit != DEFAULT_RECOMPILE_LIMIT else ""
    return f"{(run.get('started') or '–').split()[0]}, {device}, {run.get('commit') or 'commit not recorded'}{limit}"


def _run_cell(row: dict, meta: dict) -> str:
    """The row's run; variants merged in from another run (their own ``run``) are named after it, with theirs."""
    text = _run_text(_run(row, meta))
    merged: dict[str, list[str]] = {}
    for name, entry in row["variants"].items():
        if entry.get("run"):
            merged.setdefault(_run_text(entry["run"]), []).append(name)
    for run, names in merged.items():
        text += f"; {', '.join(names)}: {run}"
    return text


def readme_table(results: dict, source: str) -> str:
    """The README's table: per row each side's fastest measured mode (one rule for both: best), the speed-up with
    its range over the rounds, peak memory, the modes measured and the run the row comes from. ``results``' rows
    may come from several runs of one setup (meta: the first's)."""
    meta = results["meta"]
    runs = [_run(row, meta) for row in results["rows"]]
    devices = " and ".join(dict.fromkeys(run["device"] for run in runs))
    dates = " and ".join(sorted({(run.get("started") or "date not recorded").split()[0] for run in runs}))
    lines = [
        f"{devices}, run of {dates} (each row's run: its last column); anemoi-models {meta['anemoi_models']}, torch "
        f"{meta['torch'].split('+')[0]}; AnemoiModelEncProcDec from anemoi-training's default "
        "graph-transformer config (16-layer processor in 4 checkpointed chunks, mappers in the row's chunks, "
        f"checkpointed; 11 raw edge attributes of which 8 trainable), {meta['data']['num_variables']} variables, "
        f"batch 1, {meta['dtype']} autocast; medians over rounds; from {source}. Each side in the fastest of the "
        "compile modes the row measured for it (default: the default `compile:` list, which compiles nothing; "
        "blocks: the side's block classes listed; whole: torch.compile of the model; /limit64: torch.compile's "
        "recompile limit raised from torch's default 8 to 64, which anemoi-training does not do); a side that failed "
        "shows why. "
        "Speed-up: the medians' ratio, in brackets its range over the rounds. Peak: parameters, buffers, what the "
        "side keeps between steps, the batch the step reads (input and target) and the step's allocations (* = a row "
        "recorded before what is kept was counted: gtnorm's layout caches left out). Training step / inference ms:",
        "",
        "| model | mapper chunks | QK norm | Anemoi, fastest mode | gtnorm, fastest mode | speed-up step "
        "| speed-up inference | step's peak MiB, Anemoi → gtnorm | modes measured, Anemoi; gtnorm | run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in results["rows"]:
        bests = {side: (best(row, side, "train"), best(row, side, "infer")) for side in ("anemoi", "gtnorm")}
        lines.append(
            f"| {GRAPH_NAMES[row['graph']]} | {row.get('mapper_chunks', DEFAULT_MAPPER_CHUNKS)} "
            f"| {NORM_NAMES[row['norm']]} | {_side_cell(row, 'anemoi', *bests['anemoi'])} "
            f"| {_side_cell(row, 'gtnorm', *bests['gtnorm'])} | {_speedup_cell(row, 'train')} "
            f"| {_speedup_cell(row, 'infer')} | {_peak(bests['anemoi'][0], row)} → {_peak(bests['gtnorm'][0], row)} "
            f"| {', '.join(_modes(row, 'anemoi'))}; {', '.join(_modes(row, 'gtnorm'))} | {_run_cell(row, meta)} |"
        )
    return "\n".join(lines) + "\n"
