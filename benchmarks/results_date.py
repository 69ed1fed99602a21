"""The date of a committed results folder's run, for the captions that cite it (python -m benchmarks.report, the
benchmark's quick mode): results.json's ``meta.started`` where the run recorded it, else the date in the title of
the folder's README (runs whose results.json has no date), said as such."""

from __future__ import annotations

import json
import re
from pathlib import Path

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def run_date(folder: Path) -> str:
    """'2026-11-26', or '2026-11-26 (from the folder's README)'; a ValueError where neither file gives one."""
    started = json.loads((folder / "results.json").read_text())["meta"].get("started")
    if started:
        return started.split()[0]
    readme = folder / "README.md"
    title = readme.read_text().splitlines()[0] if readme.is_file() else ""
    found = _DATE.search(title)
    if found is None:
        raise ValueError(f"{folder}: results.json has no meta.started and README.md's title no date (YYYY-MM-DD)")
    return f"{found.group()} (from the folder's README)"
