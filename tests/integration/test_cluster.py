"""The local Slurm cluster (cluster/cluster.sh up) behaves like the GPU cluster the tool targets.

These tests assume the cluster is up. They skip when `sinfo` does not answer within a few
seconds, except under CI=true, where they fail instead (CI must have started the cluster).

Run: .venv/bin/python -m pytest tests/integration/test_cluster.py -m slurm
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import wait_for

submitit = pytest.importorskip("submitit")
cloudpickle = pytest.importorskip("cloudpickle")

# The job's Python cannot import this test module (tests/ is not on its path): ship the
# functions below by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]

GPU_PARTITIONS = ("a100", "h100", "h200")
ALL_PARTITIONS = (*GPU_PARTITIONS, "urgent")
GPUS_PER_NODE = 4
JOB_WAIT_S = 90  # bound on any one job here (they take seconds on an idle cluster)


# --------------------------------------------------------------------------------------------
# helpers


def _run(*cmd: str, timeout: float = 10) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
    return out.stdout


@pytest.fixture(scope="module", autouse=True)
def _cluster_up(slurm_cluster: None) -> None:
    """Every test here needs the cluster: skip (or fail under CI=true) without it."""


def _executor(folder: Path, **params: Any) -> Any:
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(**({"timeout_min": 10} | params))
    return ex


def _result(job: Any, timeout: float = JOB_WAIT_S) -> Any:
    wait_for(job.done, timeout, f"job {job.job_id} to finish (state {job.state})", every=0.3)
    return job.results()


def _partition_info() -> dict[str, dict[str, str]]:
    """scontrol show partition, one dict per partition."""
    parts = {}
    for line in _run("scontrol", "show", "partition", "-o").splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        parts[fields["PartitionName"]] = fields
    return parts


def _minutes(limit: str) -> float:
    """Slurm's [D-]HH:MM:SS as minutes."""
    days, _, hms = limit.rpartition("-")
    h, m, sec = (int(x) for x in hms.split(":"))
    return (int(days or 0) * 24 + h) * 60 + m + sec / 60


def _sacct(job_id: str, *, duplicates: bool = False) -> list[dict[str, str]]:
    fields = ["JobID", "Partition", "State", "NodeList", "AllocTRES", "Start", "End"]
    cmd = ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", ",".join(fields)]
    if duplicates:
        cmd.append("--duplicates")
    return [dict(zip(fields, line.split("|"), strict=True)) for line in _run(*cmd).splitlines() if line]


# --------------------------------------------------------------------------------------------
# what runs inside the jobs (module-level: submitit pickles them by reference)

ENV_KEYS = (
    "SLURM_JOB_ID",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_NODELIST",
    "SLURMD_NODENAME",
    "SLURM_JOB_GPUS",
    "SLURM_STEP_GPUS",
    "CUDA_VISIBLE_DEVICES",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_RESTART_COUNT",
)


def job_env() -> dict[str, Any]:
    env = submitit.JobEnvironment()
    return {k: os.environ.get(k) for k in ENV_KEYS} | {"global_rank": env.global_rank}


