"""gtnorm.distributed.head_parallel_attention on two gloo ranks (CPU, kernels through the Triton interpreter):
each rank's output rows and every gradient equal to the single-process op's, the norm parameters' gradients
whole on every rank, bitwise equal run to run; ranks that disagree get the same ValueError, none hangs.

One spawn of two processes runs every case (starting a process costs seconds of imports).
"""

from __future__ import annotations

import pytest
import torch

from gtnorm.distributed import HeadParallelPlan, balanced_split, head_parallel_attention
from tests.distributed.head_parallel_ranks import CASES, DISAGREEMENTS, TOL, run_head_parallel_cases
from tests.distributed.spawn import CPU_RANKS_ONLY, run_on_ranks


@pytest.fixture(scope="module")
def results():
    return run_on_ranks(run_head_parallel_cases, world_size=2)


@CPU_RANKS_ONLY
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_matches_single_process_op(results, case):
    for rank, rank_results in enumerate(results):
        outcome = rank_results[case.name]
        assert outcome["heads"] == balanced_split(case.heads, 2)
        assert set(outcome["errors"]) >= {"output", "query", "key", "value"}
        for name, error in outcome["errors"].items():
            assert error <= TOL, f"rank {rank}, {name}: {error:.2e}"
        assert outcome["deterministic"] in ((True, None) if not case.check_determinism else (True,)), f"rank {rank}"


@CPU_RANKS_ONLY
@pytest.mark.parametrize("name", list(DISAGREEMENTS))
def test_disagreeing_ranks_raise_the_same_error(results, name):
    messages = [rank_results["disagreements"][name] for rank_results in results]
    if name == "invalid-on-one-rank":  # the rank at fault says what is wrong, the other which rank it was
        assert messages == ["HeadParallelPlan.build: rank(s) [1] passed invalid arguments (their error says which)",
                            "heads must be a non-negative int, got -1"]  # fmt: skip
    else:
        assert messages[0] is not None and messages[0] == messages[1]


def test_balanced_split_matches_anemoi():
    from anemoi.models.distributed.balanced_partition import get_balanced_partition_sizes

    for total, parts in [(5, 2), (16, 4), (3, 2), (7, 3)]:
        assert list(balanced_split(total, parts)) == get_balanced_partition_sizes(total, parts)


def test_build_needs_a_process_group():
    from gtnorm import GraphLayout

    layout = GraphLayout.from_edge_index(torch.tensor([[0, 1], [1, 0]]), (2, 2))
    with pytest.raises(RuntimeError, match="process group"):
        HeadParallelPlan.build(layout, dst_rows=2, src_rows=2, edge_rows=2, heads=2, channels=8)


def test_tensors_that_do_not_fit_the_plan_raise_before_communicating():
    """check_local runs before any all-to-all: a rank with the wrong shapes raises at once (here without any
    process group, which an all-to-all would need)."""
    plan = HeadParallelPlan(None, 0, dst_rows=(3, 2), src_rows=(2, 2), edge_rows=(4, 1), heads=(2, 1), channels=8)
    q, kv, e = torch.zeros(3, 3, 8), torch.zeros(2, 3, 8), torch.zeros(4, 3, 8)
    layout = None
    with pytest.raises(ValueError, match="key on rank 0 has shape"):
        head_parallel_attention(q, torch.zeros(3, 3, 8), kv, e, layout, plan)
    with pytest.raises(ValueError, match="edge_attr on rank 0"):
        head_parallel_attention(q, kv, kv, torch.zeros(5, 3, 8), layout, plan)
    with pytest.raises(TypeError, match="plan must be"):
        head_parallel_attention(q, kv, kv, e, layout, "plan")
