"""The whole-model benchmark's results: results.json, results.md, the summary printed last, and the README's
table (``model_table``, written by ``python -m benchmarks.report``)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.anemoi.report import _cell, _measured
from benchmarks.anemoi.report import _ok as _ok_status
from benchmarks.graphs.report import write_result_files

GRAPH_NAMES = {"o320_r6": "O320 → level 6", "o96_r5": "O96 → level 5", "o2_r0": "O2 → level 0"}
NORM_NAMES = {"layer": "LayerNorm", "off": "off"}
MODES = {"train": "training step", "infer": "inference"}
TIMED_COLUMNS = (("ms", ".1f"), ("peak_mib", ".0f"))  # per mode, as the table's columns


def _ok(row: dict, name: str, mode: str) -> dict:
    """The variant's measurement in ``mode`` if it ran and was timed, else {}."""
    measured = _ok_status(row["variants"], name, mode)
    return measured if measured.get("ms") else {}


def best(
    row: dict, side: str, mode: str, memory_cap_mib: float | None = None, default_config: bool = False
) -> tuple[str, dict] | None:
    """(variant, measurement) of ``side``'s fastest variant in ``mode`` (under the memory cap, if given; with
    ``default_config``, among its compile modes alone, the config's checkpointing kept)."""
    found = [
        (name, _ok(row, name, mode))
        for name in row["variants"]
        if name.split("/")[0] == side and _ok(row, name, mode) and not (default_config and "nockpt" in name)
    ]
    if memory_cap_mib is not None:
        found = [(n, m) for n, m in found if m.get("peak_mib") is not None and m["peak_mib"] <= memory_cap_mib]
    return min(found, key=lambda item: item[1]["ms"]) if found else None


def best_vs_best(row: dict, mode: str, side: str = "gtnorm", capped: bool = True) -> tuple | None:
    """(speed-up, Anemoi's best variant, side's best variant, peak MiB Anemoi, peak MiB side): the side's fastest
    variant that needs no more memory than Anemoi's fastest (``capped``) against Anemoi's fastest compile mode
    with the default config (checkpointing on: the memory Anemoi users chose)."""
    anemoi = best(row, "anemoi", mode, default_config=True)
    if anemoi is None:
        return None
    cap = anemoi[1].get("peak_mib") if capped else None
    ours = best(row, side, mode, cap)
    if ours is None:
        return None
    return anemoi[1]["ms"] / ours[1]["ms"], anemoi[0], ours[0], anemoi[1].get("peak_mib"), ours[1].get("peak_mib")


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
        f"alternating rounds (each at least {meta['min_calls']} timed calls). Peak MiB: the model's parameters "
        "and buffers plus the most its step allocates. First step: seconds, compiling included.",
        "",
        "Variants: SIDE/MODE. anemoi = Anemoi's Triton backend; gtnorm = the built model converted by "
        "use_gtnorm_attention; gtnorm_config = the config switch alone. default = the default `compile:` list "
        "(compiles nothing); blocks = the side's block classes listed; whole = torch.compile(model); /nockpt = the "
        "processor without gradient checkpointing.",
    ]
    for row in results["rows"]:
        lines += ["", f"## {GRAPH_NAMES.get(row['graph'], row['graph'])}, QK norm {NORM_NAMES[row['norm']]}, "
                  f"{row['layers']} processor layers", "", f"Sizes: {row['sizes']}", "",
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
                    f"\n{mode_name}: gtnorm's fastest at no more memory ({ours}) is {ratio:.2f}× Anemoi's fastest "
                    f"({anemoi}); peak {_cell(anemoi_mib, '.0f')} → {_cell(our_mib, '.0f')} MiB."
                )
    return "\n".join(lines) + "\n"


def write_outputs(results: dict, out_dir: Path) -> None:
    write_result_files(results, out_dir, markdown(results))


def print_summary(results: dict) -> None:
    for row in results["rows"]:
        for mode, mode_name in MODES.items():
            found = best_vs_best(row, mode)
            text = "not measured" if found is None else f"{found[0]:.2f}x ({found[2]} vs {found[1]})"
            print(f"{row['graph']} {row['norm']} {mode_name}: gtnorm best vs Anemoi best {text}")
