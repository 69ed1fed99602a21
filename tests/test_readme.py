"""The README and the docs pages: their code runs as written, each Python block being a verbatim slice of the
example file named in the text before it (CI runs the examples: .ci/run); every docs page is one click from the
README; the README stays a five-minute read with the two commands near its top."""

import re
from pathlib import Path

import pytest

from benchmarks.graphs import run

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
    assert {"examples/layer_cpu.py", "examples/layer_gpu.py", "examples/node_order.py"} <= shown


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
    """README, run.sh --help and the benchmark's --help give the figure measured under load (docs/cpu.md)."""
    promise = "about 2.5 minutes on 2 cores"
    for text in ((REPO / "README.md").read_text(), (REPO / "run.sh").read_text(), run.__doc__):
        assert promise in " ".join(text.replace("#", " ").split())
