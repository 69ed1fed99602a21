"""Test set-up: without CUDA the Triton kernels run through the interpreter on CPU tensors.

TRITON_INTERPRET must be set before any kernel is defined, so this runs before gtnorm's kernels import.
"""

import gc
import os
import random

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture
def device():
    return DEVICE


SEED_ENV = "GTNORM_TEST_SEED"


@pytest.fixture(autouse=True)
def torch_seed(request):
    """Every test draws its random inputs from a seed of its own: GTNORM_TEST_SEED where set, else a fresh one. A
    failing test's report names it (pytest_runtest_makereport), so that its inputs can be drawn again."""
    seed = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(2**31))
    torch.manual_seed(seed)
    request.node.gtnorm_seed = seed
    return seed


@pytest.fixture(autouse=True)
def release_gpu_memory(request):
    """After a GPU test, its memory goes back to the device: the large tests (tests/triton/test_attention_large.py,
    the mapper block's) take 30-60 GB each, which the caching allocator would otherwise keep in blocks of the last
    test's sizes."""
    yield
    if HAS_CUDA and "gpu" in request.keywords:
        gc.collect()
        torch.cuda.empty_cache()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    seed = getattr(item, "gtnorm_seed", None)
    if report.failed and seed is not None:
        report.sections.append(("torch seed", f"torch.manual_seed({seed}); rerun with {SEED_ENV}={seed}"))


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def count_layout_builds(monkeypatch):
    """Counts GraphLayout builds (the layout cache's, and any other)."""
    from gtnorm.triton.layout import GraphLayout

    builds = []
    original = GraphLayout.from_edge_index

    def counting(edge_index, num_nodes=None, **kwargs):
        builds.append((edge_index.shape[1], tuple(num_nodes)))
        return original(edge_index, num_nodes, **kwargs)

    monkeypatch.setattr(GraphLayout, "from_edge_index", staticmethod(counting))
    return builds


@pytest.fixture
def count_compares(monkeypatch):
    """Content compares that reach the device (each ends in one host sync): the graphs of matching sizes compared."""
    compares = []
    from gtnorm.triton import layout_cache

    original = layout_cache._first_match

    def counting(edge_index, candidates):
        if candidates:
            compares.append(edge_index.shape[1])
        return original(edge_index, candidates)

    monkeypatch.setattr(layout_cache, "_first_match", counting)
    return compares
