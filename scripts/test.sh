#!/usr/bin/env bash
# Every test this machine can run. Starts the local Slurm when its packages are installed and
# we are root (CI), and stops it after; prints the Slurm logs when a test fails. GPU tests run
# only where `nvidia-smi` sees a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
started=0
if bash cluster/cluster.sh status >/dev/null 2>&1; then
  echo "test: using the local Slurm that is already up"
elif command -v slurmctld >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  bash cluster/cluster.sh up && started=1 || echo "test: the local Slurm did not start; Slurm tests will say so"
else
  echo "test: no local Slurm here (make cluster-install cluster-up as root); Slurm tests are skipped"
fi
markers="not gpu"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then markers=""; fi
"$PY" -m pytest ${markers:+-m "$markers"} "$@"
rc=$?
if [ $rc -ne 0 ] && [ -d "${SQ_CLUSTER_DIR:-.cluster}/log" ]; then
  echo "test: failures: the Slurm daemon logs follow"
  bash cluster/cluster.sh logs || true
fi
if [ $started = 1 ]; then bash cluster/cluster.sh down || true; fi
exit $rc