def _event(path: Path, **fields: Any) -> None:
    fields |= {"t": time.time(), "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)}
    with open(path, "a") as fh:
        fh.write(json.dumps(fields) + "\n")


class WaitForPreemption(submitit.helpers.Checkpointable):
    """First attempt: wait (up to `secs`) to be preempted; later attempts: return at once.

    Records start and USR2 events to `events`, then lets submitit's own USR2 handler run
    (checkpoint, `scontrol requeue`, exit), exactly as a real fine-tune would.
    """

    def __call__(self, events: str, secs: float = 60) -> int:
        path = Path(events)
        submitit_handler = signal.getsignal(signal.SIGUSR2)

        def on_usr2(signum: int, frame: Any) -> None:
            _event(path, ev="usr2")
            assert callable(submitit_handler)
            submitit_handler(signum, frame)

        signal.signal(signal.SIGUSR2, on_usr2)
        _event(path, ev="start", node=os.environ.get("SLURMD_NODENAME"))
        restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        if restart == 0:
            t0 = time.time()
            while time.time() - t0 < secs:
                time.sleep(0.1)
        return restart


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _has_event(path: Path, ev: str, restart: int) -> bool:
    return any(e["ev"] == ev and e["restart"] == restart for e in _events(path))


def quick_node(secs: float) -> str:
    time.sleep(secs)
    return os.environ["SLURMD_NODENAME"]


# --------------------------------------------------------------------------------------------
# tests


def test_partitions_and_gpu_gres() -> None:
    def nodes() -> list[list[str]]:
        return [line.split("|") for line in _run("sinfo", "-h", "-N", "-o", "%N|%P|%G|%t|%c|%m").splitlines()]

    # a job of the test before may still be completing on its nodes (KillWait after scancel)
    deadline = time.monotonic() + 60
    while any(r[3].startswith("comp") for r in nodes()) and time.monotonic() < deadline:
        time.sleep(1)
    rows = nodes()
    by_partition: dict[str, set[str]] = {}
    gres: dict[str, str] = {}
    for node, part, node_gres, state, cpus, mem in rows:
        by_partition.setdefault(part.rstrip("*"), set()).add(node)
        gres[node] = node_gres
        assert state in ("idle", "mix", "alloc"), f"node {node} is {state}"
        assert int(cpus) >= 2 and int(mem) >= 32000, f"node {node}: {cpus} CPUs, {mem} MB"
    assert set(by_partition) == set(ALL_PARTITIONS)
    for p in GPU_PARTITIONS:
        nodes = by_partition[p]
        assert len(nodes) >= 2, f"partition {p} has {sorted(nodes)}"
        for n in nodes:
            assert gres[n].startswith(f"gpu:{p}:{GPUS_PER_NODE}"), f"{n} has GRES {gres[n]}"
    assert by_partition["urgent"] == set().union(*(by_partition[p] for p in GPU_PARTITIONS))

    parts = _partition_info()
    assert parts["a100"]["Default"] == "YES"
    for p in GPU_PARTITIONS:
        assert int(parts["urgent"]["PriorityTier"]) > int(parts[p]["PriorityTier"])
        assert parts[p]["PreemptMode"] == "REQUEUE"
        assert parts[p]["MaxTime"] != "UNLIMITED"
    assert _minutes(parts["h200"]["MaxTime"]) < _minutes(parts["a100"]["MaxTime"])

    config = _run("scontrol", "show", "config")
    for needle in (
        "preempt/partition_prio",
        "preempt_send_user_signal",
        "cred_expire=5",
        "select/cons_tres",
        "accounting_storage/slurmdbd",
        "gres/gpu:a100",
    ):
        assert needle in config, f"{needle} missing from scontrol show config"


def test_time_limit_over_partition_max_is_refused() -> None:
    out = subprocess.run(
        ["sbatch", "-p", "h200", "-t", "45", "--wrap", "true"], capture_output=True, text=True, timeout=10
    )
    assert out.returncode != 0
    assert "time limit" in out.stderr.lower()


@pytest.mark.parametrize("partition", GPU_PARTITIONS)
def test_job_lands_on_its_partition_with_its_gpus(partition: str, tmp_path: Path) -> None:
    ex = _executor(
        tmp_path,
        slurm_partition=partition,
        slurm_gres=f"gpu:{partition}:2",
        tasks_per_node=2,
        cpus_per_task=1,
        mem_gb=4,
    )
    ranks = _result(ex.submit(job_env))
    assert sorted(r["global_rank"] for r in ranks) == [0, 1]
    for r in ranks:
        assert r["SLURM_JOB_PARTITION"] == partition
        assert r["SLURMD_NODENAME"].startswith(f"{partition}-")
        assert r["SLURM_NTASKS"] == "2"
        assert len(r["SLURM_JOB_GPUS"].split(",")) == 2, r
        assert len(r["CUDA_VISIBLE_DEVICES"].split(",")) == 2, r


def test_two_node_job_spans_two_nodes(tmp_path: Path) -> None:
    ex = _executor(tmp_path, slurm_partition="h100", nodes=2, tasks_per_node=2, gpus_per_node=1)
    ranks = _result(ex.submit(job_env))
    assert sorted(r["global_rank"] for r in ranks) == [0, 1, 2, 3]
    nodes = {r["SLURMD_NODENAME"] for r in ranks}
    assert len(nodes) == 2 and all(n.startswith("h100-") for n in nodes)
    for node in nodes:  # two ranks per node
        assert sum(r["SLURMD_NODENAME"] == node for r in ranks) == 2
        assert all(r["CUDA_VISIBLE_DEVICES"] for r in ranks)


def test_sacct_reports_finished_job(tmp_path: Path) -> None:
    ex = _executor(tmp_path, slurm_partition="a100", slurm_gres="gpu:a100:1")
    job = ex.submit(quick_node, 0)
    _result(job)

    def finished() -> dict[str, str] | None:  # the record lags job end by a moment
        rows = _sacct(job.job_id)
        ok = [r for r in rows if r["State"] == "COMPLETED" and r["Partition"] == "a100"]
        return ok[0] if ok else None

    row = wait_for(finished, 20, f"sacct to report job {job.job_id} COMPLETED")
    assert row["NodeList"].startswith("a100-")
    assert "gres/gpu:a100=1" in row["AllocTRES"]


def test_urgent_partition_preempts_and_requeues(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    node = "a100-1"
    whole_node = {"slurm_gres": f"gpu:a100:{GPUS_PER_NODE}", "slurm_nodelist": node, "tasks_per_node": 1}
    victim = _executor(tmp_path / "victim", slurm_partition="a100", timeout_min=30, **whole_node).submit(
        WaitForPreemption(), str(events), 60
    )
    wait_for(lambda: _has_event(events, "start", 0), JOB_WAIT_S, "the a100 job to start")

    urgent = _executor(tmp_path / "urgent", slurm_partition="urgent", **whole_node).submit(quick_node, 2)
    assert _result(urgent) == [node]
    assert _result(victim) == [1], f"victim was not requeued once: {_events(events)}"

    ev = _events(events)
    usr2 = [e for e in ev if e["ev"] == "usr2" and e["restart"] == 0]
    rerun = [e for e in ev if e["ev"] == "start" and e["restart"] == 1]
    assert usr2, f"the preempted job never saw USR2: {ev}"
    assert rerun, f"the preempted job never ran again: {ev}"
    delay = rerun[0]["t"] - usr2[0]["t"]
    print(f"preempted job ran again {delay:.1f} s after its USR2 (urgent job ran 2 s in between)")
    assert delay < 60

    rows = wait_for(lambda: _sacct(victim.job_id, duplicates=True), 20, "sacct rows")
    states = [r["State"] for r in rows]
    assert "REQUEUED" in states, states
    assert states[-1] in ("COMPLETED", "RUNNING", "COMPLETING"), states  # the record may lag


@pytest.mark.parametrize(
    "launch",
    [
        # submitit's default: the function runs under srun. `scancel --full` also signals the
        # batch shell, which USR2 would kill (failing the job) unless the shell traps it.
        {"slurm_setup": ["trap 'echo batch shell caught USR2' USR2"]},
        # no srun: the function runs in the batch step, which only `--full` reaches
        {"slurm_use_srun": False},
    ],
    ids=["srun-with-trap", "no-srun"],
)
def test_scancel_signal_full_reaches_the_job(launch: dict[str, Any], tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    ex = _executor(tmp_path, slurm_partition="h200", tasks_per_node=1, timeout_min=20, **launch)
    job = ex.submit(WaitForPreemption(), str(events), 60)
    wait_for(lambda: _has_event(events, "start", 0), JOB_WAIT_S, "the job to start")
    _run("scancel", "--signal=USR2", "--full", job.job_id)
    wait_for(lambda: _has_event(events, "usr2", 0), 20, "the job to see USR2")
    assert _result(job) == [1], f"job was not requeued by submitit: {_events(events)}"


def second_conf() -> Path:
    """The second local cluster's slurm.conf, as the script states it (`SQ_WHICH=second ... env`)."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "SQ_WHICH": "second"}
    out = subprocess.run(
        ["bash", str(repo / "cluster" / "cluster.sh"), "env"],
        capture_output=True,
        text=True,
        env=env,
        timeout=10,
    ).stdout
    return Path(out.strip().removeprefix("export SLURM_CONF="))


def test_a_second_cluster_runs_beside_the_first_on_one_accounting_database(tmp_path: Path) -> None:
    """`cluster.sh up` starts a second cluster (sqlocal2: one h100 node) with its own controller,
    selected by SLURM_CONF; both report to one slurmdbd, so the first's clients reach the
    second with -M (`sbatch -M`, `sacct -M`), as on a site with several clusters. Job ids are
    each cluster's own."""
    conf = second_conf()
    assert conf.is_file(), conf
    second = {**os.environ, "SLURM_CONF": str(conf)}

    def on_second(*cmd: str) -> str:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True, env=second).stdout

    assert "ClusterName             = sqlocal2" in on_second("scontrol", "show", "config")
    assert "ClusterName             = sqlocal" in _run("scontrol", "show", "config")
    assert sorted(on_second("sinfo", "-h", "-o", "%P").split()) == ["h100*", "urgent"]
    # a job of the second, submitted from the first's clients: only -M finds it
    out = _run(
        "sbatch",
        "--parsable",
        "-M",
        "sqlocal2",
        "-p",
        "h100",
        f"--output={tmp_path}/%j.out",
        "--wrap=hostname",
    )
    job = out.strip().split(";")[0]

    def done() -> str | None:
        rows = on_second("sacct", "-X", "-n", "-P", "-j", job, "-o", "State,Cluster,NodeList").split()
        return rows[0] if rows and rows[0].startswith("COMPLETED") else None

    assert wait_for(done, JOB_WAIT_S, f"job {job} on sqlocal2") == "COMPLETED|sqlocal2|h100-1"
    assert _run("sacct", "-X", "-n", "-P", "-M", "sqlocal2", "-j", job, "-o", "Cluster").split() == [
        "sqlocal2"
    ]
