"""gtnorm's processor drop-in with its last layers outside gradient checkpointing, or its attention outputs kept for
the recompute (gtnorm/anemoi/processor.py): bitwise the fully checkpointed processor's step, each kept layer run once
in a training step and every other one twice (its forward, then again in the backward), Anemoi's chunks otherwise;
with the attention outputs kept, each layer's attention forward once."""

from __future__ import annotations

import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

import torch  # noqa: E402

import gtnorm.anemoi  # noqa: E402
from tests.anemoi.setups import Case, forward, make_inputs, training_step  # noqa: E402
from tests.launches import FORWARD, attention_ran, count_launches  # noqa: E402

NUM_LAYERS = 4
CASE = Case("processor", num_chunks=2)  # chunks of 2 layers


def build(
    layers_outside_checkpoint: int, device, checkpointing: bool = True, backend: str = "triton", **options
) -> gtnorm.anemoi.GraphTransformerProcessor:
    torch.manual_seed(0)
    args = CASE.arguments(backend) | dict(num_layers=NUM_LAYERS, gradient_checkpointing=checkpointing)
    processor = gtnorm.anemoi.GraphTransformerProcessor(
        **args, layers_outside_checkpoint=layers_outside_checkpoint, **options
    )
    with torch.no_grad():  # away from the initial norm weights of ones and zero biases
        for p in processor.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return processor.to(device)


def layer_calls(processor) -> list[int]:
    """Counts each layer's forward calls (a checkpoint's recomputation calls the layer again) while it lives."""
    calls = [0] * len(processor.proc)
    for i, layer in enumerate(processor.proc):
        layer.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


@pytest.mark.parametrize("kept", [1, 2])
def test_kept_layers_run_once_and_the_step_is_bitwise_the_checkpointed_one(kept, device):
    """kept = 1 cuts the last chunk short at the kept layer; 2 keeps the last chunk whole."""
    inputs = make_inputs(CASE, device)
    expected = training_step(build(0, device), CASE, inputs)
    processor = build(kept, device)
    calls = layer_calls(processor)
    with count_launches() as launches:
        actual = training_step(processor, CASE, inputs)
    assert attention_ran(launches) is None, attention_ran(launches)
    assert calls == [2] * (NUM_LAYERS - kept) + [1] * kept
    assert_bitwise(actual, expected)


def assert_bitwise(actual, expected) -> None:
    assert torch.equal(actual.output, expected.output)
    for a, e in zip(actual.input_grads, expected.input_grads, strict=True):
        assert torch.equal(a, e)
    assert actual.param_grads.keys() == expected.param_grads.keys()
    for name, grad in expected.param_grads.items():
        assert torch.equal(actual.param_grads[name], grad), name


@pytest.mark.parametrize("kept", [0, 1])
def test_kept_attention_outputs_run_each_attention_forward_once_and_the_step_is_bitwise(kept, device):
    """Every layer still runs twice (its forward, then the recompute), but the recompute takes the attention's
    outputs from the forward: one forward launch per layer, as without checkpointing. With a layer outside the
    checkpoints (kept = 1) the two choices combine."""
    inputs = make_inputs(CASE, device)
    expected = training_step(build(0, device), CASE, inputs)
    processor = build(kept, device, keep_attention_outputs=True)
    calls = layer_calls(processor)
    with count_launches() as launches:
        actual = training_step(processor, CASE, inputs)
    assert calls == [2] * (NUM_LAYERS - kept) + [1] * kept
    assert launches[FORWARD] == NUM_LAYERS, launches
    assert_bitwise(actual, expected)


def test_kept_attention_outputs_is_a_bool_and_off_by_default():
    with pytest.raises(ValueError, match="keep_attention_outputs must be a bool"):
        build(0, torch.device("cpu"), backend="pyg", keep_attention_outputs=1)
    assert build(0, torch.device("cpu"), backend="pyg").keep_attention_outputs is False


