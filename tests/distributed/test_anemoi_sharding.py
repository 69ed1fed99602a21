"""Anemoi's processor, encoder and decoder sharded over a model group of two ranks (gloo, CPU), "edges" and
"heads" strategies: output, input gradients and every parameter gradient (after the reduction Anemoi's training
applies), and the output of inference under torch.inference_mode, equal to the same module run whole, for
gtnorm's drop-ins and, beside them, for Anemoi's own modules.

Two processes run every case in one spawn (starting a process costs seconds of imports); gtnorm's kernels run
through the Triton interpreter (TRITON_INTERPRET=1, set by tests/conftest.py and inherited by the processes),
Anemoi's modules on their PyG backend (Anemoi's Triton backend needs CUDA).
"""

from __future__ import annotations

import pytest

from tests.requirements import ANEMOI_MODELS, require_module

require_module("anemoi.models", ANEMOI_MODELS)

from tests.distributed.anemoi_ranks import TOL, run_anemoi_cases, sharded_cases  # noqa: E402
from tests.distributed.spawn import CPU_RANKS_ONLY, run_on_ranks  # noqa: E402
from tests.launches import BY_DESTINATION, BY_SOURCE, FORWARD, FORWARD_CALLS, PYG_CALLS, attention_ran  # noqa: E402

CASE_NAMES = [item.name for item in sharded_cases()]


@pytest.fixture(scope="module")
def results():
    return run_on_ranks(run_anemoi_cases, CASE_NAMES, world_size=2)


@CPU_RANKS_ONLY
@pytest.mark.parametrize("name", CASE_NAMES)
def test_sharded_step_matches_whole(results, name):
    for rank_results in results:
        outcome = rank_results[name]
        assert outcome["error"] is None, outcome["error"]
        assert outcome["output_error"] <= TOL
        assert outcome["inference_error"] <= TOL, outcome["inference_error"]
        # Counted on each rank: gtnorm's drop-ins ran its kernels on their shard, forward and backward, and never
        # its PyG path; Anemoi's modules (its PyG backend on the CPU) launched none of them.
        launches = outcome["launches"]
        if name.endswith("-gtnorm"):
            assert attention_ran(launches) is None, attention_ran(launches)
        else:
            assert not any(launches.get(k) for k in (FORWARD, BY_DESTINATION, BY_SOURCE, FORWARD_CALLS)), launches
            assert not launches.get(PYG_CALLS), launches  # Anemoi's own PyG conv, not gtnorm's layer
