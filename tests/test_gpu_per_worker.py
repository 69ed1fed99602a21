"""tests/gpu_per_worker.py's choice of a GPU per xdist worker (the plugin itself ran the GPU suite on four H200s:
benchmarks/results/h200/gpu-tests/)."""

from tests.gpu_per_worker import worker_gpu


def test_workers_take_the_gpus_round_robin():
    assert [worker_gpu(f"gw{i}", 3) for i in range(7)] == ["0", "1", "2", "0", "1", "2", "0"]


def test_spare_gpus_are_left_out():
    assert [worker_gpu(f"gw{i}", 4, "3") for i in range(4)] == ["0", "1", "2", "0"]
    assert [worker_gpu(f"gw{i}", 4, "0, 2") for i in range(3)] == ["1", "3", "1"]


def test_nothing_to_choose():
    assert worker_gpu("master", 4) is None  # not an xdist worker
    assert worker_gpu("gw3", 0) is None  # no GPU
    assert worker_gpu("gw0", 2, "0,1") is None  # every GPU spare
