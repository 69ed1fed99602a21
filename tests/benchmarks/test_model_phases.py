"""benchmarks.model.phases: the boundaries of a logged step of the tiny model (CPU: labels only, memory reads 0)."""

from __future__ import annotations

from dataclasses import replace

from tests.requirements import ANEMOI_GRAPHS, ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)
require_module("anemoi.graphs", ANEMOI_GRAPHS)

import torch  # noqa: E402
from anemoi.models.layers import mapper as anemoi_mapper  # noqa: E402

from benchmarks.model import run  # noqa: E402
from benchmarks.model.config import ModelSpec  # noqa: E402
from benchmarks.model.graph import build_model_graph  # noqa: E402
from benchmarks.model.phases import PhaseLog, logged_step  # noqa: E402


def test_a_step_logs_every_chunk_forward_recomputed_and_backward():
    """Mapper chunks run forward, are recomputed in the backward (checkpointed; the decoder's last chunk is kept
    instead) and get their gradient; processor chunks too; only the second (warm) step is logged, and Anemoi's
    methods are restored afterwards."""
    original = anemoi_mapper.GraphTransformerBaseMapper.run_processor_chunk
    spec = replace(ModelSpec(**run.TINY_MODEL), qk_norm=True)
    case = run.Case(run.Variant.parse("gtnorm/default"), spec, run.TINY_DATA, build_model_graph("o2_r0"),
                    torch.float32, torch.device("cpu"))  # fmt: skip
    labels = [label for label, _, _ in logged_step(case, PhaseLog())]
    assert labels[0] == "step starts" and labels[-1] == "step ends"
    for mapper in ("ForwardMapper", "BackwardMapper"):
        for chunk in range(spec.mapper_chunks):
            kept = mapper == "BackwardMapper" and chunk == spec.mapper_chunks - 1
            for phase in ("forward", "forward, done", "recomputed", "backward"):
                expected = 0 if kept and phase == "recomputed" else 1
                assert labels.count(f"{mapper} chunk {chunk} {phase}") == expected, (mapper, chunk, phase, labels)
    for chunk in range(spec.mapper_chunks):  # inside the decoder chunk's backward, in the backward's order
        ends = [labels.index(f"BackwardMapper chunk {chunk} backward{end}")
                for end in ("", ": head done", ": block done", ": embedding done")]  # fmt: skip
        assert ends == sorted(ends), labels
    for start in range(0, spec.num_layers, spec.num_layers // spec.processor_chunks):
        assert labels.count(f"processor layers {start}+") == 2  # forward and recomputed
        assert labels.count(f"processor layers {start}+ backward") == 1
    # the backward runs the decoder's chunks before the processor's, the processor's before the encoder's
    order = [labels.index(f"{m} backward") for m in ("BackwardMapper chunk 0", "processor layers 0+",
                                                     "ForwardMapper chunk 0")]  # fmt: skip
    assert order == sorted(order)
    assert anemoi_mapper.GraphTransformerBaseMapper.run_processor_chunk is original
