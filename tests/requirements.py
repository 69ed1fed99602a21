"""Optional test dependencies (anemoi-models, anemoi-graphs, scipy, Anemoi's test sources): skipped where missing
on a developer's machine, an error under ``GTNORM_REQUIRE_TEST_DEPS=1``, which CI sets (.ci/run), so that a
failed install or download cannot silently drop a third of the suite there."""

from __future__ import annotations

import importlib
import os

import pytest

REQUIRE_ENV = "GTNORM_REQUIRE_TEST_DEPS"


def required() -> bool:
    return os.environ.get(REQUIRE_ENV, "0") not in ("", "0")


def require_module(name: str, reason: str):
    """The module, imported; where it is missing, a skip (with ``reason``), or under GTNORM_REQUIRE_TEST_DEPS the
    ImportError itself (a collection error: the run fails)."""
    if required():
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=reason)


def missing(reason: str) -> None:
    """Something a test needs is absent: skip, or fail under GTNORM_REQUIRE_TEST_DEPS."""
    if required():
        pytest.fail(f"{reason} ({REQUIRE_ENV} is set: missing test dependencies are errors)")
    pytest.skip(reason)


ANEMOI_MODELS = "needs anemoi-models (pip install --no-deps anemoi-models==0.19.0)"
ANEMOI_GRAPHS = "needs anemoi-graphs (pip install --no-deps anemoi-graphs==0.9.8)"
SCIPY = "the benchmark graphs need scipy"
