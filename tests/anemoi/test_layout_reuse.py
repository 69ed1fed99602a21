"""The layout-reuse benchmark (benchmarks/anemoi/layout_reuse.py, prebuilt_layouts.py) on tiny graphs: the served
lookup hands over the recorded layouts without reading the graph, both sides agree (edge_index cloned per step,
or from Anemoi's graph provider), the table has its rows.

On the CPU gtnorm's kernels run through the interpreter, so the times mean nothing here; the GPU run is the
benchmark.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.requirements import ANEMOI_MODELS, SCIPY, require_module

require_module("anemoi.models", ANEMOI_MODELS)
require_module("scipy", SCIPY)

import gtnorm.nn.conv  # noqa: E402
from benchmarks.anemoi import layout_reuse, run  # noqa: E402
from benchmarks.anemoi.prebuilt_layouts import PrebuiltLayouts  # noqa: E402
from benchmarks.graphs.catalog import BenchGraph  # noqa: E402
from benchmarks.graphs.report import write_result_files  # noqa: E402
from tests.anemoi.setups import random_edges  # noqa: E402

TINY = run.ModelSpec(num_channels=8, num_heads=2, mlp_hidden_ratio=1.0, processor_layers=1, data_channels=3)
SIZES = {"processor": (10, 10), "encoder": (16, 6), "decoder": (6, 16)}


def test_serving_hands_over_the_recorded_layout_without_reading_the_graph(device):
    edge_index = random_edges(10, 10, torch.Generator().manual_seed(0)).to(device)
    other = edge_index.flip(1).clone()  # same sizes, another graph (its edges in another order)
    prebuilt = PrebuiltLayouts()
    shipped = gtnorm.nn.conv.cached_layout
    with prebuilt.recording():
        recorded = gtnorm.nn.conv.cached_layout(edge_index, (10, 10))
        gtnorm.nn.conv.cached_layout(edge_index.clone(), (10, 10))
        with pytest.raises(ValueError, match="sizes cannot tell them apart"):
            gtnorm.nn.conv.cached_layout(other, (10, 10))
    assert gtnorm.nn.conv.cached_layout is shipped
    assert torch.equal(recorded.edge_index(), edge_index)
    assert prebuilt.lookups == 2

    with prebuilt.serving():
        assert gtnorm.nn.conv.cached_layout(other, (10, 10)) is recorded  # no content compared
    with prebuilt.serving(check=True), pytest.raises(ValueError, match="not the graph"):
        gtnorm.nn.conv.cached_layout(other, (10, 10))
    with prebuilt.serving(), pytest.raises(KeyError):
        gtnorm.nn.conv.cached_layout(edge_index[:, 1:], (10, 10))  # a graph never recorded
    assert gtnorm.nn.conv.cached_layout is shipped


@pytest.mark.parametrize(  # the interpreter is slow
    ("kind", "rounds", "way"), [("processor", 2, "clone"), ("decoder", 1, "clone"), ("encoder", 1, "provider")]
)
def test_rows_are_measured_and_written(kind, rounds, way, device, tmp_path):
    num_src, num_dst = SIZES[kind]
    edge_index = random_edges(num_src, num_dst, torch.Generator().manual_seed(1))
    problem = run.make_problem(TINY, kind, BenchGraph("tiny", kind, edge_index, num_src, num_dst, "tiny"), device)
    module = run.build_modules(TINY, kind, layout_reuse.NORM, device)["gtnorm"]
    row = layout_reuse.measure_row(module, problem, torch.float16, run.TimingSettings(), device, rounds, 1, way)

    # Checkpointing recomputes each block's forward in the backward: two lookups per block in a training step; the
    # decoder keeps its last chunk (here its one) instead, and looks it up once.
    assert row["infer"]["lookups_per_step"] == 1
    assert row["train"]["lookups_per_step"] == (1 if kind == "decoder" else 2)
    for mode in layout_reuse.MODES:
        assert row[mode]["max_rel_difference"] <= layout_reuse.AGREEMENT
        for side in layout_reuse.SIDES:
            assert len(row[mode][side]["ms"]) == rounds and row[mode][side]["median_ms"] > 0
            assert row[mode][side]["median_host_ms"] > 0
        assert row[mode]["ratio"] > 0
    assert all(p.grad is None for p in module.parameters())  # no gradient outlives a timing
    if way == "provider":  # the provider's edges: the problem's graph, the same tensor on both sides' lookups
        sources = layout_reuse.edge_sources(problem, way)
        assert all(torch.equal(source().edge_index, problem.edge_index) for source in sources.values())

    results = {"meta": {"device": "cpu", "torch": "", "anemoi_models": "", "dtype": "fp16", "rounds": rounds}}
    results["rows"] = [{"module": kind, "graph": "tiny", "edges": edge_index.shape[1], "way": way, **row}]
    write_result_files(results, tmp_path, layout_reuse.markdown(results))
    assert json.loads((tmp_path / "results.json").read_text())["rows"][0]["module"] == kind
    table = (tmp_path / "results.md").read_text()
    for name in layout_reuse.MODES.values():
        assert f"| {kind} | {edge_index.shape[1]:,} | {name} | {way} |" in table
    assert f"Largest ratio, edge_index by {way}:" in table
