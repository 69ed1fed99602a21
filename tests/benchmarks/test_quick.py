"""The benchmark's quick mode (benchmarks/graphs/quick.py) on one small hand-made graph, and the committed GPU
summary it prints, which the README shows too."""

import json

import pytest

from benchmarks.graphs import quick, run
from benchmarks.graphs.quick import committed_gpu_summary
from tests.benchmarks.test_harness import NUM_DST, NUM_SRC, smoke_graph


def test_quick_mode_checks_the_fused_op_and_times_pyg(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run, "graph_names", lambda: ["smoke"])
    monkeypatch.setattr(quick, "load_graph", lambda name, **kwargs: smoke_graph())
    run.main(["--graphs", "smoke", "--heads", "2", "--channels", "16", "--out", str(tmp_path), "--quick"])

    printed = capsys.readouterr().out
    results = json.loads((tmp_path / "results.json").read_text())
    graph = results["graphs"][0]
    assert results["meta"]["mode"] == "quick"
    assert (graph["num_src"], graph["num_dst"]) == (NUM_SRC, NUM_DST)
    # bf16 rounds twice as coarsely as 2**-8; the check reports, so only a wiring mistake could exceed this.
    assert set(graph["accuracy"]) == {"fused vs pyg", "fused vs pyg fp32", "pyg vs pyg fp32"}
    for comparison, errors in graph["accuracy"].items():
        assert len(errors) == 7 and max(errors.values()) < 5e-2, (comparison, errors)
    assert all(isinstance(ms, float) and ms > 0 for ms in graph["pyg_ms"].values()), graph["pyg_ms"]

    assert "| smoke | encoder |" in printed and "| smoke | encoder |" in (tmp_path / "results.md").read_text()
    assert committed_gpu_summary() in printed
    assert not (tmp_path / "results.png").exists()


@pytest.mark.parametrize("argv", [["--quick"], ["--no-quick"]])
def test_quick_is_a_switch(argv):
    assert run.parse_args(argv, on_gpu=False).quick == (argv == ["--quick"])
    assert run.parse_args([], on_gpu=True).quick is False
    assert run.parse_args([], on_gpu=False).quick is True
