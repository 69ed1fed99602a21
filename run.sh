#!/usr/bin/env bash
# gtnorm's two entry points; each installs what it needs first.
#   bash run.sh bench [args for python -m benchmarks.graphs]   the graph benchmark (GPU: full suite;
#                                                               CPU: tiny suite through the Triton interpreter)
#   bash run.sh test  [args for pytest]                         the test suite (CPU: interpreter, small graphs)
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

install() {  # $1: the extras to install
  if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    if has_gpu; then
      "$PYTHON" -m pip install -q torch
    else
      # The CPU build: a plain `torch` would pull several GB of CUDA packages.
      "$PYTHON" -m pip install -q torch==2.13.0
    fi
  fi
  "$PYTHON" -m pip install -q -e ".[$1]"
}

case "${1:-}" in
  bench)
    shift
    install bench
    exec "$PYTHON" -m benchmarks.graphs "$@"
    ;;
  test)
    shift
    install test,bench
    exec "$PYTHON" -m pytest -q "$@"
    ;;
  *)
    echo "usage: bash run.sh bench|test [args]" >&2
    exit 2
    ;;
esac
