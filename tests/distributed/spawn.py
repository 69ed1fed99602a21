"""Run a function on several processes joined by a gloo process group, for the CPU tests.

Every rank runs ``fn(rank, world_size, *args)`` and returns a picklable value; the parent gets the values in rank
order. An exception on any rank ends the run: the parent re-raises it with that rank's traceback and the other
ranks are terminated, so a rank that would wait forever in a collective for a failed peer cannot hang the test.
A wall-clock ``timeout`` bounds the whole run, and the process group's own timeout bounds every collective.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from gtnorm._runtime import interpreter_active

COLLECTIVE_TIMEOUT = timedelta(seconds=60)

# The ranks are CPU processes, so gtnorm's kernels run there through the Triton interpreter, which
# tests/conftest.py switches on only on machines without CUDA. With CUDA, benchmarks/distributed/run.py makes the
# same checks on the GPUs (NCCL).
CPU_RANKS_ONLY = pytest.mark.skipif(
    not interpreter_active(), reason="gtnorm's kernels on CPU ranks need TRITON_INTERPRET=1 (set without CUDA)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, out_dir: str, fn, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
    try:
        result = fn(rank, world_size, *args)
        Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    finally:
        dist.destroy_process_group()


def run_on_ranks(fn, *args, world_size: int = 2, timeout: float = 300.0) -> list:
    """``[fn(0, world_size, *args), ..., fn(world_size - 1, world_size, *args)]``, each on its own process.

    ``fn`` must be importable by name (a module-level function): the processes are spawned, not forked.
    """
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(
            _rank_main,
            args=(world_size, free_port(), out_dir, fn, args),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        # join() re-raises a failed rank's exception (and terminates the others) as soon as one fails.
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
                raise TimeoutError(f"{fn.__name__} did not finish on {world_size} ranks within {timeout:.0f} s")
        return [pickle.loads(Path(out_dir, f"rank{r}.pkl").read_bytes()) for r in range(world_size)]
