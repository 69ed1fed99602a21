"""Smoke test of the graph benchmark harness (benchmarks/graphs/run.py) on one small hand-made graph.

On the CPU the kernels run through the Triton interpreter (tests/conftest.py sets it up), so the graph is
kept to a few dozen nodes and every measurement to one call.
"""

import json

import pytest
import torch

from benchmarks.graphs import run
from benchmarks.graphs.accuracy import RESULT_NAMES, outputs_and_grads
from benchmarks.graphs.catalog import BenchGraph
from benchmarks.graphs.measure import relative_error
from benchmarks.graphs.variants import (
    COMPILED_VARIANTS,
    CUDA_ONLY_VARIANTS,
    LAYER_NORM_VARIANTS,
    PEER_VARIANTS,
    PROJECTION_VARIANTS,
    VARIANTS,
    build_variant,
    cast_inputs,
    make_inputs,
)
from gtnorm.nn.reference import reference_graph_transformer_attention
from tests.conftest import DEVICE, HAS_CUDA

NUM_SRC, NUM_DST = 14, 9


def smoke_graph() -> BenchGraph:
    """Bipartite, 1 to 4 incoming edges per destination, and one destination with none (its output is 0)."""
    generator = torch.Generator().manual_seed(0)
    dst = torch.arange(NUM_DST - 1).repeat_interleave(torch.arange(NUM_DST - 1) % 4 + 1)
    src = torch.randint(0, NUM_SRC, dst.shape, generator=generator)
    return BenchGraph("smoke", "encoder", torch.stack([src, dst]), NUM_SRC, NUM_DST, "test graph")


def test_variants_compute_the_same_function():
    """Every variant with the norm that the harness can run here, wired to the same inputs and parameters,
    matches fp64 PyG with the same norm (RMSNorm or LayerNorm); the no_norm variant matches fp64 PyG without it."""
    inputs = make_inputs(smoke_graph(), heads=2, channels=16, dtype=torch.float32, device=DEVICE, eps=1e-5)
    exact = cast_inputs(inputs, torch.float64)
    expected_by_norm = {"rms": outputs_and_grads("pyg", exact), "layer": outputs_and_grads("pyg_layer", exact)}
    cpu_skipped = COMPILED_VARIANTS | CUDA_ONLY_VARIANTS
    other_functions = {"no_norm", *PROJECTION_VARIANTS, *PEER_VARIANTS}  # checked below; peers need a path
    runnable = [v for v in VARIANTS if v not in other_functions and (HAS_CUDA or v not in cpu_skipped)]
    assert "fused_layer" in runnable
    for variant in runnable:
        expected = expected_by_norm["layer" if variant in LAYER_NORM_VARIANTS else "rms"]
        actual = outputs_and_grads(variant, inputs)
        for name in RESULT_NAMES:
            error = relative_error(actual[name], expected[name])
            assert error < 1e-4, f"{variant}: {name} relative error {error:.2e}"

    leaves = (exact.query, exact.key, exact.value, exact.edge_attr)
    reference = reference_graph_transformer_attention(*leaves, exact.edge_index, (exact.num_src, exact.num_dst))
    expected = [reference, *torch.autograd.grad(reference, leaves, exact.grad_out)]
    variant = build_variant("no_norm", inputs)
    out = variant.forward()
    out.backward(inputs.grad_out)
    actual = [out, *(t.grad for t in variant.leaves)]
    assert len(actual) == len(expected) == 5
    for name, a, b in zip(RESULT_NAMES, actual, expected, strict=False):
        error = relative_error(a, b)
        assert error < 1e-4, f"no_norm: {name} relative error {error:.2e}"


def test_cli_writes_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run, "graph_names", lambda: ["smoke"])
    monkeypatch.setattr(run, "load_graph", lambda name, **kwargs: smoke_graph())
    argv = ["--graphs", "smoke", "--heads", "2", "--channels", "16", "--out", str(tmp_path), "--no-quick"]
    if HAS_CUDA:  # keep the GPU run short: no torch.compile, brief timing
        argv += ["--variants", "pyg", "unfused", "fused", "--warmup-ms", "1", "--rep-ms", "5"]
    run.main(argv)

    printed = capsys.readouterr().out
    results = json.loads((tmp_path / "results.json").read_text())
    markdown = (tmp_path / "results.md").read_text()
    assert (tmp_path / "results.png").stat().st_size > 0
    assert "| smoke | fused |" in markdown and "| smoke | fused |" in printed

    graph = results["graphs"][0]
    assert (graph["num_src"], graph["num_dst"], graph["in_degree"]["min"]) == (NUM_SRC, NUM_DST, 0)
    assert graph["floor"]["fwd_bytes"] < graph["floor"]["fwd_bwd_bytes"]
    for name, modes in graph["variants"].items():
        for mode, measured in modes.items():
            if name in COMPILED_VARIANTS | CUDA_ONLY_VARIANTS and not HAS_CUDA:
                assert measured["status"].startswith("skipped"), (name, mode)
            else:
                assert measured["status"] == "ok" and measured["ms"] > 0, (name, mode, measured["status"])
                assert (measured["peak_mib"] is not None) == HAS_CUDA
    assert graph["fused_pct_of_floor"]["fwd_bwd"] > 0
    assert graph["fused_speedup"]["pyg"]["fwd"] > 0

    # bf16 rounds twice as coarsely as 2**-8; the check reports, so only a wiring mistake could exceed this.
    for comparison, errors in graph["accuracy"].items():
        assert isinstance(errors, dict), (comparison, errors)
        assert max(errors.values()) < 5e-2, (comparison, errors)

    not_performance = "NOT performance figures"
    assert (not_performance in printed and not_performance in markdown) == (not HAS_CUDA)


@pytest.mark.parametrize("argv", [["--graphs", "no_such_graph"], ["--variants", "no_such_variant"]])
def test_cli_rejects_unknown_names(argv):
    with pytest.raises(SystemExit):
        run.parse_args(argv, on_gpu=False)


def test_projection_variants_compute_the_same_function():
    """The lin_edge projection materialised before the kernels and fused into them: the same output and the same
    gradients of every leaf (q, k, v, raw attributes, lin_edge weight and bias, norm weights and biases)."""
    inputs = make_inputs(smoke_graph(), heads=2, channels=16, dtype=torch.float32, device=DEVICE, eps=1e-5)
    results = {}
    for name in PROJECTION_VARIANTS:
        variant = build_variant(name, inputs)
        out = variant.forward()
        results[name] = [out, *torch.autograd.grad(out, variant.leaves, inputs.grad_out)]
    assert len(results["fused_projection"]) == 11
    # The last is k_norm_bias's gradient: 0 in exact arithmetic (tests/graphs.py, key_bias_error), rounding here.
    fused_key_bias, materialised_key_bias = (r.pop() for r in results.values())
    assert (fused_key_bias - materialised_key_bias).norm() < 1e-5 * results["fused_projection"][2].norm()
    for index, (fused, materialised) in enumerate(zip(*results.values(), strict=True)):
        error = relative_error(fused, materialised)
        assert error < 1e-4, f"result {index}: relative error {error:.2e}"
