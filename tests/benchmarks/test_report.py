"""The report command: the README's generated sections agree with the committed results (CI fails otherwise)."""

from __future__ import annotations

import json

import pytest

from benchmarks import report


def test_readme_agrees_with_the_committed_results(capsys):
    """After a new run replaces a results folder, `python -m benchmarks.report` rewrites the README."""
    assert report.main(["--check"]) == 0, capsys.readouterr().out


def test_check_fails_when_a_number_changes(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text(report.README.read_text().replace("| processor r6 | LayerNorm |", "| processor r6 | layer |", 1))
    monkeypatch.setattr(report, "README", readme)
    assert report.main(["--check"]) == 1


def test_sections_are_replaced_between_their_markers():
    text = "a\n<!-- report:x -->\nold\n<!-- /report:x -->\nb\n"
    assert report.readme_with(text, {"x": "new\n"}) == "a\n<!-- report:x -->\nnew\n<!-- /report:x -->\nb\n"
    with pytest.raises(ValueError, match="markers of the generated section 'y'"):
        report.readme_with(text, {"y": "new\n"})


def test_every_cited_results_folder_names_its_command():
    """One folder per device and kind of run, each with a README naming command and code."""
    for folder in (report.COMMITTED_GPU_RESULTS, report.IN_BLOCK, report.SEVERAL_GPUS):
        assert (folder / "results.json").is_file(), folder
        command = (folder / "README.md").read_text()
        assert "python -m benchmarks." in command or "benchmarks/distributed/run.py" in command, folder
        json.loads((folder / "results.json").read_text())


def test_figure_covers_level5_to_the_largest_graph(tmp_path):
    pytest.importorskip("matplotlib")
    points = report.speedup_points()
    assert len(points) == 4
    edges = [e for series in points.values() for e, _ in series]
    assert min(edges) < 100_000 and max(edges) > 1_000_000  # level 5 / O96 ... the DOP encoder
    report.write_figure(tmp_path / "speedup.png")
    assert (tmp_path / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
