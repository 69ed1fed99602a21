"""The README's code runs as written: each of its Python blocks is a verbatim slice of the example file named
in the text before it (CI runs the examples: .ci/run)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_python_blocks() -> list[tuple[str, str]]:
    """(example file named last before the block, the block's code) for every ```python block."""
    readme = (REPO / "README.md").read_text()
    blocks, position = [], 0
    for match in re.finditer(r"```python\n(.*?)```", readme, re.S):
        named = re.findall(r"examples/\w+\.py", readme[position : match.start()])
        blocks.append((named[-1] if named else "", match.group(1)))
        position = match.end()
    return blocks


def test_readme_code_comes_from_the_examples():
    blocks = readme_python_blocks()
    assert len(blocks) >= 3
    for example, code in blocks:
        assert example, f"a README code block names no examples/ file before it:\n{code}"
        assert code in (REPO / example).read_text(), f"README block differs from {example}:\n{code}"
