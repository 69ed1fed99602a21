"""The whole-model benchmark's model (benchmarks/model): anemoi-training's default graph-transformer config built
as Anemoi builds it and converted to gtnorm; the compile lists do what the README says; the benchmark runs end to
end on the CPU (``--tiny``).

The models are compared on one training step: the prediction and every parameter's gradient, each side's error
measured against Anemoi's model run in float64 on its PyG backend, and bounded by the error of the same-dtype
run of Anemoi's own backend (PyG on the CPU; on a GPU also Anemoi's Triton kernel, at 16 heads x 64 channels).
Each gtnorm step counts its kernel launches (tests/launches.py): the model ran gtnorm's kernels, never its PyG path.
"""

from __future__ import annotations

import copy

import pytest

from tests.requirements import ANEMOI_GRAPHS, ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)
require_module("anemoi.graphs", ANEMOI_GRAPHS)

import torch  # noqa: E402
from anemoi.models.layers import block as anemoi_block  # noqa: E402
from anemoi.models.triton.gt import graph_transformer_attention_conv  # noqa: E402

from benchmarks.model import run  # noqa: E402
from benchmarks.model.build import (  # noqa: E402
    apply_compile_mode,
    build_model,
    compiled_modules,
    make_batch,
)
from benchmarks.model.config import ModelSpec  # noqa: E402
from benchmarks.model.graph import build_model_graph  # noqa: E402
from tests.anemoi.setups import ZERO_GRADIENT, rel_error  # noqa: E402
from tests.launches import FORWARD, attention_ran, count_launches  # noqa: E402

TINY = ModelSpec(**run.TINY_MODEL)
BLOCKS = ["encoder.0.proc", "processor.proc.0", "processor.proc.1", "decoder.0.proc"]
# gtnorm's float32 error against the float64 reference, per tensor, at most SLACK times that of Anemoi's own
# float32 run (the larger of its backends' on a GPU). Measured on the CPU (tiny model, interpreter): ratios up to 2.7
# (LayerNorm's q_norm.weight; float32 summation orders differ per tensor); a dropped term or a wrong gradient is
# orders of magnitude off.
SLACK = 4.0


@pytest.fixture(scope="module")
def graph():
    return build_model_graph("o2_r0")


def anemoi_blocks(model) -> list:
    return [m for m in model.modules() if isinstance(m, anemoi_block.GraphTransformerBaseBlock)]


def perturbed_anemoi(spec: ModelSpec, graph) -> torch.nn.Module:
    """Anemoi's model with every parameter moved away from its initial value (zero trainable parameters, unit norm
    weights), so that a kernel ignoring one would show."""
    model = build_model("anemoi", spec, run.TINY_DATA, graph)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator))
    return model


def float64_pyg_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of Anemoi's model on its PyG backend: the reference every side is measured against."""
    reference = copy.deepcopy(model).double()
    for block in anemoi_blocks(reference):
        block.graph_attention_backend = "pyg"
        block.set_attention_function()
    return reference


