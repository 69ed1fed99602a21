"""gtnorm's mappers with node_chunk_rows (gtnorm/anemoi/row_parts.py): the row-wise work on a chunk's destinations
(the blocks' MLP, the decoder's output head) in checkpointed parts when gradients are taken, the same results."""

from __future__ import annotations

import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

import torch  # noqa: E402
from anemoi.models.utils.compile import mark_for_compilation  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import gtnorm.anemoi  # noqa: E402
from gtnorm.anemoi import mapper as mapper_module  # noqa: E402
from tests.anemoi.setups import Case, assert_steps_match, build_pair, forward, make_inputs, training_step  # noqa: E402
from tests.anemoi.test_mlp_parts import count_parts  # noqa: E402

PART_ROWS = 5
# The decoder's 16 destinations per copy of its graph (setups.GRAPH_SIZES), 2 copies, in 2 chunks.
CASE = Case("decoder", norm="layer", num_chunks=2)
CHUNK_ROWS = CASE.batch * 16 // CASE.num_chunks


def _record_rows(decoder, monkeypatch) -> dict[str, list[int]]:
    """The rows of every call of the decoder's block MLP and of its output head (the op of output_head.py, called
    by the mapper's post_process), appended as they run."""
    rows = {"mlp": [], "head": []}
    for block in decoder.modules():
        if isinstance(block, gtnorm.anemoi.GraphTransformerMapperBlock):
            block.node_dst_mlp.register_forward_hook(lambda _, args, __: rows["mlp"].append(args[0].shape[0]))
    own_head, output_head = decoder.node_data_extractor, mapper_module.output_head

    def recorded(x, head):  # called as the mapper calls it: partial(output_head, head=...)
        if head is own_head:
            rows["head"].append(x.shape[0])
        return output_head(x, head=head)

    monkeypatch.setattr(mapper_module, "output_head", recorded)
    return rows


def test_parts_keep_the_step_and_the_mlp_runs_no_more_often(device, monkeypatch):
    """The step's output and every gradient are those of one call per chunk; each part has at most
    node_chunk_rows rows. In eager mode the MLP runs no more often than in one call per chunk (forward and the
    chunk's recomputation, which stops early: torch's non-reentrant checkpoints); the output head (a LayerNorm and
    a 1024 -> 100 Linear) may run parts once more. At inference, one call per chunk."""
    _, whole = build_pair(CASE, "triton", device)
    _, in_parts = build_pair(CASE, "triton", device)
    inputs = make_inputs(CASE, device)
    whole_rows, part_rows = _record_rows(whole, monkeypatch), _record_rows(in_parts, monkeypatch)
    op_parts = count_parts(monkeypatch)  # eager: checkpointed parts, not the op
    expected = training_step(whole, CASE, inputs)
    in_parts.node_chunk_rows = PART_ROWS
    assert_steps_match(training_step(in_parts, CASE, inputs), expected, 1e-6)
    for work in ("mlp", "head"):
        # Forward, then the recomputation of every chunk but the last, which the decoder keeps.
        assert whole_rows[work] == [CHUNK_ROWS] * (2 * CASE.num_chunks - 1)
        assert max(part_rows[work]) == PART_ROWS, work
    assert sum(part_rows["mlp"]) == sum(whole_rows["mlp"])
    assert op_parts == []
    for rows in part_rows.values():
        rows.clear()
    with torch.no_grad():
        forward(in_parts, CASE, inputs)
    assert part_rows == {"mlp": [CHUNK_ROWS] * CASE.num_chunks, "head": [CHUNK_ROWS] * CASE.num_chunks}


def test_parts_compile_into_the_block(device, monkeypatch):
    """Parts inside the mapper block compiled through Anemoi's compile config (anemoi-training's path), with
    fullgraph=True: no graph break, the step matches the eager one without parts, and the MLP ran as the op of
    gtnorm/anemoi/mlp_parts.py (its parts counted: forward, the chunk's recomputation and the backward; the last
    chunk, which the decoder keeps, is not recomputed)."""
    parts = count_parts(monkeypatch)
    _, whole = build_pair(CASE, "triton", device)
    _, in_parts = build_pair(
        CASE,
        "triton",
        device,
    )
    inputs = make_inputs(CASE, device)
    expected = training_step(whole, CASE, inputs)
    in_parts.node_chunk_rows = PART_ROWS
    torch._dynamo.reset()
    counters.clear()
    options = {"backend": "inductor" if device.type == "cuda" else "aot_eager", "fullgraph": True}
    entry = {"module": "gtnorm.anemoi.GraphTransformerMapperBlock", "options": options}
    mark_for_compilation(in_parts, OmegaConf.create([entry]))
    try:
        assert_steps_match(training_step(in_parts, CASE, inputs), expected, 1e-5)
        assert dict(counters["graph_break"]) == {}
        chunk_parts = [PART_ROWS] * (CHUNK_ROWS // PART_ROWS) + [CHUNK_ROWS % PART_ROWS] * bool(CHUNK_ROWS % PART_ROWS)
        assert parts == chunk_parts * (3 * CASE.num_chunks - 1), parts
    finally:
        torch._dynamo.reset()


def test_set_through_the_config_and_checked():
    """node_chunk_rows as a mapper's config key reaches its blocks; anything but a positive int or None is
    refused with a clear error."""
    decoder = gtnorm.anemoi.GraphTransformerBackwardMapper(**CASE.arguments("triton"), node_chunk_rows=7)
    blocks = [m for m in decoder.modules() if isinstance(m, gtnorm.anemoi.GraphTransformerMapperBlock)]
    assert blocks and all(block.node_chunk_rows == 7 for block in blocks)
    for bad in (0, -3, 2.5, True, "131072"):
        with pytest.raises(ValueError, match="node_chunk_rows must be a positive int or None"):
            decoder.node_chunk_rows = bad
    decoder.node_chunk_rows = None
    assert all(block.node_chunk_rows is None for block in blocks)


def test_converted_mapper_has_the_setting(device):
    """A mapper converted by use_gtnorm_attention starts with node_chunk_rows None and takes it as a built one."""
    anemoi_decoder, _ = build_pair(CASE, "triton", device)
    converted = gtnorm.anemoi.use_gtnorm_attention(anemoi_decoder)
    assert converted.node_chunk_rows is None
    converted.node_chunk_rows = 4
    blocks = [m for m in converted.modules() if isinstance(m, gtnorm.anemoi.GraphTransformerMapperBlock)]
    assert blocks and all(block.node_chunk_rows == 4 for block in blocks)
