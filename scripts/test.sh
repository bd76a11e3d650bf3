#!/usr/bin/env bash
# Every test this machine can run. Starts the local Slurm when its packages are installed and
# we are root (CI), and stops it after; prints the Slurm logs when a test fails. GPU tests run
# only where `nvidia-smi` sees a GPU.
#
# Two phases. First the unit suite (`--suite unit`, defined once in tests/conftest.py: tests/unit/,
# no multi-process, Slurm, browser or GPU test) in two xdist workers that steal tests from each
# other (`--dist worksteal`: 59 s against 62 s by file, idle). Then the integration suite:
#   - every test without Slurm and not timed in two xdist workers under `nice -n 10`, from start
#     to end: they take the cores the other streams leave, and all of them once those are done;
#   - beside it, at normal priority: first the timed tests alone, one at a time (a time-out
#     drill sizes itself from the pace it measures just before, which must hold while it runs,
#     so nothing but niced work runs beside it); then the other Slurm tests in two halves at
#     once (tests/conftest.py's `--half`), each one test at a time on its own pair of local
#     clusters: the first on the default one ($SQ_CLUSTER_DIR, /etc/slurm), the second on another
#     started beside it (B_DIR: its own folder, ports, munge, MariaDB and slurmdbd; its clients
#     select it by SLURM_CONF). Within a stream the tests share their clusters (an urgent job
#     preempts whatever runs on its nodes, a blocker holds a partition), so they run one at a
#     time. Without the second pair (not root, or it did not start), the halves run one after
#     the other on the first.
# The other streams' output follows the first's.
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

"$PY" -m pytest -n 2 --dist worksteal --suite unit "$@"
rc1=$?

# the second pair of clusters, for the second Slurm stream: started here when the first is up
# and we may start daemons, stopped at the end if started here
B_DIR="${SQ_CLUSTER_DIR:-$PWD/.cluster}/b"
# its job ids start at 6000, half of port_for_job's span: the same cluster names on one host,
# so without it job N of each pair took the same master port (seen: a rank joined the other's job)
B_ENV=(SQ_CLUSTER_DIR="$B_DIR" SQ_PORT_BASE="${SQ_B_PORT_BASE:-6917}" SQ_DB_PORT="${SQ_B_DB_PORT:-3308}"
  SQ_ETC_SLURM="$B_DIR/sys" SQ_FIRST_JOB_ID=6000)
b_up=0
b_started=0
if bash cluster/cluster.sh status >/dev/null 2>&1; then
  if env "${B_ENV[@]}" bash cluster/cluster.sh status >/dev/null 2>&1; then
    b_up=1
  elif [ "$(id -u)" = 0 ]; then
    if env "${B_ENV[@]}" bash cluster/cluster.sh up; then b_up=1; b_started=1; else
      echo "test: the second pair of local clusters did not start: the Slurm tests run as one stream"
    fi
  fi
fi

logs=()
pids=()
names=()
# job control on: without it bash starts a background command with SIGINT ignored, and a test
# that presses Ctrl-C on a sweep would find the sweep deaf to it. Each stream gets its own
# process group, stopped with this script.
background() {  # background NAME COMMAND...: run it in its own process group, output to a log
  local log
  log=$(mktemp -t sq-test-stream.XXXXXX)
  set -m
  "${@:2}" >"$log" 2>&1 &
  pids+=($!)
  set +m
  logs+=("$log")
  names+=("$1")
}
trap 'for p in "${pids[@]}"; do kill -INT -- -"$p" 2>/dev/null; done' INT TERM
background "the background stream (slow tests without Slurm, two workers, nice 10)" \
  nice -n 10 "$PY" -m pytest -n 2 --dist loadfile --suite integration -m "not slurm and not timed$gpu" \
  -p no:cacheprovider "$@"
if [ $b_up = 1 ]; then halves="at once, the second on the clusters in $B_DIR"; else halves="one after the other"; fi
echo "test: the timed tests here, alone; then the other Slurm tests in two halves, $halves; the other slow tests in the background throughout (their output below when done)"
"$PY" -m pytest --suite integration -m "timed$gpu" "$@"
rcs=($rc1 $?)
if [ $b_up = 1 ]; then
  background "the second half of the Slurm tests (on the clusters in $B_DIR)" \
    env "${B_ENV[@]}" SLURM_CONF="$B_DIR/etc/slurm.conf" \
    "$PY" -m pytest --suite integration --half second -m "slurm and not timed$gpu" -p no:cacheprovider "$@"
  "$PY" -m pytest --suite integration --half first -m "slurm and not timed$gpu" "$@"
  rcs+=($?)
else
  "$PY" -m pytest --suite integration -m "slurm and not timed$gpu" "$@"
  rcs+=($?)
fi
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rcs+=($?)
done
trap - INT TERM
for i in "${!pids[@]}"; do
  echo "test: ${names[$i]}:"
  cat "${logs[$i]}"
  rm -f "${logs[$i]}"
done

# 5: a phase had no test to run (a -k or a path that selects only another phase's tests)
rc=5
for r in "${rcs[@]}"; do
  if [ "$r" != 0 ] && [ "$r" != 5 ]; then rc=$r; break; fi
  [ "$r" = 0 ] && rc=0
done
if [ $rc -ne 0 ] && [ $rc -ne 5 ] && [ -d "${SQ_CLUSTER_DIR:-.cluster}/log" ]; then
  echo "test: failures: the Slurm daemon logs follow"
  bash cluster/cluster.sh logs || true
  if [ $b_up = 1 ]; then
    echo "test: the second pair of clusters ($B_DIR):"
    env "${B_ENV[@]}" bash cluster/cluster.sh logs || true
  fi
fi
if [ $b_started = 1 ]; then env "${B_ENV[@]}" bash cluster/cluster.sh down || true; fi
if [ $started = 1 ]; then bash cluster/cluster.sh down || true; fi
exit $rc
