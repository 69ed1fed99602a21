"""``python -m benchmarks.anemoi``: the in-block benchmark (options: ``--help``; what it does: run.py)."""

from benchmarks.anemoi.run import main

main()
