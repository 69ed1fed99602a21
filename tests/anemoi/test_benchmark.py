"""The in-block benchmark's harness (benchmarks/anemoi) on a tiny graph: rows measured, results written.

On the CPU Anemoi's side falls back to its PyG path and gtnorm's runs through the interpreter, so the numbers
mean nothing here; the GPU run is the benchmark.
"""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from tests.requirements import ANEMOI_MODELS, SCIPY, require_module

require_module("anemoi.models", ANEMOI_MODELS)
require_module("scipy", SCIPY)

from benchmarks.anemoi import report, run, step_profile  # noqa: E402
from benchmarks.graphs.catalog import BenchGraph  # noqa: E402
from tests.anemoi.setups import random_edges  # noqa: E402

TINY = run.ModelSpec(num_channels=8, num_heads=2, mlp_hidden_ratio=1.0, processor_layers=1, data_channels=3)


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # torch's RMSNorm under autocast
@pytest.mark.parametrize("kind", ["processor", "encoder"])
def test_rows_are_measured_and_written(kind, device, tmp_path, capsys):
    num_src, num_dst = {"processor": (10, 10), "encoder": (16, 6), "decoder": (6, 16)}[kind]
    edge_index = random_edges(num_src, num_dst, torch.Generator().manual_seed(0))
    graph = BenchGraph("tiny", kind, edge_index, num_src, num_dst, "tiny")
    problem = run.make_problem(TINY, kind, graph, device)
    modules = run.build_modules(TINY, kind, "rms", device)
    rounds = 2 if kind == "encoder" else 1
    row = run.measure_row(modules, problem, torch.bfloat16, run.TimingSettings(), device, rounds)
    for side in run.SIDES:  # every side timed once per round, its time the median of them
        for measured in row[side].values():
            assert len(measured["ms_rounds"]) == rounds
            assert measured["ms"] == pytest.approx(statistics.median(measured["ms_rounds"]))
    row |= {"module": kind, "graph": "tiny", "edges": edge_index.shape[1], "norm": "rms", "dtype": "bf16"}
    for side in run.SIDES:
        for mode in report.MODES:
            assert row[side][mode]["status"] == "ok" and row[side][mode]["ms"] > 0
            assert row[side][mode]["first_call_s"] > 0  # apart from the timed calls
    assert row["output_rel_error"] < 0.05  # bf16 on both sides
    assert all(p.grad is None for m in modules.values() for p in m.parameters())  # no gradient outlives a timing

    results = {"meta": {"device": "cpu", "torch": "", "triton": "", "anemoi_models": "", "model": vars(TINY)}}
    results["rows"] = [row]
    report.write_outputs(results, tmp_path, plot=False)
    assert json.loads((tmp_path / "results.json").read_text())["rows"][0]["norm"] == "rms"
    assert f"| {kind} | rms | bf16 |" in (tmp_path / "results.md").read_text()
    assert report.best_speedup(row, "train") is not None and report.speedup(row, "infer", *report.COMPILED) is not None
    report.print_summary(results)
    assert kind in capsys.readouterr().out


def test_step_profile_measures_both_modes(device):
    """benchmarks/anemoi/step_profile.py on a tiny processor: per-step times and counts for training and inference."""
    edge_index = random_edges(10, 10, torch.Generator().manual_seed(1))
    problem = run.make_problem(TINY, "processor", BenchGraph("tiny", "processor", edge_index, 10, 10, "tiny"), device)
    module = run.build_modules(TINY, "processor", "layer", device)["gtnorm"]
    for mode, fn in step_profile.step_calls(module, problem, torch.bfloat16, device).items():
        profile = step_profile.profile_call(fn, device, steps=1, warmup=1)
        assert profile["wall_ms"] >= profile["host_ms"] > 0, mode
        assert (profile["gpu_ms"] is None) == (device.type != "cuda")
        assert profile["syncs"] >= 0 and len(profile["top"]) <= step_profile.TOP_KERNELS
