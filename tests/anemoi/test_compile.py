"""gtnorm's drop-ins under torch.compile, as Anemoi users compile them: ``torch.compile(module)`` on a processor or
mapper, and anemoi-models' ``mark_for_compilation`` (what anemoi-training runs on the modules its config lists).

What is checked: the processor and its blocks are captured whole (``fullgraph=True``); the mappers break only where
their per-graph chunk preparation runs (gtnorm.anemoi.mapper._prepared_partition), and no more often than Anemoi's
own mappers break there; a new edge_index tensor each step (the same graph, or another graph of the same shape)
runs the compiled graph again without recompiling, and gets its own layout; compiled outputs and every gradient
match eager ones, in training (checkpointing on) and under ``torch.inference_mode``.

On the CPU the kernels run through the Triton interpreter and the backend is aot_eager (inductor would need a C++
toolchain); on CUDA, inductor.
"""

from __future__ import annotations

import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
from anemoi.models.utils.compile import mark_for_compilation  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import gtnorm.triton.config  # noqa: E402
from tests.anemoi.setups import (  # noqa: E402
    GRAPH_SIZES,
    Case,
    Inputs,
    assert_steps_match,
    build_pair,
    forward,
    make_inputs,
    random_edges,
    rel_error,
    training_step,
)
from tests.launches import FORWARD, count_launches  # noqa: E402

BACKEND = "inductor" if torch.cuda.is_available() else "aot_eager"
# Compiled and eager runs share the kernels; only the code around them may be fused differently.
TOL = 1e-5
# Where gtnorm's mappers leave the traced graph: their per-graph preparation (one break per preparation).
PREPARATION = "_prepared_partition"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def graph_breaks() -> dict[str, int]:
    return dict(counters["graph_break"])


def new_tensor_each_step(inputs: Inputs) -> Inputs:
    """The same graph in a new edge_index tensor, as Anemoi's graph providers hand it over every step."""
    return Inputs(inputs.x, inputs.edge_attr, inputs.edge_index.clone(), inputs.batch)


def another_graph_of_the_same_shape(case: Case, inputs: Inputs, edges, seed: int) -> Inputs:
    """Other edges from ``edges(num_src, num_dst, generator)``, the same number of them (drawn until it matches)."""
    num_edges = inputs.edge_index.shape[1] // inputs.batch
    generator = torch.Generator().manual_seed(seed)
    num_src, num_dst = GRAPH_SIZES[case.kind]
    while (one_copy := edges(num_src, num_dst, generator)).shape[1] != num_edges:
        pass
    return make_inputs(case, inputs.edge_index.device, graph=(one_copy, num_src, num_dst))


def dense_edges(num_src: int, num_dst: int, generator: torch.Generator) -> torch.Tensor:
    """[2, M] sorted by destination, 6 to 8 edges each: dense enough for the fused edge projection's dispatch rule
    (config.edge_projection_pays, its minimum graph size lowered by the test), whose plan lookup is then traced
    too."""
    degree = torch.randint(6, 9, (num_dst,), generator=generator)
    dst = torch.arange(num_dst).repeat_interleave(degree)
    return torch.stack([torch.randint(0, num_src, (dst.numel(),), generator=generator), dst])


@pytest.mark.parametrize("norm, edges", [("layer", dense_edges), ("off", random_edges)], ids=["layer-dense", "off"])
def test_processor_is_one_graph_and_matches_eager(norm, edges, device, monkeypatch):
    """fullgraph=True on the whole processor (checkpointing on): no break; later steps with a new edge_index tensor
    of the same graph, then of another graph of that shape, run the same compiled graph and match eager."""
    monkeypatch.setattr(gtnorm.triton.config, "_PROJECTION_MIN_EDGES", 0)  # the rule's own tests: test_config.py
    case = Case("processor", norm=norm, num_chunks=2)  # 2 layers, one checkpoint each
    _, module = build_pair(case, "triton", device)
    counter = CompileCounterWithBackend(BACKEND)
    compiled = torch.compile(module, backend=counter, fullgraph=True)
    num_src, num_dst = GRAPH_SIZES["processor"]
    graph = (edges(num_src, num_dst, torch.Generator().manual_seed(3)), num_src, num_dst)
    inputs = make_inputs(case, device, graph=graph)
    steps = [inputs, new_tensor_each_step(inputs), another_graph_of_the_same_shape(case, inputs, edges, seed=5)]
    for step_inputs in steps:
        assert_steps_match(training_step(compiled, case, step_inputs), training_step(module, case, step_inputs), TOL)
    assert counter.frame_count == 1, "recompiled for a new edge_index tensor"
    assert graph_breaks() == {}


