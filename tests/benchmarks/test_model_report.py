"""The README's whole-model table (benchmarks/model/report.py) on hand-made rows: one rule for both sides, the
speed-up's range over rounds, failures as cells, each row's run."""

from __future__ import annotations

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

from benchmarks.model.report import best, readme_table  # noqa: E402

RUN = {"device": "NVIDIA H200", "started": "2026-11-26 23:40 UTC", "commit": "abc1234", "recompile_limit": 8}


def _timed(train_rounds, infer_rounds, peak):
    median = lambda rounds: sorted(rounds)[len(rounds) // 2]
    return {
        "train": {"status": "ok", "ms": median(train_rounds), "ms_rounds": train_rounds, "peak_mib": peak},
        "infer": {"status": "ok", "ms": median(infer_rounds), "ms_rounds": infer_rounds},
        "persistent_mib": 10.0,
    }


def _results(rows):
    meta = {"anemoi_models": "0.19.0", "torch": "2.11.0+cu130", "data": {"num_variables": 100}, "dtype": "fp16"}
    return {"meta": meta, "rows": rows}


def test_each_side_fastest_by_one_rule():
    row = {"graph": "o1280_r7", "norm": "layer", "mapper_chunks": 16, "run": RUN, "variants": {
        "anemoi/blocks": _timed([450.0, 460.0, 470.0], [140.0, 141.0, 142.0], 500.0),
        "anemoi/blocks/limit64": _timed([320.0, 321.0, 322.0], [81.0, 82.0, 83.0], 500.0),
        "anemoi/blocks/nockpt": _timed([100.0, 100.0, 100.0], [10.0, 10.0, 10.0], 900.0),
        "gtnorm/blocks": _timed([300.0, 302.0, 304.0], [100.0, 101.0, 102.0], 400.0),
        "gtnorm/blocks/nockpt": _timed([90.0, 90.0, 90.0], [9.0, 9.0, 9.0], 900.0),
        "gtnorm/blocks/keep3": _timed([280.0, 280.0, 280.0], [100.0, 100.0, 100.0], 450.0),
        "gtnorm/blocks/keepattn": _timed([285.0, 285.0, 285.0], [100.0, 100.0, 100.0], 420.0),
    }}  # fmt: skip
    # nockpt, keep<N> and keepattn trade the memory users chose for time: not picked, on either side; limit64 keeps
    # the config.
    assert best(row, "anemoi", "train")[0] == "anemoi/blocks/limit64"
    assert best(row, "gtnorm", "train")[0] == "gtnorm/blocks"
    line = readme_table(_results([row]), "here/").splitlines()[-1]
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[:5] == ["O1280 → level 7", "16", "LayerNorm", "321.0 / 82.0 (blocks/limit64 / blocks/limit64)",
                         "302.0 / 101.0 (blocks / blocks)"]  # fmt: skip
    assert cells[5] == f"{321 / 302:.2f}× ({320 / 304:.2f}–{322 / 300:.2f})"
    assert cells[7] == "500 → 400"
    assert cells[9] == "2026-11-26, H200, abc1234"


def test_a_side_that_failed_shows_why():
    crash = "crash (exit code 1): torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
    row = {"graph": "o1280_r7", "norm": "layer", "mapper_chunks": 4, "run": RUN | {"recompile_limit": 64},
           "variants": {"anemoi/blocks": {"train": {"status": crash}, "infer": {"status": crash}},
                        "gtnorm/blocks": _timed([2845.0], [752.0], 100054.0)}}  # fmt: skip
    table = readme_table(_results([row]), "here/")
    assert "NVIDIA H200, run of 2026-11-26" in table.splitlines()[0]
    cells = [cell.strip() for cell in table.splitlines()[-1].strip("|").split("|")]
    assert cells[3] == f"{crash} (blocks)" and cells[5] == "–" and cells[7] == "– → 100,054"
    assert cells[9].endswith("both sides' recompile limit 64")


def test_variants_merged_from_another_run_name_it():
    """A row may join variants from two runs (the whole mode measured on another machine): the run cell names the
    row's run, then each other run with the variants it gave."""
    other = RUN | {"started": "2026-11-28 01:50 UTC", "commit": "def5678"}
    row = {"graph": "o1280_r7", "norm": "layer", "mapper_chunks": 16, "run": RUN, "variants": {
        "anemoi/blocks": _timed([450.0], [140.0], 500.0), "gtnorm/blocks": _timed([300.0], [100.0], 400.0),
        "anemoi/whole": _timed([470.0], [138.0], 700.0) | {"run": other},
        "gtnorm/whole": {"train": {"status": "OOM"}, "infer": {"status": "OOM"}, "run": other},
    }}  # fmt: skip
    cells = [cell.strip() for cell in readme_table(_results([row]), "here/").splitlines()[-1].strip("|").split("|")]
    assert cells[3] == "450.0 / 138.0 (blocks / whole)" and cells[8] == "blocks, whole; blocks, whole"
    assert cells[9] == "2026-11-26, H200, abc1234; anemoi/whole, gtnorm/whole: 2026-11-28, H200, def5678"


def test_the_heading_lists_the_rows_runs_dates_in_order():
    """Rows keep their folders' order (a newer run may sit above an older one); the heading's dates do not."""
    newer = RUN | {"started": "2026-11-29 04:16 UTC"}
    rows = [
        {"graph": graph, "norm": "layer", "mapper_chunks": 4, "run": run, "variants": {
            "anemoi/blocks": _timed([450.0], [140.0], 500.0), "gtnorm/blocks": _timed([300.0], [100.0], 400.0)}}
        for graph, run in (("o320_r6", newer), ("o800_r7", RUN), ("o1280_r7", newer))
    ]  # fmt: skip
    heading = readme_table(_results(rows), "here/").splitlines()[0]
    assert heading.startswith("NVIDIA H200, run of 2026-11-26 and 2026-11-29 (each row's run")


def test_a_later_folder_replaces_the_rows_it_measured_again(tmp_path):
    """benchmarks.report's model table: a row of a later results folder (same graph, norm and mapper chunks; rows
    from before the chunk axis count as the config's 4) replaces an earlier folder's; other rows stay, in order."""
    import json

    from benchmarks import report

    def row(graph, norm, chunks, ms):
        found = {"graph": graph, "norm": norm, "run": RUN, "variants": {
            "anemoi/blocks": _timed([ms * 1.5], [ms], 500.0), "gtnorm/blocks": _timed([ms], [ms], 400.0)}}  # fmt: skip
        return found | ({"mapper_chunks": chunks} if chunks else {})

    folders = []
    for name, rows in (("old", [row("o96_r5", "off", None, 100.0), row("o320_r6", "layer", None, 300.0)]),
                       ("new", [row("o320_r6", "layer", 4, 200.0), row("o320_r6", "layer", 8, 250.0)])):  # fmt: skip
        folder = tmp_path / name
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps(_results(rows)))
        folders.append(folder)
    monkeypatched = report.REPO
    report.REPO = tmp_path
    try:
        table = report.model_table(tuple(folders)).splitlines()
    finally:
        report.REPO = monkeypatched
    rows = [line for line in table if line.startswith("| O")]
    assert [line.split(" | ")[1] for line in rows] == ["4", "4", "8"]  # O96, then the new folder's two rows
    gtnorm_cells = [line.split(" | ")[4] for line in rows]
    assert gtnorm_cells == ["100.0 / 100.0 (blocks / blocks)", "200.0 / 200.0 (blocks / blocks)",
                            "250.0 / 250.0 (blocks / blocks)"]  # fmt: skip
