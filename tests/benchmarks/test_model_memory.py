"""benchmarks.model.memory's replay of an allocator trace, on hand-made events (the recording needs CUDA)."""

from __future__ import annotations

import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

from benchmarks.model.memory import BEFORE_STEP, GIB, NO_FRAME, allocation_site, peak_of_trace  # noqa: E402


def _frame(path: str, line: int, name: str) -> dict:
    return {"filename": path, "line": line, "name": name}


MLP = [_frame("/x/torch/nn/modules/linear.py", 125, "forward"), _frame("/y/anemoi/models/layers/mlp.py", 40, "f")]
ATTENTION = [_frame("/z/site-packages/gtnorm/triton/ops.py", 7, "attention")]


def test_the_innermost_frame_of_a_known_package_names_the_site():
    assert allocation_site(MLP) == "torch/nn/modules/linear.py:125 forward"
    assert allocation_site(ATTENTION) == "gtnorm/triton/ops.py:7 attention"
    assert allocation_site([]) == NO_FRAME
    assert allocation_site([_frame("/elsewhere/mine.py", 3, "g")]) == "mine.py:3 g"


def test_the_peak_and_what_is_alive_there():
    events = [
        {"action": "alloc", "addr": 1, "size": 3 * GIB, "frames": MLP},
        {"action": "alloc", "addr": 2, "size": 2 * GIB, "frames": ATTENTION},
        {"action": "free_requested", "addr": 1, "size": 3 * GIB},
        {"action": "free_completed", "addr": 1, "size": 3 * GIB},  # the peak (6 GiB) was before this
        {"action": "alloc", "addr": 3, "size": 1 * GIB, "frames": []},
        {"action": "free_completed", "addr": 99, "size": 1 * GIB},  # a block from before the step
    ]
    result = peak_of_trace(events, before_bytes=1 * GIB)
    assert result["peak_gib"] == pytest.approx(6.0)
    assert result["reached_by"] == "gtnorm/triton/ops.py:7 attention"
    assert result["alive_gib_by_site"] == {
        "torch/nn/modules/linear.py:125 forward": pytest.approx(3.0),
        "gtnorm/triton/ops.py:7 attention": pytest.approx(2.0),
        BEFORE_STEP: pytest.approx(1.0),
    }
