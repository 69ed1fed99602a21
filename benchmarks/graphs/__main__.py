"""``python -m benchmarks.graphs``: the graph benchmark (options: ``--help``; what it does: run.py). Exits with 1
when quick mode's verdict is a fail."""

import os
import sys

import torch

if not torch.cuda.is_available():
    # Without CUDA the Triton kernels only run through the interpreter, and Triton reads this variable when a
    # kernel is defined: it has to be set before gtnorm's kernel modules are imported.
    os.environ["TRITON_INTERPRET"] = "1"
    from benchmarks.graphs.interpreter import skip_repeated_language_patches

    skip_repeated_language_patches()  # half the interpreter's time: see interpreter.py

from benchmarks.graphs.run import main  # noqa: E402

results = main()
sys.exit(0 if results.get("verdict", {}).get("pass", True) else 1)
