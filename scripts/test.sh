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
gpu=" and not gpu"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=""; fi
# Two phases: the unit tests (no multi-process, Slurm, browser or GPU test) in two xdist
# workers, a test file per worker; then every other test one at a time, as the timed drills
# size themselves from the pace measured under the load of that moment.
"$PY" -m pytest -n 2 --dist loadfile -m "not slow and not slurm and not browser and not gpu" "$@"
rc1=$?
"$PY" -m pytest -m "(slow or slurm or browser or gpu)$gpu" "$@"
rc2=$?
# 5: a phase had no test to run (a -k or a path that selects only the other phase's tests)
if [ $rc1 = 5 ] && [ $rc2 = 5 ]; then rc=5
elif [ $rc1 != 0 ] && [ $rc1 != 5 ]; then rc=$rc1
elif [ $rc2 != 0 ] && [ $rc2 != 5 ]; then rc=$rc2
else rc=0; fi
if [ $rc -ne 0 ] && [ -d "${SQ_CLUSTER_DIR:-.cluster}/log" ]; then
  echo "test: failures: the Slurm daemon logs follow"
  bash cluster/cluster.sh logs || true
fi
if [ $started = 1 ]; then bash cluster/cluster.sh down || true; fi
exit $rc
