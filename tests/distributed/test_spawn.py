"""The 2-process harness itself: a rank that fails ends the run at once, even while its peer waits for it in a
collective (the peer is terminated, the parent raises the failing rank's error)."""

from __future__ import annotations

import time

import pytest
from torch.multiprocessing import ProcessRaisedException

from tests.distributed.spawn import COLLECTIVE_TIMEOUT, run_on_ranks


def fail_on_rank_1(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 gives up")
    # Rank 0 waits as long as a collective would for a dead peer (a barrier itself may fail first, when gloo sees
    # the peer's socket close: then which rank's error arrives first would be a race).
    time.sleep(COLLECTIVE_TIMEOUT.total_seconds())


def test_a_failing_rank_ends_the_run_without_waiting_for_its_peer():
    start = time.monotonic()
    with pytest.raises(ProcessRaisedException, match="rank 1 gives up"):
        run_on_ranks(fail_on_rank_1, world_size=2, timeout=50)
    assert time.monotonic() - start < 30
