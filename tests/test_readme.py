"""The README and the docs pages: their code runs as written, each Python block being a verbatim slice of the
example file named in the text before it (CI runs the examples: .ci/run); every docs page is one click from the
README; the README stays a five-minute read with the two commands near its top."""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from benchmarks.graphs import quick, usage

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def python_blocks(page: Path) -> list[tuple[str, str]]:
    """(example file named last before the block, the block's code) for every ```python block of the page."""
    text = page.read_text()
    blocks, position = [], 0
    for match in re.finditer(r"```python\n(.*?)```", text, re.S):
        named = re.findall(r"examples/\w+\.py", text[position : match.start()])
        blocks.append((named[-1] if named else "", match.group(1)))
        position = match.end()
    return blocks


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_code_comes_from_the_examples(page):
    for example, code in python_blocks(page):
        assert example, f"a code block of {page.name} names no examples/ file before it:\n{code}"
        assert code in (REPO / example).read_text(), f"a block of {page.name} differs from {example}:\n{code}"


def test_the_examples_are_shown():
    shown = {example for page in PAGES for example, _ in python_blocks(page)}
    assert {
        "examples/tiny_graph.py",
        "examples/layer_cpu.py",
        "examples/layer_and_op.py",
        "examples/node_order.py",
    } <= shown


def test_every_docs_page_is_linked_from_the_readme():
    readme = (REPO / "README.md").read_text()
    for page in PAGES[1:]:
        assert f"](docs/{page.name})" in readme, page.name


def test_the_readme_is_short_and_starts_with_the_two_commands():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    commands = [
        number for number, line in enumerate(lines, 1) if line.startswith(("bash run.sh bench", "bash run.sh test"))
    ]
    assert len(commands) == 2 and max(commands) <= 40, commands
    assert "\nbash run.sh test\n" in (REPO / ".ci" / "run").read_text()  # CI runs the README's test command


def test_the_cpu_benchmark_promises_what_was_measured():
    """README, docs/cpu.md, run.sh --help and the benchmark's --help give the time measured under load
    (quick.CPU_RUN_TIME; docs/cpu.md lists the runs), and the same first-install time."""
    texts = {
        "README.md": (REPO / "README.md").read_text(),
        "docs/cpu.md": (REPO / "docs" / "cpu.md").read_text(),
        "run.sh": (REPO / "run.sh").read_text(),
        "--help": usage.epilog(),
    }
    for name, text in texts.items():
        assert quick.CPU_RUN_TIME in " ".join(text.replace("#", " ").split()), name
    for name in ("README.md", "run.sh"):
        assert "about 2 minutes on a 2-core machine" in " ".join(texts[name].replace("#", " ").split()), name


def test_the_benchmark_help_counts_its_variants():
    from benchmarks.graphs.variants import VARIANTS

    help_text = usage.epilog()
    assert f"The {len(VARIANTS)} variants" in help_text
    assert all(f"\n  {name} " in help_text for name in VARIANTS)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """gtnorm installed in editable mode as pip installs it (setuptools' PEP 660 hook on this pyproject.toml), from
    a copy of the project in a folder named gtnorm, as a clone is: (that folder, a site folder with the install)."""
    pytest.importorskip("setuptools")
    root = tmp_path_factory.mktemp("install")
    clone = root / "gtnorm"
    shutil.copytree(REPO / "gtnorm", clone / "gtnorm", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, clone / name)
    build = "import sys; from setuptools import build_meta; print(build_meta.build_editable(sys.argv[1]))"
    built = subprocess.run(
        [sys.executable, "-c", build, str(root / "wheel")], cwd=clone, capture_output=True, text=True, timeout=300
    )
    assert built.returncode == 0, built.stderr
    site = root / "site"
    with zipfile.ZipFile(root / "wheel" / built.stdout.split()[-1]) as wheel:
        wheel.extractall(site)
    return clone, site


def python_with(site: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    """This Python, started in cwd with the install in ``site`` processed as site-packages are, and nothing of
    this checkout on its path: what a user's Python with gtnorm installed sees."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    boot = f"import site; site.addsitedir({str(site)!r}); "
    return subprocess.run(
        [sys.executable, "-c", boot + code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_readme_example_runs_as_written_outside_the_clone(installed, tmp_path):
    clone, site = installed
    (code,) = [code for example, code in python_blocks(REPO / "README.md") if example == "examples/tiny_graph.py"]
    (tmp_path / "example.py").write_text(code)
    result = python_with(site, "import runpy; runpy.run_path('example.py', run_name='__main__')", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "torch.Size([2, 4, 32]) torch.Size([2, 4, 32]) torch.Size([32])" in result.stdout


def test_gtnorm_imports_from_the_folder_that_holds_a_clone(installed):
    """Python in the folder above a clone named gtnorm: the clone itself is a folder named gtnorm without an
    __init__.py, which an import hook (setuptools' default editable install for this layout) loses to, so
    ``import gtnorm`` gave an empty namespace package. The install is a path entry instead (pyproject.toml), and a
    package on a path entry wins over a namespace folder."""
    clone, site = installed
    code = "import gtnorm; print(gtnorm.__file__, gtnorm.GraphTransformerConv.__name__)"
    result = python_with(site, code, cwd=clone.parent)
    assert result.returncode == 0, result.stderr
    # This environment's own install of gtnorm, where it is a path entry too, may come first: either is right.
    path, name = result.stdout.split()
    assert path.endswith(os.path.join("gtnorm", "__init__.py")) and name == "GraphTransformerConv"