@pytest.mark.parametrize("kept", [3, NUM_LAYERS])
def test_every_layer_before_the_kept_ones_runs_twice(kept, device):
    """The PyG path (the kernels are the bitwise test's): 3 cuts the first chunk short, 4 keeps every layer."""
    processor = build(kept, device, backend="pyg")
    calls = layer_calls(processor)
    training_step(processor, CASE, make_inputs(CASE, device))
    assert calls == [2] * (NUM_LAYERS - kept) + [1] * kept


def test_no_layer_runs_twice_without_checkpointing_or_gradients(device):
    inputs = make_inputs(CASE, device)
    processor = build(1, device, checkpointing=False, backend="pyg")
    calls = layer_calls(processor)
    training_step(processor, CASE, inputs)
    assert calls == [1] * NUM_LAYERS
    processor = build(1, device, backend="pyg")
    calls = layer_calls(processor)
    with torch.no_grad():
        forward(processor, CASE, inputs)
    assert calls == [1] * NUM_LAYERS


def test_default_checkpoints_every_chunk_as_anemoi_does(device):
    processor = build(0, device, backend="pyg")
    assert processor.layers_outside_checkpoint == 0
    calls = layer_calls(processor)
    training_step(processor, CASE, make_inputs(CASE, device))
    assert calls == [2] * NUM_LAYERS


@pytest.mark.parametrize("kept", [-1, NUM_LAYERS + 1, 1.0, True])
def test_layers_outside_checkpoint_out_of_range_is_refused(kept):
    """At construction and when set on a built processor, before any layer runs."""
    with pytest.raises(ValueError, match="layers_outside_checkpoint must be an int from 0 to num_layers"):
        build(kept, torch.device("cpu"), backend="pyg")
    processor = build(0, torch.device("cpu"), backend="pyg")
    with pytest.raises(ValueError, match="layers_outside_checkpoint must be an int from 0 to num_layers"):
        processor.layers_outside_checkpoint = kept
    assert processor.layers_outside_checkpoint == 0


def test_an_anemoi_processor_converted_in_place_can_keep_layers(device):
    """use_gtnorm_attention re-classes Anemoi's processor (no new parameters): 0 layers kept until set."""
    from anemoi.models.layers.processor import GraphTransformerProcessor as AnemoiProcessor

    torch.manual_seed(0)
    anemoi_processor = AnemoiProcessor(**CASE.arguments("pyg") | dict(num_layers=NUM_LAYERS)).to(device)
    keys = anemoi_processor.state_dict().keys()
    processor = gtnorm.anemoi.use_gtnorm_attention(anemoi_processor, "pyg")
    assert isinstance(processor, gtnorm.anemoi.GraphTransformerProcessor) and processor.state_dict().keys() == keys
    assert processor.layers_outside_checkpoint == 0 and processor.keep_attention_outputs is False
    processor.layers_outside_checkpoint = 1
    calls = layer_calls(processor)
    training_step(processor, CASE, make_inputs(CASE, device))
    assert calls == [2] * (NUM_LAYERS - 1) + [1]


def test_a_compile_list_names_gtnorm_s_processor_for_a_converted_model():
    """anemoi-models' mark_for_compilation matches the exact class: once converted, the processor is gtnorm's."""
    from anemoi.models.layers.processor import GraphTransformerProcessor as AnemoiProcessor
    from anemoi.models.utils.compile import mark_for_compilation
    from omegaconf import OmegaConf

    model = torch.nn.Module()
    model.processor = AnemoiProcessor(**CASE.arguments("pyg") | dict(num_layers=NUM_LAYERS))
    gtnorm.anemoi.use_gtnorm_attention(model, "pyg")
    mark_for_compilation(
        model, OmegaConf.create([{"module": "anemoi.models.layers.processor.GraphTransformerProcessor"}])
    )
    assert getattr(model.processor, "_compiled_call_impl", None) is None
    mark_for_compilation(model, OmegaConf.create([{"module": "gtnorm.anemoi.GraphTransformerProcessor"}]))
    assert getattr(model.processor, "_compiled_call_impl", None) is not None
