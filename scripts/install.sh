#!/usr/bin/env bash
# Create the project venv and install slurm-qualify into it, from the lock. Idempotent.
#
# Every package but torch comes from requirements.lock (exact versions and their sha256 hashes,
# resolved by `make lock`), so every login node and CI installs the same stack; docs/install.md
# says why a hashed requirements lock and not uv's project lock. uv installs it (about 15 s
# against pip's 95 s here); where uv cannot be had (or INSTALLER=pip), pip installs the same
# lock, hashes checked. uv reads its index from UV_INDEX_URL / UV_EXTRA_INDEX_URL, not pip.conf.
#
# torch first, and the right build of it, at the locked version: on a machine with an NVIDIA
# GPU the default (CUDA) wheel; without one the CPU build, so a laptop or CI does not pull a
# multi-GB CUDA build it cannot use. Override with TORCH_SPEC / TORCH_INDEX_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
LOCK=requirements.lock
# the torch release the lock was resolved against (make lock writes it in the lock's header)
TORCH_VERSION=$(sed -n 's/^# torch==\([^ ]*\).*/\1/p' "$LOCK")
UV_VERSION=$(sed -n 's/^# uv==\([^ ]*\).*/\1/p' "$LOCK")

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if [ -n "${TORCH_SPEC:-}" ]; then
    "${PIP[@]}" install "$TORCH_SPEC" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "install: NVIDIA GPU found: installing the CUDA build of torch"
    "${PIP[@]}" install "torch==$TORCH_VERSION"
  else
    echo "install: no NVIDIA GPU: installing the CPU build of torch"
    # a CPU wheel the machine already has (pip's find-links), else PyTorch's CPU index
    "${PIP[@]}" install "torch==$TORCH_VERSION+cpu" 2>/dev/null \
      || "${PIP[@]}" install "torch==$TORCH_VERSION" --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
  fi
fi

# The lock, then the project itself (editable), neither resolving anything: --no-deps, as the
# lock holds every dependency (torch apart). DeepSpeed builds against the torch installed above
# (no isolated build env pulling another).
if [ "${INSTALLER:-uv}" = uv ] && "${PIP[@]}" install "uv==$UV_VERSION" 2>/dev/null; then
  # --compile-bytecode: uv writes no .pyc by default (pip does); without them every process
  # compiles what it imports, and where PYTHONDONTWRITEBYTECODE is set it does so every time
  UV=("$VENV/bin/uv" pip install --quiet --compile-bytecode --python "$VENV/bin/python")
  "${UV[@]}" --require-hashes --no-deps --no-build-isolation-package deepspeed -r "$LOCK"
  "${UV[@]}" --no-deps --no-build-isolation -e .
else
  [ "${INSTALLER:-uv}" = pip ] || echo "install: uv==$UV_VERSION could not be installed: pip installs the lock (slower, the same versions)"
  "${PIP[@]}" install --require-hashes --no-deps --no-build-isolation -r "$LOCK"
  "${PIP[@]}" install --no-deps --no-build-isolation -e .
fi
"$VENV/bin/python" -c "import deepspeed, mlflow, submitit, hydra, torch; print('install: ok: torch', torch.__version__, '| deepspeed', deepspeed.__version__, '| mlflow', mlflow.__version__)"
# DeepSpeed's C++ ops, built now instead of in the first job that needs them (venv bin first on
# PATH: its ninja; the system's and pip's invalidate each other's cache)
# into the venv's own op cache, <venv>/torch_extensions, where every job of this venv looks
PATH="$(cd "$VENV/bin" && pwd):$PATH" "$VENV/bin/python" scripts/prebuild_ops.py
touch "$VENV/.installed"
