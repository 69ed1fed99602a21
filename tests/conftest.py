"""Test set-up: without CUDA the Triton kernels run through the interpreter on CPU tensors.

TRITON_INTERPRET must be set before any kernel is defined, so this runs before gtnorm's kernels import.
"""

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture
def device():
    return DEVICE


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
