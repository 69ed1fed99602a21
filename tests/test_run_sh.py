"""run.sh, the two commands' entry point: what it says when the command is missing or unknown, and that neither
case nor --help installs anything (GTNORM_VENV points at a folder that must stay absent)."""

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_sh(*args: str, venv: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "GTNORM_VENV": str(venv)}
    return subprocess.run(["bash", str(REPO / "run.sh"), *args], capture_output=True, text=True, env=env, timeout=60)


def test_a_missing_command_is_named(tmp_path):
    result = run_sh(venv=tmp_path / "venv")
    assert result.returncode == 2
    assert result.stderr.startswith("run.sh: no command given: say 'bash run.sh bench' or 'bash run.sh test'")
    assert "bash run.sh --help " in result.stderr  # the usage follows
    assert result.stdout == "" and not (tmp_path / "venv").exists()


def test_an_unknown_command_is_named(tmp_path):
    result = run_sh("benchmark", venv=tmp_path / "venv")
    assert result.returncode == 2
    assert result.stderr.startswith("run.sh: unknown command 'benchmark': the commands are bench and test")
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("args", [["--help"], ["bench", "--help"], ["test", "-h"]])
def test_help_installs_nothing(tmp_path, args):
    result = run_sh(*args, venv=tmp_path / "venv")
    assert result.returncode == 0 and "bash run.sh bench" in result.stdout
    assert not (tmp_path / "venv").exists()
