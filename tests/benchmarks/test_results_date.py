"""The run date cited with each committed results folder (benchmarks/results_date.py)."""

import json

import pytest

from benchmarks.results_date import run_date


def results_folder(tmp_path, meta: dict, readme: str | None):
    (tmp_path / "results.json").write_text(json.dumps({"meta": meta}))
    if readme is not None:
        (tmp_path / "README.md").write_text(readme)
    return tmp_path


def test_date_from_the_run_itself(tmp_path):
    folder = results_folder(tmp_path, {"started": "2026-11-26 05:45:42"}, "# A run (2026-11-27)\n")
    assert run_date(folder) == "2026-11-26"


def test_date_from_the_readme_said_as_such(tmp_path):
    folder = results_folder(tmp_path, {}, "# Anemoi's modules on an H200 (2026-11-26, v23)\n\nbody 2020-01-01\n")
    assert run_date(folder) == "2026-11-26 (from the folder's README)"


@pytest.mark.parametrize("readme", [None, "# No date in this title\n\n2026-11-26 only further down\n"])
def test_no_date_is_an_error_not_a_guess(tmp_path, readme):
    with pytest.raises(ValueError, match="no meta.started"):
        run_date(results_folder(tmp_path, {}, readme))
