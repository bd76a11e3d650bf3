#!/usr/bin/env bash
# Create the project venv and install slurm-qualify into it. Idempotent.
#
# torch first, and the right build of it: on a machine with an NVIDIA GPU the default (CUDA)
# wheel; without one the CPU build, so a laptop or CI does not pull a multi-GB CUDA build it
# cannot use. Override with TORCH_SPEC / TORCH_INDEX_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if [ -n "${TORCH_SPEC:-}" ]; then
    "${PIP[@]}" install "$TORCH_SPEC" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "install: NVIDIA GPU found: installing the CUDA build of torch"
    "${PIP[@]}" install "torch>=2.3"
  else
    echo "install: no NVIDIA GPU: installing the CPU build of torch"
    # a CPU wheel the machine already has (pip's find-links), else PyTorch's CPU index
    "${PIP[@]}" install "torch==2.13.0+cpu" 2>/dev/null \
      || "${PIP[@]}" install torch --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
  fi
fi

# DeepSpeed builds against the torch installed above (no isolated build env pulling another)
"${PIP[@]}" install --no-build-isolation -e ".[dev]" 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" -c "import deepspeed, mlflow, submitit, hydra, torch; print('install: ok: torch', torch.__version__, '| deepspeed', deepspeed.__version__, '| mlflow', mlflow.__version__)"
# DeepSpeed's C++ ops, built now instead of in the first job that needs them (venv bin first on
# PATH: its ninja; the system's and pip's invalidate each other's cache)
# into the venv's own op cache, <venv>/torch_extensions, where every job of this venv looks
PATH="$(cd "$VENV/bin" && pwd):$PATH" "$VENV/bin/python" scripts/prebuild_ops.py
touch "$VENV/.installed"
