#!/usr/bin/env bash
# gtnorm's two entry points. Each first makes sure the project's virtual environment exists and holds what
# pyproject.toml asks for (installing only when something is missing or changed), then runs:
#   bash run.sh bench [args for python -m benchmarks.graphs]   the graph benchmark (GPU: full suite; CPU: quick
#                                                               mode, about 2 minutes on 2 cores with two busy
#                                                               processes beside it)
#   bash run.sh test  [args for pytest]                         the test suite (CPU: interpreter, small graphs;
#                                                               about 50 minutes on 2 cores)
#   bash run.sh --help                                          this text; installs nothing
#
# The first run (about 2 minutes on a 2-core machine) creates the environment and installs into it: torch (CUDA
# build with a GPU, else the CPU build), gtnorm in editable mode with its extras (triton, torch-geometric, pytest,
# ruff, scipy, matplotlib, anemoi-utils, einops, hydra-core and their dependencies), then anemoi-models and
# anemoi-graphs without their dependencies, and downloads anemoi-models' source distribution into the environment
# (its unit tests, which tests/anemoi/test_upstream.py runs). The versions: at the end of this text.
#
# Environment (all optional):
#   PYTHON                  the Python that creates the environment (default: python3; any >= 3.10, an
#                           "externally managed" system Python included: nothing is installed into it)
#   GTNORM_VENV             the environment's folder (default: .venv in this checkout)
#   GTNORM_TORCH_SPEC       what to install for torch (default: torch==2.13.0 without a GPU, torch with one)
#   GTNORM_TORCH_PIP_ARGS   extra pip arguments for that install, e.g. an --index-url. When set (even empty),
#                           used as given; when unset on a CPU-only machine, pip's own configuration is used if
#                           it resolves GTNORM_TORCH_SPEC to a CPU build (no nvidia-* packages), else the
#                           PyTorch CPU index (https://download.pytorch.org/whl/cpu).
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=${GTNORM_VENV:-.venv}
VENV_PY="$VENV/bin/python"
STAMP="$VENV/.gtnorm-install-stamp"
EXTRAS="test,bench,anemoi"  # one environment for both commands: pytest and ruff are small
# anemoi-models declares torch<2.11, so it goes in without its pins (its light dependencies come with the
# anemoi extra); the Anemoi drop-in's tests and example need it.
ANEMOI_MODELS="anemoi-models==0.19.0"
ANEMOI_GRAPHS="anemoi-graphs==0.9.8"  # anemoi-models imports it to build whole models (benchmarks/model)
CPU_TORCH_INDEX="https://download.pytorch.org/whl/cpu"

# The header above, and what this script installs, from the variables that decide it.
usage() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
  echo
  echo "Installs: $(torch_spec) (on this machine) and gtnorm with its extras $EXTRAS;"
  echo "without their dependencies: $ANEMOI_MODELS, $ANEMOI_GRAPHS."
}

# step DESCRIPTION COMMAND...: runs the command, saying what it does, every 15 s that it still runs (pip is
# silent for minutes on a first install), and how long it took.
step() {
  local what=$1 start=$SECONDS next=15 pid status=0
  shift
  echo "run.sh: $what ..." >&2
  "$@" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if ((SECONDS - start >= next)); then
      echo "run.sh:   ... $((SECONDS - start)) s" >&2
      next=$((next + 15))
    fi
  done
  wait "$pid" || status=$?
  ((status == 0)) && echo "run.sh: $what: done in $((SECONDS - start)) s" >&2
  return "$status"
}

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

torch_spec() {
  if [[ -n "${GTNORM_TORCH_SPEC:-}" ]]; then echo "$GTNORM_TORCH_SPEC"
  elif has_gpu; then echo "torch"
  else echo "torch==2.13.0"; fi
}

# What the stamp records: a change in any of these reinstalls.
install_key() {
  "$PYTHON" - "$EXTRAS $ANEMOI_MODELS $ANEMOI_GRAPHS sdist" "$(torch_spec)" "${GTNORM_TORCH_PIP_ARGS-<unset>}" "$PWD" <<'EOF'
import hashlib, sys
digest = hashlib.sha256(open("pyproject.toml", "rb").read())
digest.update("\0".join(sys.argv[1:]).encode())
print(digest.hexdigest())
EOF
}

make_venv() {
  if ! step "creating the virtual environment $VENV with $("$PYTHON" --version 2>&1)" "$PYTHON" -m venv "$VENV"; then
    rm -rf "$VENV"
    echo "run.sh: '$PYTHON -m venv' failed. On Debian/Ubuntu: apt install python3-venv (or python3.X-venv);" \
      "or point PYTHON at another Python >= 3.10." >&2
    exit 1
  fi
  step "upgrading pip in it" "$VENV_PY" -m pip install -q --upgrade pip
}