def step(model: torch.nn.Module, device: torch.device, dtype=torch.float32):
    """(prediction, {parameter: gradient}) of one training step with the loss sum(prediction * w), w random: a
    mean would shrink the gradients of a large prediction towards rounding noise (NOTES.md section 7)."""
    model.train()
    model.zero_grad(set_to_none=True)
    x = make_batch(model, run.TINY_DATA).to(device, dtype)
    prediction = model({"data": x})["data"]
    weights = torch.randn(prediction.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    (prediction.double() * weights.to(device)).sum().backward()
    return prediction.detach(), {name: p.grad for name, p in model.named_parameters()}


def step_errors(result, reference) -> dict[str, float]:
    """Per tensor (the prediction, every gradient) the relative error against the reference's; a gradient that is
    zero in exact arithmetic (the key projections' biases without a QK norm: the softmax ignores them) is measured
    against the largest gradient instead, as the rounding noise it is."""
    (prediction, grads), (ref_prediction, ref_grads) = result, reference
    assert grads.keys() == ref_grads.keys()
    errors = {"prediction": rel_error(prediction, ref_prediction)}
    largest = max(g.double().norm().item() for g in ref_grads.values())
    for name, expected in ref_grads.items():
        actual = grads[name]
        assert actual is not None, f"{name}: no gradient"
        if expected.double().norm().item() < ZERO_GRADIENT * largest:
            assert actual.double().norm().item() < ZERO_GRADIENT * largest, f"{name}: gradient should be ~0"
            errors[name] = 0.0
        else:
            errors[name] = rel_error(actual, expected)
    return errors


def assert_within(errors: dict[str, float], bounds: dict[str, float], what: str) -> None:
    worst = max(errors, key=lambda name: errors[name] / max(bounds[name], 1e-30))
    print(f"{what}: closest call {worst}: {errors[worst]:.2e} against a bound of {SLACK * bounds[worst]:.2e}")
    for name, error in errors.items():
        assert error <= SLACK * bounds[name], f"{name}: {error:.2e} > {SLACK} x {bounds[name]:.2e} ({what})"


# With CUDA, Anemoi keeps its blocks on its Triton kernel (CUDA only) and gtnorm's kernels do not run on CPU tensors
# without the interpreter: the GPU variant below is the test there.
@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's CPU run; with CUDA the GPU variant runs")
@pytest.mark.parametrize("norm", ["off", "layer"])
@pytest.mark.parametrize("side", ["gtnorm", "gtnorm_config"])
def test_model_matches_anemoi(graph, side, norm):
    """On the CPU: gtnorm's kernels through the interpreter against Anemoi's PyG backend, both in float32."""
    spec = TINY.__class__(**{**run.TINY_MODEL, "qk_norm": norm == "layer"})
    anemoi = perturbed_anemoi(spec, graph)
    ours = build_model(side, spec, run.TINY_DATA, graph)
    ours.load_state_dict(anemoi.state_dict())
    assert any(type(m).__module__.startswith("gtnorm.") for m in ours.modules())
    cpu = torch.device("cpu")
    reference = step(float64_pyg_copy(anemoi), cpu, torch.float64)
    anemoi_errors = step_errors(step(anemoi, cpu), reference)
    with count_launches() as launches:
        gtnorm_errors = step_errors(step(ours, cpu), reference)
    # Every block's attention ran through the kernels (at least once per block: the mappers run it per chunk,
    # checkpointing again in the backward), forward and backward, and never through gtnorm's PyG path.
    assert attention_ran(launches) is None, attention_ran(launches)
    assert launches[FORWARD] >= len(BLOCKS), launches
    assert_within(gtnorm_errors, anemoi_errors, f"{side} {norm}")


# The GPU variant: Anemoi's default sizes per block (1024 channels, 16 heads of 64), 2 processor layers, on the O96
# -> level-5 graph (40,320 data and 10,242 hidden nodes; 63k / 82k / 121k edges). Memory: ~60M parameters (fp64
# reference: ~1 GB with gradients); the largest activations, the decoder's edge tensors [121k, 1024], ~1 GB each in
# float64, a few alive at once under checkpointing: well under 20 GB. About 10-30 s on an H100 (graph building
# included, cached after the first run).
GPU_SPEC = dict(num_channels=1024, num_heads=16, num_layers=2, processor_chunks=2, mapper_chunks=2)


@pytest.mark.gpu
@pytest.mark.parametrize("norm", ["off", "layer"])
def test_model_matches_anemoi_triton_on_gpu(norm):
    """gtnorm's model against Anemoi's with its Triton kernel, both float32, and Anemoi's PyG backend in float32:
    gtnorm's error against the float64 reference at most SLACK times the larger of Anemoi's two."""
    device = torch.device("cuda")
    graph = build_model_graph("o96_r5")
    spec = ModelSpec(**{**GPU_SPEC, "qk_norm": norm == "layer"})
    anemoi = perturbed_anemoi(spec, graph)
    ours = build_model("gtnorm", spec, run.TINY_DATA, graph)
    ours.load_state_dict(anemoi.state_dict())
    reference = step(float64_pyg_copy(anemoi).to(device), device, torch.float64)
    anemoi_pyg = float64_pyg_copy(anemoi).float().to(device)
    pyg_errors = step_errors(step(anemoi_pyg, device), reference)
    del anemoi_pyg
    anemoi = anemoi.to(device)
    # Anemoi's blocks run its Triton kernel (with CUDA it keeps the config's "triton"), counted per block call.
    triton_calls = []
    for block in anemoi_blocks(anemoi):
        assert block.graph_attention_backend == "triton" and block.conv is graph_transformer_attention_conv

        def counted(*args, conv=block.conv):
            triton_calls.append(1)
            return conv(*args)

        block.conv = counted
    triton_errors = step_errors(step(anemoi, device), reference)
    assert len(triton_calls) >= len(BLOCKS)
    del anemoi
    with count_launches() as launches:
        gtnorm_errors = step_errors(step(ours.to(device), device), reference)
    assert attention_ran(launches) is None, attention_ran(launches)
    assert launches[FORWARD] >= len(BLOCKS), launches
    print({name: (gtnorm_errors[name], triton_errors[name], pyg_errors[name]) for name in ("prediction",)})
    bounds = {name: max(triton_errors[name], pyg_errors[name]) for name in gtnorm_errors}
    assert_within(gtnorm_errors, bounds, f"GPU {norm}")


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
    assert row["mapper_chunks"] == TINY.mapper_chunks and set(row["run"]) == {"device", "started", "commit",
                                                                               "recompile_limit"}  # fmt: skip


def test_isolated_variant_that_dies_is_a_row(tmp_path):
    """--isolate: a child process that fails (here: a side that does not exist) gives the variant a status naming
    the exception, and the run goes on."""
    args = run.parse_args(["--tiny", "--rounds", "1", "--min-calls", "1", "--isolate"])
    entry, output = run.run_isolated(args, "o2_r0", "off", 2, "nosuch/default", tmp_path)
    assert output is None
    assert entry["train"]["status"].startswith("crash (exit code 1): ValueError: side must be one of"), entry
    assert entry["infer"]["status"] == entry["train"]["status"]


def test_variant_options(graph, monkeypatch):
    """mlpckpt sets gtnorm's mappers' node_chunk_rows; the process options (limit64, static, efused) set what they
    name and need a process of their own; unknown options are refused."""
    from gtnorm.anemoi.mapper import _NodeChunkRows
    from gtnorm.triton import config

    case = run.Case(run.Variant.parse("gtnorm/default/mlpckpt"), TINY, run.TINY_DATA, graph, torch.float16,
                    torch.device("cpu"))  # fmt: skip
    mappers = [m for m in case.model.modules() if isinstance(m, _NodeChunkRows)]
    assert len(mappers) == 2 and all(m.node_chunk_rows == run.NODE_CHUNK_ROWS for m in mappers)
    monkeypatch.setattr(config, "_PROJECTION_MIN_DEGREE", 6.0)
    # dynamo's own patch restores its settings (monkeypatch deletes them on undo: a ConfigModule's entries are not
    # attributes of the module object).
    before = (torch._dynamo.config.recompile_limit, torch._dynamo.config.automatic_dynamic_shapes)
    with torch._dynamo.config.patch(recompile_limit=8, automatic_dynamic_shapes=True):
        run.apply_process_options({"static", "efused"})
        assert torch._dynamo.config.recompile_limit == 64 and torch._dynamo.config.automatic_dynamic_shapes is False
    assert (torch._dynamo.config.recompile_limit, torch._dynamo.config.automatic_dynamic_shapes) == before
    assert config._PROJECTION_MIN_DEGREE == 0.0
    with pytest.raises(SystemExit, match="run with --isolate"):
        run.main(["--tiny", "--variants", "gtnorm/blocks/static", "gtnorm/blocks"])
    with pytest.raises(ValueError, match="unknown variant option"):
        run.Variant.parse("gtnorm/blocks/fast")


@pytest.mark.parametrize("kept", [1, TINY.num_layers])
def test_processor_keep_option(graph, kept):
    """keep<N> sets gtnorm's processor's layers_outside_checkpoint (more layers than it has: refused as it is built);
    Anemoi's side refuses the option."""
    case = run.Case(run.Variant.parse(f"gtnorm/default/keep{kept}"), TINY, run.TINY_DATA, graph, torch.float16,
                    torch.device("cpu"))  # fmt: skip
    assert case.model.processor.layers_outside_checkpoint == kept
    with pytest.raises(ValueError, match="layers_outside_checkpoint"):
        run.Case(run.Variant.parse(f"gtnorm/default/keep{TINY.num_layers + 1}"), TINY, run.TINY_DATA, graph,
                 torch.float16, torch.device("cpu"))  # fmt: skip
    with pytest.raises(ValueError, match="gtnorm's only"):
        run.Variant.parse(f"anemoi/blocks/keep{kept}")
    with pytest.raises(ValueError, match="unknown variant option"):
        run.Variant.parse("gtnorm/blocks/keepall")


def test_processor_keepattn_option(graph):
    """keepattn sets gtnorm's processor's keep_attention_outputs, beside keep<N>; Anemoi's side refuses it."""
    case = run.Case(run.Variant.parse("gtnorm/default/keep1/keepattn"), TINY, run.TINY_DATA, graph, torch.float16,
                    torch.device("cpu"))  # fmt: skip
    assert case.model.processor.keep_attention_outputs is True
    assert case.model.processor.layers_outside_checkpoint == 1
    plain = run.Case(run.Variant.parse("gtnorm/default"), TINY, run.TINY_DATA, graph, torch.float16,
                     torch.device("cpu"))  # fmt: skip
    assert plain.model.processor.keep_attention_outputs is False
    with pytest.raises(ValueError, match="gtnorm's only"):
        run.Variant.parse("anemoi/blocks/keepattn")


def test_compiled_variants_do_not_share_a_process():
    """Two compiled variants would share Anemoi's forward methods' compiled graphs (and their recompile limit) in
    one process: the benchmark isolates them; eager variants beside one compiled variant may share."""
    parse = run.Variant.parse
    assert run.shares_compiled_code([parse("anemoi/blocks"), parse("gtnorm/blocks")])
    assert run.shares_compiled_code([parse("gtnorm/blocks"), parse("gtnorm/whole")])
    assert not run.shares_compiled_code([parse("anemoi/default"), parse("gtnorm/default"), parse("gtnorm/blocks")])
