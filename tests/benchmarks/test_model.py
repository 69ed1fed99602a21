"""The whole-model benchmark's model (benchmarks/model): anemoi-training's default graph-transformer config built
on a tiny graph, as Anemoi builds it and converted to gtnorm, agree in float32 (output and every gradient); the
compile lists do what the README says; the benchmark runs end to end on the CPU (``--tiny``)."""

from __future__ import annotations

import pytest

pytest.importorskip("anemoi.models", reason="needs anemoi-models (pip install --no-deps anemoi-models==0.19.0)")
pytest.importorskip("anemoi.graphs", reason="needs anemoi-graphs (pip install --no-deps anemoi-graphs==0.9.8)")

import torch  # noqa: E402

from benchmarks.model import run  # noqa: E402
from benchmarks.model.build import (  # noqa: E402
    apply_compile_mode,
    build_model,
    compiled_modules,
    make_batch,
    make_target,
    training_loss,
)
from benchmarks.model.config import ModelSpec  # noqa: E402
from benchmarks.model.graph import build_model_graph  # noqa: E402
from tests.anemoi.setups import ZERO_GRADIENT, rel_error  # noqa: E402

TINY = ModelSpec(**run.TINY_MODEL)
BLOCKS = ["encoder.0.proc", "processor.proc.0", "processor.proc.1", "decoder.0.proc"]


@pytest.fixture(scope="module")
def graph():
    return build_model_graph("o2_r0")


def _step(model, data):
    """Loss and every parameter's gradient of one float32 training step."""
    model.train()
    model.zero_grad(set_to_none=True)
    loss = training_loss(model, make_batch(model, data), make_target(model, data))
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("norm", ["off", "layer"])
@pytest.mark.parametrize("side", ["gtnorm", "gtnorm_config"])
def test_model_matches_anemoi(graph, side, norm):
    spec = TINY.__class__(**{**run.TINY_MODEL, "qk_norm": norm == "layer"})
    anemoi = build_model("anemoi", spec, run.TINY_DATA, graph)
    with torch.no_grad():  # away from the initial values (zero trainable parameters, unit norm weights)
        for p in anemoi.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ours = build_model(side, spec, run.TINY_DATA, graph)
    ours.load_state_dict(anemoi.state_dict())
    assert any(type(m).__module__.startswith("gtnorm.") for m in ours.modules())
    loss_a, grads_a = _step(anemoi, run.TINY_DATA)
    loss_g, grads_g = _step(ours, run.TINY_DATA)
    assert rel_error(loss_g, loss_a) < 1e-5
    assert grads_a.keys() == grads_g.keys()
    largest = max(g.double().norm().item() for g in grads_a.values())
    for name, expected in grads_a.items():
        actual = grads_g[name]
        assert actual is not None, name
        if expected.double().norm().item() < ZERO_GRADIENT * largest:  # zero in exact arithmetic (key biases)
            assert actual.double().norm().item() < ZERO_GRADIENT * largest, name
        else:
            assert rel_error(actual, expected) < 1e-4, name


def test_compile_lists(graph):
    """The default ``compile:`` list compiles nothing of gtnorm's model (on the GPU nothing of Anemoi's either: its
    Triton blocks hold no conv module); listing gtnorm's block classes compiles every block."""
    model = build_model("gtnorm", TINY, run.TINY_DATA, graph)
    assert compiled_modules(apply_compile_mode(model, "gtnorm", "default", "eager")) == []
    assert compiled_modules(apply_compile_mode(model, "gtnorm", "blocks", "eager")) == BLOCKS
    anemoi = build_model("anemoi", TINY, run.TINY_DATA, graph)
    assert compiled_modules(apply_compile_mode(anemoi, "anemoi", "blocks", "eager")) == BLOCKS


def test_tiny_benchmark_runs(tmp_path):
    results = run.main(["--tiny", "--norms", "off", "--rounds", "1", "--min-calls", "1", "--out", str(tmp_path),
                        "--variants", "anemoi/default", "gtnorm/blocks"])  # fmt: skip
    (row,) = results["rows"]
    for name in ("anemoi/default", "gtnorm/blocks"):
        variant = row["variants"][name]
        assert variant["train"]["status"] == "ok" and variant["infer"]["status"] == "ok", variant
    assert row["variants"]["gtnorm/blocks"]["compiled_modules"] == len(BLOCKS)
    assert row["variants"]["gtnorm/blocks"]["output_rel_error"] < 1e-2  # fp16 autocast against Anemoi's PyG path
    assert (tmp_path / "results.md").is_file()
