"""gtnorm/_runtime.py and the lazy package exports (gtnorm/_lazy.py): where the kernels may run, the error when
TRITON_INTERPRET changes after the kernels were defined, and the one-time interpreter warning.

Triton fixes interpreter or compiled mode when a kernel is defined, once per process, so the cases that need
another mode than this process's run in a fresh interpreter.
"""

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import gtnorm
import gtnorm.nn
import gtnorm.rmsnorm
import gtnorm.triton
from gtnorm import _runtime
from tests.conftest import HAS_CUDA

REPO = Path(__file__).resolve().parents[1]


def run_python(*code: str) -> subprocess.CompletedProcess:
    """The pieces of ``code`` (each dedented) in a fresh Python without TRITON_INTERPRET, from the repo root."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", "".join(textwrap.dedent(piece) for piece in code)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


TINY_ATTENTION = """
    edge_index = torch.tensor([[0, 1, 2, 2], [0, 0, 1, 2]])
    q, k, v = (torch.randn(3, 1, 4) for _ in range(3))
    layout = GraphLayout.from_edge_index(edge_index, num_nodes=3)
"""


@pytest.mark.skipif(
    _runtime.TRITON_VERSION < _runtime.INTERPRETER_MIN_TRITON,
    reason="this triton's interpreter cannot run the attention kernels (test_old_interpreter_is_refused...)",
)
def test_subpackage_imports_are_lazy_and_leave_the_mode_open():
    """Importing gtnorm and its subpackages defines no kernel, so TRITON_INTERPRET set afterwards still counts."""
    result = run_python(
        """
        import os, sys
        import torch
        import gtnorm, gtnorm.nn, gtnorm.triton, gtnorm.rmsnorm
        assert "gtnorm.rmsnorm.math" not in sys.modules, "a kernel module was imported eagerly"
        os.environ["TRITON_INTERPRET"] = "1"
        from gtnorm.nn import GraphTransformerConv
        from gtnorm.rmsnorm import RMSNorm, rms_norm
        from gtnorm.triton import GraphLayout, graph_transformer_attention
        assert GraphTransformerConv is gtnorm.GraphTransformerConv and RMSNorm is gtnorm.RMSNorm
        assert rms_norm is gtnorm.rms_norm and GraphLayout is gtnorm.GraphLayout
        assert graph_transformer_attention is gtnorm.graph_transformer_attention
        """,
        TINY_ATTENTION,
        """
        out = graph_transformer_attention(q, k, v, None, layout)
        assert out.shape == (3, 1, 4) and bool(torch.isfinite(out).all())
        print("ok", gtnorm._runtime.kernels_interpreted())
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", "True"]


@pytest.mark.skipif(HAS_CUDA, reason="compiled kernels would run on this machine's CUDA tensors")
def test_interpreter_switched_on_after_the_kernels_were_defined():
    """Kernels defined compiled (no TRITON_INTERPRET), then TRITON_INTERPRET=1: a clear error, not Triton's
    '0 active drivers'; backend='auto' takes the PyG path."""
    result = run_python(
        """
        import os
        import torch
        from gtnorm.nn import GraphTransformerConv
        from gtnorm.triton import GraphLayout, graph_transformer_attention
        conv = GraphTransformerConv(4)  # imports the kernel modules: compiled mode
        os.environ["TRITON_INTERPRET"] = "1"
        """,
        TINY_ATTENTION,
        """
        out = conv(q, k, v, None, edge_index)  # auto: PyG
        assert out.shape == (3, 1, 4)
        try:
            graph_transformer_attention(q, k, v, None, layout)
        except RuntimeError as error:
            print(error)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert "TRITON_INTERPRET is now 1" in result.stdout
    assert "defined when it was unset or 0" in result.stdout


@pytest.mark.skipif(HAS_CUDA, reason="this process's kernels are compiled on a CUDA machine")
def test_interpreter_switched_off_after_the_kernels_were_defined(monkeypatch):
    gtnorm.rms_norm  # noqa: B018 - defines the kernels (interpreter, as tests/conftest.py set it up)
    assert _runtime.kernels_interpreted() is True
    assert _runtime.triton_can_run_on(torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not _runtime.triton_can_run_on(torch.device("cpu"))
    assert not _runtime.triton_can_run_on(torch.device("cuda"))
    with pytest.raises(RuntimeError, match="op: TRITON_INTERPRET is now unset or 0, .* defined when it was 1"):
        _runtime.check_triton_device(torch.device("cpu"), "op")


def test_kernels_interpreted_follows_the_defined_kernels():
    gtnorm.rms_norm  # noqa: B018 - defines the kernels
    assert _runtime.kernels_interpreted() is (not HAS_CUDA)


def test_interpreter_warning_once(monkeypatch):
    monkeypatch.setattr(_runtime, "_warned_interpreter_auto", False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _runtime.warn_auto_uses_interpreter(torch.device("cuda"))  # not the interpreter: silent
    with pytest.warns(UserWarning, match="about 40x slower than the PyG path"):
        _runtime.warn_auto_uses_interpreter(torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _runtime.warn_auto_uses_interpreter(torch.device("cpu"))  # once per process


def test_unknown_attributes_raise():
    for package in (gtnorm, gtnorm.nn, gtnorm.triton, gtnorm.rmsnorm):
        with pytest.raises(AttributeError, match="no_such_name"):
            package.no_such_name  # noqa: B018
    assert "GraphTransformerConv" in dir(gtnorm.nn) and "rms_norm" in dir(gtnorm.rmsnorm)


def test_old_interpreter_is_refused_with_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(_runtime, "_mode_changed_after_definition", lambda: False)
    monkeypatch.setattr(_runtime, "TRITON_VERSION", (3, 6))
    with pytest.raises(RuntimeError, match=r"needs triton >= 3\.7"):
        _runtime.check_triton_device(torch.device("cpu"), "op")
