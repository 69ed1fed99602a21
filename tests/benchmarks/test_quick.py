"""The benchmark's quick mode (benchmarks/graphs/quick.py) on one small hand-made graph, and the committed GPU
summary it prints, which the README shows too."""

import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from benchmarks.graphs import quick, run
from benchmarks.graphs.catalog import GRAPH_SPECS
from benchmarks.graphs.quick import committed_gpu_header, committed_gpu_summary
from tests.benchmarks.test_harness import NUM_DST, NUM_SRC, smoke_graph

REPO = Path(__file__).resolve().parents[2]


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
    # Quick mode runs on whatever device there is: compiled kernels with CUDA, the interpreter without.
    how = "compiled" if torch.cuda.is_available() else "through the Triton interpreter"
    assert f"smoke: fused forward+backward ({how}) against PyG: done in" in printed
    assert committed_gpu_header() + "\n" + committed_gpu_summary() in printed
    assert not (tmp_path / "results.png").exists()
    # Through the interpreter, what the checks will cost before they start (compiled kernels take seconds: no
    # estimate); at the end, one verdict line.
    if torch.cuda.is_available():
        assert "Estimate: " not in printed
    else:
        assert printed.index("Estimate: ") < printed.index("smoke: fused forward+backward")
    assert printed.rstrip().splitlines()[-1].startswith("PASS: on 1 graphs") and results["verdict"]["pass"]


@pytest.mark.parametrize("argv", [["--quick"], ["--no-quick"]])
def test_quick_is_a_switch(argv):
    assert run.parse_args(argv, on_gpu=False).quick == (argv == ["--quick"])
    assert run.parse_args([], on_gpu=True).quick is False
    assert run.parse_args([], on_gpu=False).quick is True


def test_quick_mode_on_a_cpu_checks_an_encoder_a_processor_and_a_decoder():
    assert run.graphs_to_run(run.parse_args([], on_gpu=False), on_gpu=False) == list(quick.QUICK_GRAPHS)
    assert sorted(GRAPH_SPECS[name].kind for name in quick.QUICK_GRAPHS) == ["decoder", "encoder", "processor"]
    assert run.graphs_to_run(run.parse_args(["--suite", "tiny"], on_gpu=False), on_gpu=False)[-1] == "dop_enc_tiny"
    assert run.graphs_to_run(run.parse_args(["--no-quick"], on_gpu=False), on_gpu=False)[-1] == "dop_enc_tiny"
    assert run.graphs_to_run(run.parse_args([], on_gpu=True), on_gpu=True)[-1] == "dop_enc_large"


def test_the_committed_results_are_dated_and_said_not_measured_now():
    header, caption = committed_gpu_header(), committed_gpu_summary().splitlines()[0]
    assert "not measured now" in header and "NVIDIA H200" in header
    assert re.search(r"run of \d{4}-\d{2}-\d{2}", header) and re.search(r"run of \d{4}-\d{2}-\d{2}", caption)


def test_a_forward_timed_slower_than_forward_backward_is_not_reported(monkeypatch):
    settings = run.Settings(torch.float32, 1, 4, 1e-6, (), run.TimingSettings(cpu_reps=3), check=True)
    calls = {"fwd": lambda: None, "fwd_bwd": lambda: None}
    monkeypatch.setattr(quick, "interleaved_cpu_medians_ms", lambda *args: {"fwd": 2.0, "fwd_bwd": 1.0})
    assert quick.time_pyg(calls, torch.device("cpu"), settings, []) == dict.fromkeys(calls, quick.CONTRADICTED)
    assert quick._pyg_text(dict.fromkeys(calls, quick.CONTRADICTED)) == quick.CONTRADICTED
    monkeypatch.setattr(quick, "interleaved_cpu_medians_ms", lambda *args: {"fwd": 1.0, "fwd_bwd": 2.5})
    timed = quick.time_pyg(calls, torch.device("cpu"), settings, [])
    assert timed == {"fwd": 1.0, "fwd_bwd": 2.5} and quick._pyg_text(timed) == "1.000 / 2.500 ms"


