#!/usr/bin/env bash
# Every test this machine can run. Starts the local Slurm when its packages are installed and
# we are root (CI), and stops it after; prints the Slurm logs when a test fails. GPU tests run
# only where `nvidia-smi` sees a GPU.
#
# Three streams at once, as most integration tests wait on each other's ranks, on Slurm or on a
# server for much of their time (1.4 cores busy on average, measured test by test on 2 cores):
#   - the Slurm tests and the timed tests, one at a time, at normal priority: Slurm tests share
#     one cluster (an urgent job preempts whatever runs on its nodes), and a timed test asserts
#     two ranks' equal pace or a shaped link's rate, which nothing else at that priority may disturb. This stream is the
#     long pole of the run, so it starts first;
#   - the local paced drill (a time-out drill whose ranks sleep between steps: minutes of wall
#     time, little CPU), at normal priority: it sizes its time limit from the start-up it
#     measures just before, which niced work beside the Slurm tests would not hold;
#   - under `nice -n 10`, in two xdist workers each: first the unit suite (`--suite unit`,
#     defined once in tests/conftest.py: tests/unit/, no multi-process, Slurm, browser or GPU
#     test; workers that steal tests from each other, `--dist worksteal`), then every other
#     integration test, a file at a time, the files of tests marked `long` first, the longest
#     first (tests/conftest.py: xdist's own order puts the files of many tests first, and a
#     one-test file of minutes ran alone at the end). They take the cores the other streams
#     leave, and all of them once those are done. Their output follows the others'.
# (The unit suite used to run alone before the streams: its 80 s on both cores then delayed the
# Slurm stream, which waits on Slurm and its jobs for much of its time, by as much.)
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

log=$(mktemp -t sq-test-background.XXXXXX)
unit_log=$(mktemp -t sq-test-unit.XXXXXX)
unit_rc=$(mktemp -t sq-test-unit-rc.XXXXXX)
paced_log=$(mktemp -t sq-test-paced.XXXXXX)
# job control on: without it bash starts a background command with SIGINT ignored, and a test
# that presses Ctrl-C on a sweep would find the sweep deaf to it. The stream gets its own
# process group, stopped with this script.
set -m
( nice -n 10 "$PY" -m pytest -n 2 --dist worksteal --suite unit "$@" >"$unit_log" 2>&1; echo $? >"$unit_rc"
  nice -n 10 "$PY" -m pytest -n 2 --dist loadfile --no-loadscope-reorder --suite integration \
    -m "not slurm and not timed and not paced$gpu" -p no:cacheprovider "$@" >"$log" 2>&1 ) &
background=$!
"$PY" -m pytest --suite integration -m "paced and not slurm$gpu" -p no:cacheprovider "$@" >"$paced_log" 2>&1 &
paced=$!
set +m
trap 'kill -INT -- -$background -$paced 2>/dev/null' INT TERM
echo "test: Slurm tests and timed tests here, one at a time; the local paced drill and the other slow tests beside them (output below when done)"
"$PY" -m pytest --suite integration -m "(slurm or timed)$gpu" --one-mlflow-server "$@"
rc2=$?
wait $paced
rc4=$?
wait $background
rc3=$?
trap - INT TERM
rc1=$(cat "$unit_rc" 2>/dev/null || echo 1)
echo "test: the unit suite (two workers, nice 10, beside the Slurm tests, first in the background stream):"
cat "$unit_log"
echo "test: the local paced drill (normal priority, beside the Slurm tests):"
cat "$paced_log"
echo "test: the background stream (slow tests without Slurm, two workers, nice 10, after the unit suite):"
cat "$log"
rm -f "$log" "$unit_log" "$unit_rc" "$paced_log"

# 5: a phase had no test to run (a -k or a path that selects only another phase's tests)
rc=5
for r in $rc1 $rc2 $rc4 $rc3; do
  if [ "$r" != 0 ] && [ "$r" != 5 ]; then rc=$r; break; fi
  [ "$r" = 0 ] && rc=0
done
if [ $rc -ne 0 ] && [ $rc -ne 5 ] && [ -d "${SQ_CLUSTER_DIR:-.cluster}/log" ]; then
  echo "test: failures: the Slurm daemon logs follow"
  bash cluster/cluster.sh logs || true
fi
if [ $started = 1 ]; then bash cluster/cluster.sh down || true; fi
exit $rc
