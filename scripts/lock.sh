#!/usr/bin/env bash
# Resolve requirements.lock again (`make lock`): every dependency of pyproject.toml (with the dev
# extra) at an exact version with its sha256 hashes, for every Python >= 3.10 and platform
# (uv's universal resolution: a package may appear once per Python range, with its marker).
# torch is left out (scripts/install.sh picks its build per machine, at the version in this
# lock's header), and so are the CUDA wheels of torch's CUDA build (nvidia-* runtime libraries,
# cuda-*, triton): torch pins those exactly, a GPU machine's torch brings them, a CPU machine
# must not get them. nvidia-ml-py (NVML's bindings, the project's own dependency) stays.
# The current pins are kept where pyproject.toml still admits them (uv reads the lock it
# rewrites as its preferences); UPGRADE=1 resolves every package to the newest it admits.
#   TORCH_VERSION  the torch release to resolve against (default: the lock's current one)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
LOCK=requirements.lock
UV_VERSION=${UV_VERSION:-$(sed -n 's/^# uv==\([^ ]*\).*/\1/p' "$LOCK")}
TORCH_VERSION=${TORCH_VERSION:-$(sed -n 's/^# torch==\([^ ]*\).*/\1/p' "$LOCK")}
[ -x "$VENV/bin/uv" ] || "$VENV/bin/python" -m pip install -q "uv==$UV_VERSION"
constraints=$(mktemp)
out=$(mktemp)
trap 'rm -f "$constraints" "$out"' EXIT
echo "torch==$TORCH_VERSION" >"$constraints"
cp "$LOCK" "$out"  # the current pins, as preferences
compile=("$VENV/bin/uv" pip compile pyproject.toml --extra dev --universal --python-version 3.10
  -c "$constraints" --no-emit-package torch --no-header --quiet ${UPGRADE:+--upgrade})
# first pass: the names of torch's CUDA wheels in this resolution, to leave out of the lock
"${compile[@]}" -o "$out"
cuda=$(sed -n 's/^\(nvidia-[a-z0-9-]*\|cuda-[a-z0-9-]*\|triton\)==.*/\1/p' "$out" \
  | { grep -vx nvidia-ml-py || true; } | sort -u)
skip=()
for name in $cuda; do skip+=(--no-emit-package "$name"); done
"${compile[@]}" --generate-hashes "${skip[@]}" -o "$out"
{
  echo "# The exact stack every install gets (scripts/install.sh). Regenerate: make lock"
  echo "# (scripts/lock.sh; TORCH_VERSION=... to move torch). Read by install.sh:"
  echo "# torch==$TORCH_VERSION (installed first, its CPU or CUDA build per machine; not below)"
  echo "# uv==$UV_VERSION (the installer)"
  cat "$out"
} >"$LOCK"
echo "lock: $LOCK written ($(grep -c '==' "$LOCK") pins), torch $TORCH_VERSION, uv $UV_VERSION"
