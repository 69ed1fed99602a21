"""A pytest plugin for Anemoi's own test files (tests/anemoi/test_upstream.py): loaded before they are collected,
it puts gtnorm.anemoi's drop-ins where anemoi-models' modules define the graph-transformer block, processor and
mapper classes, so that those files' ``from anemoi.models.layers... import ...`` get the drop-ins.

With ``GTNORM_LAUNCH_COUNTS`` set to a file name it also counts, per test, the launches of gtnorm's kernels and
the calls of its attention op and of its PyG path (tests/launches.py), and writes them there as JSON
({test id: {name: count}}) when the session ends: what test_upstream.py checks that the kernels ran with.
"""

import json
import os

import pytest
from anemoi.models.layers import block, mapper, processor

import gtnorm.anemoi
from tests.launches import count_launches

block.GraphTransformerProcessorBlock = gtnorm.anemoi.GraphTransformerProcessorBlock
block.GraphTransformerMapperBlock = gtnorm.anemoi.GraphTransformerMapperBlock
processor.GraphTransformerProcessor = gtnorm.anemoi.GraphTransformerProcessor
mapper.GraphTransformerForwardMapper = gtnorm.anemoi.GraphTransformerForwardMapper
mapper.GraphTransformerBackwardMapper = gtnorm.anemoi.GraphTransformerBackwardMapper

COUNTS_FILE = os.environ.get("GTNORM_LAUNCH_COUNTS")
_counts: dict[str, dict[str, int]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if COUNTS_FILE is None:
        yield
        return
    with count_launches() as counts:
        yield
    _counts[item.nodeid] = dict(counts)


def pytest_sessionfinish(session, exitstatus):
    if COUNTS_FILE is not None:
        with open(COUNTS_FILE, "w") as f:
            json.dump(_counts, f)