# True when pip, as configured here, resolves the torch spec to a CPU build: nothing named nvidia-* in the
# resolution (a dry run: metadata only, nothing downloaded but that).
pip_resolves_cpu_torch() {
  local report status=1
  report=$(mktemp)
  if "$VENV_PY" -m pip install -q --dry-run --ignore-installed --report "$report" "$1" >/dev/null 2>&1 &&
    "$VENV_PY" - "$report" <<'EOF'
import json, sys
names = [item["metadata"]["name"].lower() for item in json.load(open(sys.argv[1]))["install"]]
sys.exit(1 if any(name.startswith("nvidia-") for name in names) else 0)
EOF
  then
    status=0
  fi
  rm -f "$report"
  return $status
}

install_torch() {
  local spec
  spec=$(torch_spec)
  if "$VENV_PY" -c "import torch" >/dev/null 2>&1; then return; fi
  if [[ -n "${GTNORM_TORCH_PIP_ARGS+set}" ]]; then
    # shellcheck disable=SC2086  # the arguments are meant to split
    step "installing $spec with pip arguments '$GTNORM_TORCH_PIP_ARGS' (a few minutes)" \
      "$VENV_PY" -m pip install -q "$spec" $GTNORM_TORCH_PIP_ARGS
  elif has_gpu; then
    step "installing $spec (CUDA build, a few minutes)" "$VENV_PY" -m pip install -q "$spec"
  elif pip_resolves_cpu_torch "$spec"; then
    step "installing $spec (CPU build, as pip is configured here; a few minutes)" "$VENV_PY" -m pip install -q "$spec"
  else
    # From the public registry a plain torch is the CUDA build with ~20 nvidia-* packages (GBs).
    step "installing $spec from the PyTorch CPU index $CPU_TORCH_INDEX (a few minutes)" \
      "$VENV_PY" -m pip install -q "$spec" --index-url "$CPU_TORCH_INDEX"
  fi
}

ensure_installed() {
  local key
  key=$(install_key)
  if [[ -x "$VENV_PY" ]] && [[ "$(cat "$STAMP" 2>/dev/null)" == "$key" ]] && "$VENV_PY" -c "import gtnorm" 2>/dev/null; then
    return
  fi
  [[ -x "$VENV_PY" ]] || make_venv
  install_torch
  step "installing gtnorm (editable) with its $EXTRAS extras" "$VENV_PY" -m pip install -q -e ".[$EXTRAS]"
  step "installing $ANEMOI_MODELS and $ANEMOI_GRAPHS without their dependencies" \
    "$VENV_PY" -m pip install -q --no-deps "$ANEMOI_MODELS" "$ANEMOI_GRAPHS"
  # Anemoi's own unit tests come in its source distribution: tests/anemoi/test_upstream.py runs them on the drop-ins.
  step "downloading $ANEMOI_MODELS's source distribution (its unit tests) into $VENV/anemoi-models-sdist" \
    "$VENV_PY" -m pip download -q --no-deps --no-binary :all: -d "$VENV/anemoi-models-sdist" "$ANEMOI_MODELS" ||
    echo "run.sh: could not download $ANEMOI_MODELS's source distribution: Anemoi's own tests will be skipped (fail under GTNORM_REQUIRE_TEST_DEPS=1, as in CI)" >&2
  echo "$key" >"$STAMP"
}

# The programs' own --help needs them installed; without an environment, say so instead of installing.
asks_for_help() {
  local arg
  for arg in "$@"; do [[ "$arg" == "-h" || "$arg" == "--help" ]] && return 0; done
  return 1
}

command=${1:-}
case "$command" in
  bench | test) shift ;;
  -h | --help | help) usage; exit 0 ;;
  "")
    echo "run.sh: no command given: say 'bash run.sh bench' or 'bash run.sh test' (usage below)" >&2
    echo >&2
    usage >&2
    exit 2
    ;;
  *)
    echo "run.sh: unknown command '$command': the commands are bench and test (usage below)" >&2
    echo >&2
    usage >&2
    exit 2
    ;;
esac

if asks_for_help "$@" && ! [[ -f "$STAMP" ]]; then
  usage
  echo
  echo "(The $command program's own options are listed once its environment is installed: run 'bash run.sh $command' once.)"
  exit 0
fi

ensure_installed
case "$command" in
  bench) exec "$VENV_PY" -m benchmarks.graphs "$@" ;;
  test) exec "$VENV_PY" -m pytest -q "$@" ;;
esac
