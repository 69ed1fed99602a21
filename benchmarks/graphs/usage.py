"""The end of the benchmark's ``--help``, generated from what it describes, so that it cannot fall behind: the
variants (variants.py: every name with its description, counted) and what quick mode costs on a CPU (quick.py)."""

from __future__ import annotations

import textwrap

from benchmarks.graphs.quick import CPU_RUN_TIME, QUICK_GRAPHS
from benchmarks.graphs.variants import DESCRIPTIONS, VARIANTS

WIDTH = 115
NAME_WIDTH = max(len(name) for name in VARIANTS) + 2


def epilog() -> str:
    lines = [
        textwrap.fill(
            f"Quick mode on a CPU (`bash run.sh bench`: {', '.join(QUICK_GRAPHS)}): {CPU_RUN_TIME}, the "
            "environment installed (docs/cpu.md).",
            width=WIDTH,
        ),
        "",
        f"The {len(VARIANTS)} variants (--variants; all run on the same inputs and norm parameters):",
    ]
    for name in VARIANTS:
        lines.append(
            textwrap.fill(
                DESCRIPTIONS.get(name, ""),
                width=WIDTH,
                initial_indent=f"  {name:{NAME_WIDTH}}",
                subsequent_indent=" " * (NAME_WIDTH + 2),
            )
        )
    return "\n".join(lines)
