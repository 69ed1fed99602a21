"""Anemoi's own unit tests of the graph-transformer block, processor and mappers, unchanged, with gtnorm.anemoi's
drop-ins swapped in (tests/anemoi/upstream_swap.py): they must pass as they pass on Anemoi's own classes.

Those tests build their blocks with ``graph_attention_backend="pyg"``, which the drop-ins would map to gtnorm's
PyG path; the swapped run sets Anemoi's own override, ``ANEMOI_INFERENCE_GRAPHTRANSFORMER_ATTENTION_BACKEND=triton``
(read by anemoi.models.layers.block at import), so that the drop-ins run gtnorm's kernels, and counts their
launches per test (tests/launches.py): every test that called the drop-ins' attention must have launched the
kernels and never taken the PyG path. Anemoi's own run keeps the PyG backend (its Triton one needs CUDA).

The test files come from the source distribution of the installed anemoi-models version, which ``bash run.sh``
downloads beside the environment when it installs it (``$VENV/anemoi-models-sdist``; another folder:
``GTNORM_ANEMOI_SDIST``). They run in a separate pytest process (their conftest and module names are Anemoi's),
on the Triton interpreter without a GPU. With one, a test that builds on the CPU takes the PyG path as Anemoi's
Triton backend falls back there: counted apart (tests/launches.py), the kernels having no device to run on.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from tests.launches import BACKWARD_CALLS, BY_DESTINATION, BY_SOURCE, FORWARD, FORWARD_CALLS, PYG_CALLS
from tests.requirements import ANEMOI_MODELS, missing, require_module

require_module("anemoi.models", ANEMOI_MODELS)

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_FILES = (
    "tests/conftest.py",
    "tests/layers/block/test_block_graphtransformer.py",
    "tests/layers/processor/test_graphtransformer_processor.py",
    "tests/layers/mapper/test_graphtransformer_mapper.py",
)


def upstream_sdist() -> Path:
    version = importlib.metadata.version("anemoi-models")
    folder = Path(os.environ.get("GTNORM_ANEMOI_SDIST", Path(sys.prefix) / "anemoi-models-sdist"))
    path = folder / f"anemoi_models-{version}.tar.gz"
    if not path.is_file():
        missing(f"Anemoi's test files: {path} not found (bash run.sh downloads it when it installs)")
    return path


@pytest.fixture(scope="module")
def upstream_tests(tmp_path_factory) -> Path:
    sdist = upstream_sdist()
    root = tmp_path_factory.mktemp("anemoi-tests")
    with tarfile.open(sdist) as archive:
        prefix = archive.getnames()[0].split("/")[0]
        for name in UPSTREAM_FILES:
            member = archive.getmember(f"{prefix}/{name}")
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.extractfile(member).read())
    return root / "tests"


def run_upstream(folder: Path, swapped: bool) -> tuple[int, dict[str, int], str, dict[str, dict[str, int]]]:
    """(return code, outcome counts, the log's tail, per test the launch counts of the swapped run ({} else))."""
    plugin = ["-p", "tests.anemoi.upstream_swap"] if swapped else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("ANEMOI_INFERENCE_GRAPHTRANSFORMER_ATTENTION_BACKEND", None)
    counts_file = folder.parent / "launch-counts.json"
    counts_file.unlink(missing_ok=True)
    if swapped:
        env["ANEMOI_INFERENCE_GRAPHTRANSFORMER_ATTENTION_BACKEND"] = "triton"
        env["GTNORM_LAUNCH_COUNTS"] = str(counts_file)
    if not torch.cuda.is_available():
        env.setdefault("TRITON_INTERPRET", "1")  # gtnorm's kernels through the interpreter, as this suite runs them
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
               "--rootdir", str(folder), *plugin, str(folder)]  # fmt: skip
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|errors?|skipped)", done.stdout)}
    launches = json.loads(counts_file.read_text()) if swapped and counts_file.is_file() else {}
    return done.returncode, counts, done.stdout[-3000:] + done.stderr[-2000:], launches


def test_anemoi_s_own_tests_pass_with_the_drop_ins(upstream_tests):
    rc, counts, log, _ = run_upstream(upstream_tests, swapped=False)
    assert rc == 0 and counts.get("passed", 0) > 0, f"Anemoi's tests on Anemoi's own classes:\n{log}"
    rc_swapped, counts_swapped, log_swapped, launches = run_upstream(upstream_tests, swapped=True)
    assert rc_swapped == 0, f"Anemoi's tests with gtnorm's drop-ins:\n{log_swapped}"
    assert counts_swapped == counts, (counts_swapped, counts)
    # Every test ran (the plugin saw each), and those that called the attention ran the kernels, never PyG.
    assert len(launches) == counts["passed"], sorted(launches)
    attending = {test: c for test, c in launches.items() if c.get(FORWARD_CALLS)}
    assert attending, f"no test of Anemoi's called the drop-ins' attention: {launches}"
    for test, c in launches.items():
        assert not c.get(PYG_CALLS), f"{test} took gtnorm's PyG path: {c}"
    for test, c in attending.items():
        assert c.get(FORWARD, 0) >= 1, f"{test}: the op ran but launched no forward kernel: {c}"
        if c.get(BACKWARD_CALLS):
            assert c.get(BY_DESTINATION, 0) >= 1 and c.get(BY_SOURCE, 0) >= 1, f"{test}: {c}"
    assert any(c.get(BACKWARD_CALLS) for c in attending.values()), "no backward ran through the kernels"