def test_a_long_step_says_that_it_still_runs(capsys):
    with quick.progress("[1/1] g", "the check", run_start=0.0, every_s=0.05):
        time.sleep(0.18)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[1/1] g: the check ..."
    assert any(line.startswith("[1/1] g:   ... ") for line in lines[1:-1])  # a busy machine may delay some
    assert lines[-1].startswith("[1/1] g: the check: done in 0.")


def test_one_thread_on_the_cpu_then_the_callers_setting_back():
    threads = torch.get_num_threads()
    with quick.one_thread_on_cpu(torch.device("cpu")):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == threads


def accuracy_results(fused_fp32: dict | str, pyg_fp32: dict | str, dtype: str = "bfloat16") -> dict:
    accuracy = {"fused vs pyg": {"out": 1e-2}, "fused vs pyg fp32": fused_fp32, "pyg vs pyg fp32": pyg_fp32}
    return {"meta": {"dtype": dtype}, "graphs": [{"name": "g", "accuracy": accuracy}]}


@pytest.mark.parametrize(
    "fused, pyg, passes",
    [
        ({"out": 3e-3, "dq": 4e-3}, {"out": 5e-3, "dq": 1e-2}, True),  # closer to fp32 than PyG's own bf16 path
        ({"out": 3e-3, "dq": 2e-2}, {"out": 5e-3, "dq": 1e-2}, False),  # one gradient farther
        ({"out": 3e-3, "dq": float("nan")}, {"out": 5e-3, "dq": 1e-2}, False),  # a NaN is the worst
        ("OOM", {"out": 5e-3}, False),  # no result is no pass
    ],
)
def test_the_verdict_says_pass_or_fail_and_against_what(fused, pyg, passes):
    verdict = quick.verdict(accuracy_results(fused, pyg))
    assert verdict["pass"] is passes
    assert verdict["line"].startswith("PASS: " if passes else "FAIL: ") and "\n" not in verdict["line"]
    assert "than the PyG path in bfloat16 is" in verdict["line"]


def test_the_verdict_in_float32_is_against_a_fixed_bound():
    results = accuracy_results("–", "–", dtype="float32")
    results["graphs"][0]["accuracy"] = {"fused vs pyg": {"out": 1e-6, "dq": 2e-6}}
    assert quick.verdict(results)["pass"]
    results["graphs"][0]["accuracy"] = {"fused vs pyg": {"out": 1e-6, "dq": 2 * quick.FLOAT32_TOLERANCE}}
    assert not quick.verdict(results)["pass"]


def test_a_gpu_sized_run_says_so_before_it_starts():
    tiny = [graph_with(name) for name in quick.QUICK_GRAPHS]
    assert "GPU-sized" not in quick.interpreter_estimate(tiny)
    large = [graph_with("h_to_h_small", edges=81_900)]
    text = quick.interpreter_estimate(large)
    assert "about 20 minutes of one core" in text and "on a machine with an NVIDIA GPU" in text


def graph_with(name: str, edges: int = 1_000) -> types.SimpleNamespace:
    return types.SimpleNamespace(name=name, num_edges=edges)


SKIP_CHANGES_NOTHING = """
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from benchmarks.graphs.accuracy import outputs_and_grads
from benchmarks.graphs.interpreter import skip_repeated_language_patches
from benchmarks.graphs.variants import make_inputs
from tests.benchmarks.test_harness import smoke_graph
inputs = make_inputs(smoke_graph(), 2, 16, torch.bfloat16, torch.device("cpu"), 1e-6)
before = {name: outputs_and_grads(name, inputs) for name in ("fused", "fused_layer")}
assert skip_repeated_language_patches()
after = {name: outputs_and_grads(name, inputs) for name in ("fused", "fused_layer")}
assert all(torch.equal(before[n][k], after[n][k]) for n in before for k in before[n]), "results differ"
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs only without CUDA here")
def test_skipping_the_interpreters_repeated_patches_changes_no_result():
    """In a process of its own: the skip stays installed in the process that installs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", SKIP_CHANGES_NOTHING], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
