"""``python -m benchmarks.graphs``: the graph benchmark (options: ``--help``; what it does: run.py)."""

import os

import torch

if not torch.cuda.is_available():
    # Without CUDA the Triton kernels only run through the interpreter, and Triton reads this variable when a
    # kernel is defined: it has to be set before gtnorm's kernel modules are imported.
    os.environ["TRITON_INTERPRET"] = "1"

from benchmarks.graphs.run import main  # noqa: E402

main()
