"""pytest plugin for machines with several GPUs: each pytest-xdist worker sees one GPU, round robin.

    python -m pytest -n 52 -p tests.gpu_per_worker tests/...

The GPU tests are bound by compiling kernels on the host, so a machine with many cores runs many workers, and the
large tests take 30-60 GB each: on one GPU several of them at once would not fit. Loaded with ``-p``, this module
runs in each worker before tests/conftest.py imports torch, so ``CUDA_VISIBLE_DEVICES`` is set before CUDA starts
and every test still sees its GPU as ``cuda:0``. ``GTNORM_SPARE_GPUS`` (comma-separated indices) keeps GPUs out of
the rotation, e.g. for a benchmark running beside the tests. Without xdist, or without nvidia-smi, it does nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess


def worker_gpu(worker: str, gpu_count: int, spare: str = "") -> str | None:
    """The GPU index (as CUDA_VISIBLE_DEVICES takes it) for xdist worker ``worker`` ("gw0", "gw1", ...), or None
    where there is nothing to choose (not an xdist worker, or no GPU outside the spare ones)."""
    if not worker.startswith("gw"):
        return None
    spare_gpus = {int(index) for index in spare.split(",") if index.strip()}
    gpus = [gpu for gpu in range(gpu_count) if gpu not in spare_gpus]
    return str(gpus[int(worker[2:]) % len(gpus)]) if gpus else None


def _gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    return sum(line.startswith("GPU ") for line in listing.splitlines())


_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker and "CUDA_VISIBLE_DEVICES" not in os.environ:
    _gpu = worker_gpu(_worker, _gpu_count(), os.environ.get("GTNORM_SPARE_GPUS", ""))
    if _gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = _gpu
