"""The report command: the generated sections of the README and the docs pages agree with the committed results
(CI fails otherwise), and each names its GPU and the date of its run."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks import report


def test_pages_agree_with_the_committed_results(capsys):
    """After a new run replaces a results folder, `python -m benchmarks.report` rewrites the pages."""
    assert report.main(["--check"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("section", sorted(report.PAGES))
def test_check_fails_when_a_number_changes(monkeypatch, capsys, section):
    """A results folder whose numbers moved on: --check names the page that no longer agrees with it."""
    generated = report.sections()
    changed = {**generated, section: generated[section].replace(" | ", " | 9", 1)}
    monkeypatch.setattr(report, "sections", lambda: changed)
    assert report.main(["--check"]) == 1
    page = report.PAGES[section].relative_to(report.REPO).as_posix()
    assert capsys.readouterr().out.startswith(f"{page}: generated sections differ")


def test_every_section_names_its_gpu_and_date():
    generated = report.sections()
    assert set(generated) == set(report.PAGES)
    for name, body in generated.items():
        caption = body.splitlines()[0]
        gpu = "NVIDIA H100" if name.endswith("-h100") else "NVIDIA H200"
        assert gpu in caption and re.search(r"run of \d{4}-\d{2}-\d{2}", caption), name


def test_sections_are_replaced_between_their_markers():
    text = "a\n<!-- report:x -->\nold\n<!-- /report:x -->\nb\n"
    assert report.page_with(text, {"x": "new\n"}) == "a\n<!-- report:x -->\nnew\n<!-- /report:x -->\nb\n"
    with pytest.raises(ValueError, match="docs/a.md lacks the markers of the generated section 'y'"):
        report.page_with(text, {"y": "new\n"}, "docs/a.md")


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
    assert len(points) == 5
    edges = [e for series in points.values() for e, _ in series]
    assert min(edges) < 100_000 and max(edges) > 1_000_000  # level 5 / O96 ... the DOP encoder
    report.write_figure(tmp_path / "speedup.png")
    assert (tmp_path / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