def test_processor_keeping_attention_outputs_is_one_graph_that_runs_each_attention_forward_once(device):
    """keep_attention_outputs under fullgraph=True: the checkpoints' selective policy (kept_outputs.py) traces
    without a break; the compiled step launches each layer's attention forward once (plain checkpointing: twice)
    and matches the eager processor's, which recomputes it."""
    case = Case("processor", norm="layer", num_chunks=2)  # 2 layers, one checkpoint each
    _, module = build_pair(case, "triton", device)
    inputs = make_inputs(case, device)
    expected = training_step(module, case, inputs)
    module.keep_attention_outputs = True
    counter = CompileCounterWithBackend(BACKEND)
    compiled = torch.compile(module, backend=counter, fullgraph=True)
    training_step(compiled, case, inputs)  # compiles
    with count_launches() as launches:
        actual = training_step(compiled, case, inputs)
    assert launches[FORWARD] == 2, launches
    assert_steps_match(actual, expected, TOL)
    assert counter.frame_count == 1 and graph_breaks() == {}


def test_processor_block_through_anemoi_compile_config(device):
    """anemoi-models' mark_for_compilation (anemoi-training's path) compiling the blocks a config lists, with
    fullgraph=True: each block is one graph, the step matches eager."""
    case = Case("processor", norm="layer", num_chunks=2)
    _, module = build_pair(case, "triton", device)
    num_src, num_dst = GRAPH_SIZES["processor"]
    inputs = make_inputs(case, device, graph=(dense_edges(num_src, num_dst, torch.Generator()), num_src, num_dst))
    expected = training_step(module, case, inputs)
    options = {"backend": BACKEND, "fullgraph": True}
    entry = {"module": "gtnorm.anemoi.GraphTransformerProcessorBlock", "options": options}
    mark_for_compilation(module, OmegaConf.create([entry]))  # a model config's ``compile`` list
    for step_inputs in (inputs, new_tensor_each_step(inputs)):
        assert_steps_match(training_step(module, case, step_inputs), expected, TOL)
    assert graph_breaks() == {}


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_mapper_block_through_anemoi_compile_config_compiles_once(kind, device):
    """mark_for_compilation on gtnorm's mapper block (4 chunks of different sizes, checkpointing on): one compiled
    graph serves every chunk (their sizes marked dynamic before the first call: mapper.sizes_vary_by_chunk), so no
    chunk's recomputation in the backward can run another graph than its forward did (a CheckpointError on the
    GPU at O96 before); the step matches Anemoi's eager one."""
    case = Case(kind, norm="layer", num_chunks=4)
    anemoi_module, module = build_pair(case, "triton", device, anemoi_backend="pyg")
    inputs = make_inputs(case, device)
    expected = training_step(anemoi_module, case, inputs)
    counter = CompileCounterWithBackend(BACKEND)
    entry = {"module": "gtnorm.anemoi.GraphTransformerMapperBlock", "options": {"backend": counter}}
    mark_for_compilation(module, OmegaConf.create([entry], flags={"allow_objects": True}))
    for step_inputs in (inputs, new_tensor_each_step(inputs)):
        assert_steps_match(training_step(module, case, step_inputs), expected, TOL)
    assert counter.frame_count == 1, "the block compiled again for another chunk's sizes"


def _mapper_breaks(module, case: Case, inputs: Inputs) -> dict[str, int]:
    torch._dynamo.reset()
    counters.clear()
    training_step(torch.compile(module, backend=BACKEND), case, inputs)
    return graph_breaks()


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_mapper_breaks_only_where_anemoi_s_does(kind, device):
    """The mappers (4 chunks, checkpointing on) break only at their chunk preparation, no more often than Anemoi's
    own mappers (which break at their partition's ``.item()`` and more); the compiled step matches Anemoi's eager
    one, and a second step with a new edge_index tensor recompiles nothing."""
    case = Case(kind, norm="layer", num_chunks=4)
    anemoi_module, module = build_pair(case, "triton", device, anemoi_backend="pyg")
    inputs = make_inputs(case, device)
    expected = training_step(anemoi_module, case, inputs)
    anemoi_breaks = _mapper_breaks(anemoi_module, case, inputs)

    torch._dynamo.reset()
    counters.clear()
    counter = CompileCounterWithBackend(BACKEND)
    compiled = torch.compile(module, backend=counter)
    assert_steps_match(training_step(compiled, case, inputs), expected, TOL)
    breaks = graph_breaks()
    assert all(PREPARATION in reason for reason in breaks), breaks
    assert sum(breaks.values()) <= sum(anemoi_breaks.values()), (breaks, anemoi_breaks)
    graphs = counter.frame_count
    assert_steps_match(training_step(compiled, case, new_tensor_each_step(inputs)), expected, TOL)
    assert counter.frame_count == graphs, "recompiled for a new edge_index tensor"


@pytest.mark.parametrize("kind", ["processor", "encoder", "decoder"])
def test_inference_mode_compiled_matches_eager(kind, device):
    """torch.inference_mode forward of the compiled module: Anemoi's inference path, traced."""
    case = Case(kind, norm="layer", num_chunks=2 if kind == "processor" else 4)
    _, module = build_pair(case, "triton", device)
    module.eval()
    compiled = torch.compile(module, backend=BACKEND, fullgraph=kind == "processor")
    inputs = make_inputs(case, device)
    with torch.inference_mode():
        expected = forward(module, case, inputs)
        for step_inputs in (inputs, new_tensor_each_step(inputs)):
            assert rel_error(forward(compiled, case, step_inputs), expected) <= TOL
