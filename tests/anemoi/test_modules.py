"""gtnorm's drop-ins against Anemoi's own processor / encoder / decoder (PyG backend), fp32 on the CPU:
the same state_dict, the same output and the same gradient for every parameter and input.

Tolerance: TOL, a norm-wise relative error per tensor. Both sides compute in float32; they differ only in
summation order and in where the norm is computed (inside the kernels or before them), which costs a few
ulps per step, compounded over the blocks.
"""

from __future__ import annotations

import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

import torch  # noqa: E402
from anemoi.models.layers import block as anemoi_block  # noqa: E402
from anemoi.models.layers import mapper as anemoi_mapper  # noqa: E402

from tests.anemoi.setups import Case, assert_steps_match, build_pair, forward, make_inputs, rel_error, training_step  # noqa: E402
from tests.launches import FORWARD_CALLS, PYG_CALLS, attention_ran, count_launches  # noqa: E402

TOL = 2e-5
KINDS = ("processor", "encoder", "decoder")
NORMS = ("off", "layer", "rms")


def check_training_step(case: Case, backend: str, device: torch.device) -> None:
    anemoi_module, gtnorm_module = build_pair(case, backend, device)
    inputs = make_inputs(case, device)
    expected = training_step(anemoi_module, case, inputs)
    with count_launches() as launches:
        actual = training_step(gtnorm_module, case, inputs)
    assert_steps_match(actual, expected, TOL)
    if backend == "triton":  # the drop-in ran gtnorm's kernels, forward and backward
        assert attention_ran(launches) is None, attention_ran(launches)
    else:
        assert launches[FORWARD_CALLS] == 0 and launches[PYG_CALLS] > 0, launches


@pytest.mark.parametrize("backend", ["triton", "pyg"])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("kind", KINDS)
def test_training_step_matches_anemoi(kind, norm, backend, device):
    """Two copies of the graph (batch x ensemble), gradient checkpointing on (Anemoi's default)."""
    check_training_step(Case(kind, norm=norm), backend, device)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Case("processor", checkpoint=False), id="processor-no-checkpoint"),
        pytest.param(Case("processor", num_chunks=2), id="processor-2-layer-chunks"),
        pytest.param(Case("processor", shard_strategy="heads", batch=1), id="processor-heads"),
        pytest.param(Case("processor", edge_pre_mlp=True, attn_channels=8), id="processor-edge-mlp-attn-channels"),
        pytest.param(Case("processor", norm="layer_bias"), id="processor-layernorm-bias"),
        pytest.param(Case("encoder", checkpoint=False, batch=1), id="encoder-no-checkpoint"),
        pytest.param(Case("encoder", num_chunks=3), id="encoder-3-chunks"),
        pytest.param(Case("encoder", shard_strategy="heads", batch=1), id="encoder-heads"),
        pytest.param(Case("decoder", edge_pre_mlp=True, attn_channels=8, norm="rms"), id="decoder-edge-mlp-attn"),
    ],
)
def test_training_step_variants_match_anemoi(case, device):
    check_training_step(case, "triton", device)


def test_unfused_norm_matches_anemoi_and_warns(device):
    """A QK norm the kernels cannot run (neither LayerNorm nor RMSNorm) is applied before them, with a warning."""
    with pytest.warns(UserWarning, match="not fused"):
        check_training_step(Case("processor", norm="other"), "triton", device)


@pytest.mark.parametrize("kind, norm", [("processor", "layer"), ("encoder", "rms"), ("decoder", "layer")])
def test_inference_mode_with_inference_chunks(kind, norm, device, monkeypatch):
    """Under torch.inference_mode, with Anemoi's inference chunks: the processor sums per-chunk outputs (each
    chunk leaves most destinations without edges), the mappers run one chunk of destinations at a time."""
    monkeypatch.setattr(anemoi_block, "NUM_CHUNKS_INFERENCE_PROCESSOR", 3)
    monkeypatch.setattr(anemoi_mapper, "NUM_CHUNKS_INFERENCE_MAPPER", 3)
    case = Case(kind, norm=norm)
    anemoi_module, gtnorm_module = build_pair(case, "triton", device)
    inputs = make_inputs(case, device)
    with torch.inference_mode():
        expected = forward(anemoi_module.eval(), case, inputs)
        actual = forward(gtnorm_module.eval(), case, inputs)
    assert rel_error(actual, expected) <= TOL


@pytest.mark.parametrize("norm", ["off", "layer", "layer_bias", "rms", "other"])
@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_is_anemoi_s(kind, norm):
    """The same keys, shapes and parameters as Anemoi's module, and a state_dict moves both ways (strict)."""
    case = Case(kind, norm=norm)
    anemoi_module, gtnorm_module = build_pair(case, "triton", torch.device("cpu"))
    anemoi_state, gtnorm_state = anemoi_module.state_dict(), gtnorm_module.state_dict()
    assert list(gtnorm_state) == list(anemoi_state)
    assert [p.shape for p in gtnorm_module.parameters()] == [p.shape for p in anemoi_module.parameters()]
    for key, value in anemoi_state.items():
        assert torch.equal(gtnorm_state[key], value), key

    with torch.no_grad():
        for p in gtnorm_module.parameters():
            p.mul_(-1.5)
    anemoi_module.load_state_dict(gtnorm_module.state_dict(), strict=True)
    for key, value in gtnorm_module.state_dict().items():
        assert torch.equal(anemoi_module.state_dict()[key], value), key


@pytest.mark.parametrize("kind", KINDS)
def test_compiled_module_matches_anemoi(kind, device):
    """torch.compile of a whole drop-in (Anemoi's code around gtnorm's ops, checkpointing on): the compiled
    training step matches Anemoi's eager one (aot_eager on the CPU: inductor would need a C++ toolchain)."""
    case = Case(kind, norm="layer")
    anemoi_module, gtnorm_module = build_pair(case, "triton", device)
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    gtnorm_module.compile(backend=backend)  # in place: the parameters keep their names
    inputs = make_inputs(case, device)
    expected = training_step(anemoi_module, case, inputs)
    for _ in range(2):  # the second step runs the compiled graph without recompiling it
        assert_steps_match(training_step(gtnorm_module, case, inputs), expected, TOL)
