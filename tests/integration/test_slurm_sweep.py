"""The fan-out on a real Slurm (cluster/cluster.sh up): one `qualify sweep` spreads its points
over the a100, h100 and h200 partitions, each with its own resources; bad input is refused
before anything is queued; `qualify status` follows the sweep to the end; a 2-node job trains
on both nodes; the generated sbatch script matches a golden file; `qualify discover` writes
partition stubs that compose.

The jobs run the tiny model on CPU (the fake nodes' GPUs are /dev/null): 10-25 s each here.
Run: .venv/bin/python -m pytest tests/integration/test_slurm_sweep.py   (about 3 minutes on 2 cores)
Refresh the golden files: SQ_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/integration/test_slurm_sweep.py -k golden
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.config.schema import ConfigError, PartitionConfig
from pipeline.contract.outcome import Outcome
from pipeline.tracking import keys as K
from tests.support.helpers import NEEDS_POSTGRES, SharedServer, shared_server, summary_row, wait_for
from tests.support.slurm_sweep import (
    JOB_WAIT_S,
    ONE_RANK,
    TINY,
    follow,
    manifest_of,
    point_runs,
    qualify,
    sweep_id_of,
)

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"


# --------------------------------------------------------------------------------------------
# helpers


def _queued_under(path: Path) -> list[str]:
    """Jobs in squeue whose batch script lies under `path` (submitit writes it there)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%o"], capture_output=True, text=True, timeout=10)
    return [line for line in out.stdout.splitlines() if str(path) in line]


def _sacct_times(job_id: str) -> tuple[float, float] | None:
    """(start, end) of a finished job from sacct; None while sacct has not recorded the end."""
    from datetime import datetime

    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "Start,End", "-j", job_id],
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout.strip()
    try:
        start, end = (datetime.fromisoformat(v.strip()).timestamp() for v in out.split("|"))
    except ValueError:  # "Unknown": the record lags the job's end by a moment
        return None
    return start, end


# --------------------------------------------------------------------------------------------
# bad input: a clear error, exit code 2, no sweep folder, nothing queued

BAD_INPUT = [
    pytest.param(
        ["partition=b200"],
        ["no partition 'b200'", "Its partitions: a100, h100, h200, urgent"],
        id="partition-the-cluster-lacks",
    ),
    pytest.param(
        # the YAML may claim 8; the cluster's nodes decide
        ["partition=ci_h100", "parallelism.gpus_per_node=8", "partition.gpus_per_node=8"],
        ["parallelism.gpus_per_node=8 is more GPUs per node than partition 'h100' has", "at most 4 x h100"],
        id="more-gpus-per-node-than-the-nodes-have",
    ),
    pytest.param(
        ["partition=ci_h100", "partition.gpu_type=a100"],
        ["partition 'h100' has no GPU of type 'a100'", "Its nodes have: h100 (4 per node)"],
        id="gpu-type-the-partition-lacks",
    ),
    pytest.param(
        ["partition=ci_h100", "parallelism.nodes=0"],
        ["Invalid value for 'parallelism.nodes': 0", "Allowed: an integer >= 1", "Nothing was submitted"],
        id="zero-nodes",
    ),
    pytest.param(
        ["partition=ci_h100", "parallelism.nodes=3", "parallelism.gpus_per_node=1"],
        ["parallelism.nodes=3 is more nodes than partition 'h100' can give", "2 node(s) (h100-1, h100-2)"],
        id="more-nodes-than-the-partition-has",
    ),
    pytest.param(
        # max_time_min=null: the YAML does not know the limit; the cluster's MaxTime decides
        ["partition=ci_h200", "partition.time_limit_min=45", "partition.max_time_min=null"],
        ["partition.time_limit_min=45 min is over partition 'h200' MaxTime of 30 min"],
        id="time-limit-over-maxtime",
    ),
]


@pytest.mark.slurm
@pytest.mark.parametrize(("overrides", "expected"), BAD_INPUT)
def test_bad_input_is_refused_before_submission(
    overrides: list[str], expected: list[str], tmp_path: Path, slurm_cluster: None
) -> None:
    runs = tmp_path / "runs"
    out = qualify(
        "sweep",
        "--sweep",
        "slurm_ci",
        "--launcher",
        "slurm",
        f"runs_dir={runs}",
        f"tracking.uri=sqlite:///{tmp_path / 'mlruns.db'}",
        *overrides,
    )
    assert out.returncode == 2, f"rc={out.returncode}\n{out.stdout}\n{out.stderr}"
    for text in expected:
        assert text in out.stderr, f"'{text}' not in the error:\n{out.stderr}"
    assert "nothing was submitted" in out.stderr.lower()
    assert "Traceback" not in out.stderr
    assert not runs.exists(), f"a sweep folder was written: {list(runs.rglob('*'))[:5]}"
    assert not (tmp_path / "mlruns.db").exists(), "MLflow was touched"
    assert _queued_under(tmp_path) == []


@pytest.mark.slurm
def test_every_problem_of_a_sweep_in_one_error(tmp_path: Path, slurm_cluster: None) -> None:
    """Four points, three of them bad in different ways: one message names all three (b200 is a
    real 8-GPU node, so 6 ranks per node are only refused because this cluster has no b200)."""
    out = qualify(
        "sweep",
        "--sweep",
        "slurm_ci",
        "--launcher",
        "slurm",
        f"runs_dir={tmp_path / 'runs'}",
        "partition=ci_a100,ci_h100,ci_h200,b200",
        "partition.time_limit_min=45",
        "parallelism.gpus_per_node=6",
    )
    assert out.returncode == 2, out.stderr
    err = out.stderr
    assert "5 problem(s) against this Slurm cluster" in err, err
    for label in ("p0000-ci_a100", "p0001-ci_h100", "p0002-ci_h200", "p0003-b200"):
        assert label in err, err
    assert "MaxTime of 30 min" in err and "no partition 'b200'" in err
    assert err.count("more GPUs per node") == 3, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slurm
def test_cluster_is_read_with_two_scontrol_calls(
    tmp_path: Path, slurm_cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many points: one `scontrol show partition -o`, one `scontrol show node -o`, and
    `scontrol show config` twice (the cluster's name for the record; whether Slurm enforces
    submit limits: not here, so no sacctmgr), each with a timeout."""
    from pipeline.slurm import commands
    from pipeline.submit.sweep import plan

    calls: list[tuple[list[str], Any]] = []
    real_execute = commands.execute

    def counting_run(cmd: list[str], timeout_s: float) -> Any:  # the one place commands start
        calls.append((list(cmd), timeout_s))
        return real_execute(cmd, timeout_s)

    monkeypatch.setattr(commands, "execute", counting_run)
    pl = plan("slurm_ci", [f"runs_dir={tmp_path}", "train.seed=1,2,3,4"], launcher_kind="slurm")
    assert len(pl.points) == 12 and pl.launcher == "slurm"
    scontrol = [c for c in calls if c[0][0] == "scontrol"]
    assert sorted(c[0][2] for c in scontrol) == ["config", "config", "node", "partition"], calls
    assert all((c[0][2] == "config" or c[0][-1] == "-o") and c[1] for c in scontrol), calls
    assert not [c for c in calls if c[0][0] == "sacctmgr"], calls


def _conf_value(key: str) -> str:
    """A setting as the cluster's slurm.conf file states it (read as a file: a reference that
    runs no Slurm client)."""
    conf = Path(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    for line in conf.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == key:
            return value.split("#")[0].strip()
    raise AssertionError(f"{conf} sets no {key}")


@pytest.mark.slurm
def test_the_cluster_is_named_as_its_slurm_conf_says(slurm_cluster: None) -> None:
    """Issue 36: `Scheduler.identity()` against the slurm.conf file and `sinfo --version`."""
    from pipeline.sched import SLURM

    ident = SLURM.identity()
    assert ident.name == _conf_value("ClusterName")
    assert ident.controller == _conf_value("SlurmctldHost").split("(")[0]
    version = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, check=True).stdout
    assert version.split()[-1] == ident.slurm_version, version  # "slurm 24.05.1", Debian "slurm-wlm 22.05.8"


# --------------------------------------------------------------------------------------------
# the fan-out


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(480)
@NEEDS_POSTGRES
def test_one_sweep_fans_out_over_three_partitions(
    tmp_path: Path, slurm_cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One command, six points (3 partitions x 2 seeds) -> three job arrays of two (one per
    resource shape, one task at a time: array_parallelism=1). The command returns while the
    jobs are queued; `qualify status --follow` reports them to the end; each job recorded the
    partition, node, GPU type and count it ran with.

    They log to the shared server a team would run: MLflow on PostgreSQL with basic auth, the
    jobs reading the credentials from the environment sbatch hands them. Every metric event of
    every point's ledger is in the store, and the password is in no job log, file, param or tag."""
    with shared_server(tmp_path, monkeypatch.setenv) as server:
        _fan_out(tmp_path, server, monkeypatch)
    found = subprocess.run(["grep", "-rl", server.password, str(tmp_path)], capture_output=True, text=True)
    assert found.stdout == "", f"the password was written to: {found.stdout}"


def _fan_out(tmp_path: Path, server: SharedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow_server = server.url
    runs = tmp_path / "runs"
    t0 = time.monotonic()
    out = qualify(
        "sweep",
        "--sweep",
        "slurm_ci",
        f"runs_dir={runs}",
        f"tracking.uri={mlflow_server}",
        "tracking.experiment=fanout",
        "train.seed=1,2",
        "launcher.array_parallelism=1",
        "train.measure_ceiling=false",  # not what this test checks: shorter jobs
        "train.measure_comm=false",
        ONE_RANK,
        *TINY,
    )
    submit_s = time.monotonic() - t0
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    assert out.stdout.startswith("estimate: "), out.stdout  # what it will cost, before anything
    assert out.stdout.splitlines()[1].startswith("launcher: slurm (Slurm answers on this machine (sinfo))"), (
        out.stdout
    )
    assert "submitted 6 points in 3 job array(s)" in out.stdout, out.stdout
    sweep_id = sweep_id_of(out.stdout)
    sweep_dir = runs / sweep_id

    # it returned before the jobs finished: no outcome yet, jobs queued or running
    from pipeline.slurm.cluster import job_states

    manifest = manifest_of(sweep_dir)
    job_ids = [p["job_id"] for p in manifest["points"]]
    assert manifest["submitted"] and all(job_ids), manifest
    states = job_states(job_ids)
    assert not any((Path(p["point_dir"]) / "outcome.json").exists() for p in manifest["points"])
    assert {s.state for s in states.values()} <= {"PENDING", "RUNNING", "CONFIGURING"}, states
    assert any(s.state == "PENDING" for s in states.values()), states  # second array tasks wait
    print(
        f"qualify sweep returned in {submit_s:.1f} s with the jobs {sorted({s.state for s in states.values()})}"
    )

    # one array per partition, two tasks each
    arrays: dict[str, list[str]] = {}
    for p in manifest["points"]:
        arrays.setdefault(p["partition"], []).append(p["job_id"])
    assert sorted(arrays) == ["ci_a100", "ci_h100", "ci_h200"]
    for ids in arrays.values():
        base = {j.split("_")[0] for j in ids}
        assert len(base) == 1 and sorted(j.split("_")[1] for j in ids) == ["0", "1"], ids

    # status follows to the end on its own
    t1 = time.monotonic()
    st = follow(sweep_id, runs, timeout=JOB_WAIT_S)
    print(f"qualify status --follow ended {time.monotonic() - t1:.0f} s later")
    assert st.returncode == 0, f"{st.stdout}\n{st.stderr}"
    assert "all     [########################] 6/6" in st.stdout, st.stdout
    final_table = st.stdout[st.stdout.rfind(f"sweep {sweep_id}") :]
    for part in ("ci_a100", "ci_h100", "ci_h200"):
        assert re.search(rf"^{part}\s+0\s+0\s+0\s+2\s+0\s", final_table, re.M), final_table
    for p in manifest["points"]:
        assert re.search(r"\saccepted\s", summary_row(st.stdout, p["point_id"])), st.stdout

    # what each job recorded in MLflow
    runs_found = point_runs(mlflow_server, "fanout", sweep_id)
    assert len(runs_found) == 6, [r.data.tags.get(K.TAG_POINT_ID) for r in runs_found]
    by_point = {p["point_id"]: p for p in manifest["points"]}
    for run in runs_found:
        tags = run.data.tags
        point = by_point[tags[K.TAG_POINT_ID]]
        part = point["partition"].removeprefix("ci_")  # preset ci_a100: Slurm partition a100
        assert tags[K.TAG_OUTCOME] == Outcome.ACCEPTED, tags
        assert run.info.status == "FINISHED"
        assert tags[K.TAG_SLURM_PARTITION] == part, tags
        assert tags[K.TAG_SLURM_NODENAME].startswith(f"{part}-"), tags
        assert tags[K.TAG_SLURM_GRES] == f"gpu:{part}:1", tags
        assert len(tags[K.TAG_SLURM_GPUS].split(",")) == 1, tags
        assert tags[K.TAG_SLURM_NODELIST].startswith(f"{part}-"), tags
        assert tags[K.TAG_SLURM_ARRAY_TASK_ID] == point["job_id"].split("_")[1], tags
        assert tags[K.TAG_SLURM_JOB_ID] and tags[K.TAG_RESTARTS] == "0", tags
        assert tags[K.TAG_GPUS] == "1" and tags[K.TAG_LAUNCHER] == "slurm"
        assert tags[K.TAG_CLUSTER] == _conf_value("ClusterName"), tags
        assert run.info.run_id and run.data.tags.get("mlflow.parentRunId") == manifest["parent_run_id"]

    # array_parallelism=1: the two tasks of an array did not overlap
    for ids in arrays.values():
        first, second = (
            wait_for(lambda j=j: _sacct_times(j), 30, f"sacct times of {j}") for j in sorted(ids)
        )
        assert second[0] >= first[1] - 1, (ids, first, second)

    # the parent run was closed when the sweep ended, with the manifest attached
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    parent = client.get_run(manifest["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags[K.TAG_SWEEP_ID] == sweep_id
    assert "manifest.json" in [a.path for a in client.list_artifacts(parent.info.run_id)]

    # every metric event of every ledger is in the server's store, read back from PostgreSQL
    # itself (one query per key, not one authenticated request: each costs a scrypt hash)
    monkeypatch.setenv("PGPASSFILE", server.pgpass)
    store = MlflowClient(tracking_uri=server.store_uri)
    by_point_run = {r.data.tags[K.TAG_POINT_ID]: r for r in runs_found}
    ledgers = sorted(sweep_dir.glob("points/*/tracking/ledger.jsonl"))
    assert len(ledgers) == 6, ledgers
    for ledger in ledgers:
        run = by_point_run[ledger.parent.parent.name]
        logged: dict[str, set[tuple[int, float]]] = {}
        for ev in (json.loads(line) for line in ledger.read_text().splitlines()):
            if ev["k"] == "m":
                for key, value in ev["d"].items():
                    logged.setdefault(key, set()).add((ev["s"] or 0, value))
        assert len(logged) > 20, sorted(logged)  # the point's measurements, not a handful
        for key, points in logged.items():
            stored = {(m.step, m.value) for m in store.get_metric_history(run.info.run_id, key)}
            assert points <= stored, (key, sorted(points - stored)[:5])
        texts = [*run.data.params.values(), *run.data.tags.values()]
        assert not [t for t in texts if server.password in t]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_node_job_trains_on_both_nodes(tmp_path: Path, slurm_cluster: None, mlflow_server: str) -> None:
    runs = tmp_path / "runs"
    out = qualify(
        "sweep",
        "--sweep",
        "slurm_ci",
        "--wait",
        "partition=ci_h100",
        "parallelism.nodes=2",
        "parallelism.gpus_per_node=1",
        f"runs_dir={runs}",
        f"tracking.uri={mlflow_server}",
        "tracking.experiment=two-nodes",
        *TINY,
        timeout=JOB_WAIT_S,
    )
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    sweep_id = sweep_id_of(out.stdout)
    manifest = manifest_of(runs / sweep_id)
    (point,) = manifest["points"]
    outcome = json.loads((Path(point["point_dir"]) / "outcome.json").read_text())
    assert outcome["outcome"] == Outcome.ACCEPTED, outcome

    # each rank logs where it ran (the fake nodes share one host: the Slurm node name tells)
    logs = "".join(p.read_text() for p in (runs / sweep_id / "submitit").glob(f"{point['job_id']}_*_log.out"))
    placed = dict(re.findall(r"\[rank\] rank=(\d)/2 .*?node=(\S+)", logs))
    assert sorted(placed) == ["0", "1"], logs[-3000:]
    assert {placed["0"], placed["1"]} == {"h100-1", "h100-2"}, placed
    assert "master=127.0.0.1:" in logs  # h100-1 does not resolve: Slurm's NodeAddr was used

    (run,) = point_runs(mlflow_server, "two-nodes", sweep_id)
    tags = run.data.tags
    assert tags[K.TAG_SLURM_NODELIST] == "h100-[1-2]", tags
    assert tags[K.TAG_GPUS] == "2" and tags[K.TAG_SLURM_GRES] == "gpu:h100:1", tags
    assert tags[K.TAG_OUTCOME] == Outcome.ACCEPTED
    assert tags[K.TAG_CLUSTER] == _conf_value("ClusterName"), "the run names its cluster (issue 36)"
    assert tags[K.TAG_CLUSTER_CONTROLLER] == _conf_value("SlurmctldHost").split("(")[0]


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_status_records_a_job_that_ended_without_outcome(
    tmp_path: Path, slurm_cluster: None, mlflow_server: str
) -> None:
    """Submitted held, then cancelled before it ran: `qualify status --follow` ends and the
    point is failed, in its outcome file and in MLflow."""
    runs = tmp_path / "runs"
    out = qualify(
        "sweep",
        "--sweep",
        "slurm_ci",
        "partition=ci_a100",
        "launcher.hold=true",
        f"runs_dir={runs}",
        f"tracking.uri={mlflow_server}",
        "tracking.experiment=lost",
    )
    assert out.returncode == 0, out.stderr
    sweep_id = sweep_id_of(out.stdout)
    (point,) = manifest_of(runs / sweep_id)["points"]
    held = subprocess.run(
        ["squeue", "-h", "-o", "%r", "-j", point["job_id"]], capture_output=True, text=True, timeout=10
    )
    assert held.stdout.strip() == "JobHeldUser", held.stdout
    subprocess.run(["scancel", point["job_id"]], check=True, timeout=10)

    st = follow(sweep_id, runs, timeout=90, interval_s=1)
    assert st.returncode == 0, st.stderr
    assert re.search(r"^ci_a100\s+0\s+0\s+0\s+0\s+1\s", st.stdout, re.M), st.stdout
    outcome = json.loads((Path(point["point_dir"]) / "outcome.json").read_text())
    assert outcome["outcome"] == Outcome.FAILED
    assert f"Slurm job {point['job_id']} ended CANCELLED without an outcome" == outcome["detail"]
    (run,) = point_runs(mlflow_server, "lost", sweep_id)
    assert run.data.tags[K.TAG_OUTCOME] == Outcome.FAILED and run.info.status == "FAILED"
    assert "CANCELLED" in run.data.tags[K.TAG_REASON_DETAIL]


# --------------------------------------------------------------------------------------------
# the generated sbatch script (no cluster needed)

GOLDEN_CASES = {
    # an array of two points with every optional flag a partition can carry
    "a100_array_of_2": [
        "partition=ci_a100",
        "train.seed=1,2",
        "partition.account=proj42",
        "partition.qos=high",
        "partition.constraint=nvlink",
        "partition.setup=['module load cuda/12.4','source /opt/env.sh']",
        "launcher.array_parallelism=8",
    ],
    # one 2-node job: not an array
    "h100_two_nodes": ["partition=ci_h100", "parallelism.nodes=2", "parallelism.gpus_per_node=1"],
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_sbatch_script_matches_golden(case: str, tmp_path: Path) -> None:
    from pipeline.config.compose import compose_sweep
    from pipeline.submit.launcher import ResourceShape, group_by_shape, sbatch_script

    points = compose_sweep("slurm_ci", GOLDEN_CASES[case])
    groups = group_by_shape([(i, p.cfg) for i, p in enumerate(points)])
    assert len(groups) == 1, groups
    ((shape, indices),) = groups.items()
    assert shape == ResourceShape.of(points[0].cfg)
    folder = tmp_path / "runs" / "SWEEP" / "submitit"
    text = sbatch_script(folder, shape, points[0].cfg.launcher, "sq-SWEEP", len(indices))
    text = text.replace(str(folder), "<FOLDER>").replace(sys.executable, "<PYTHON>")
    golden = GOLDEN / f"{case}.sbatch"
    if os.environ.get("SQ_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden}: run SQ_UPDATE_GOLDEN=1 pytest {__file__} -k golden"
    assert text == golden.read_text(), (
        f"the sbatch script for {case} differs from {golden}. If the change is intended, refresh it with:\n"
        f"  SQ_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/integration/test_slurm_sweep.py -k golden\n"
        f"and review the diff (git diff tests/integration/golden).\n--- generated ---\n{text}"
    )
    assert text.splitlines()[text.splitlines().index("# setup") + 1].startswith("trap "), (
        "the USR2 trap comes first"
    )


# --------------------------------------------------------------------------------------------
# qualify discover


@pytest.mark.slurm
def test_discover_writes_stubs_that_compose(tmp_path: Path, slurm_cluster: None) -> None:
    from omegaconf import OmegaConf

    out_dir = tmp_path / "partition"
    res = qualify("discover", "--", "--out", str(out_dir))
    assert res.returncode == 0, res.stderr
    names = sorted(p.stem for p in out_dir.glob("*.yaml"))
    assert names == ["a100", "h100", "h200", "urgent-a100", "urgent-h100", "urgent-h200"], names

    stubs: dict[str, PartitionConfig] = {}
    for path in out_dir.glob("*.yaml"):
        text = path.read_text()
        assert "FILL IN" in text and "price_usd_per_gpu_hour: null" in text
        merged = OmegaConf.merge(OmegaConf.structured(PartitionConfig), OmegaConf.load(path))
        stub = OmegaConf.to_object(merged)
        assert isinstance(stub, PartitionConfig), stub
        stubs[path.stem] = stub
    for name in ("a100", "h100", "h200"):
        s = stubs[name]
        assert (s.slurm_partition, s.gpu_type, s.gpus_per_node) == (name, name, 4)
        assert s.price_usd_per_gpu_hour is None and s.peak_tflops == {}
        assert s.preempt_mode == "requeue" and s.cpus_per_task == 2 and s.mem_gb_per_node == 62
    assert stubs["a100"].max_time_min == 60 and stubs["h200"].max_time_min == 30
    assert stubs["h200"].time_limit_min <= 30
    assert (stubs["urgent-h200"].slurm_partition, stubs["urgent-h200"].gpu_type) == ("urgent", "h200")

    # never overwritten without --force
    (out_dir / "a100.yaml").write_text("# mine\n")
    again = qualify("discover", "--", "--out", str(out_dir))
    assert again.returncode == 0 and (out_dir / "a100.yaml").read_text() == "# mine\n"
    assert "kept" in again.stdout
    forced = qualify("discover", "--", "--out", str(out_dir), "--force", "--partition", "a100")
    assert forced.returncode == 0 and "slurm_partition" in (out_dir / "a100.yaml").read_text()

    # the stubs compose with the project's config (schema and all) and pass the cluster check
    from hydra import compose, initialize_config_dir

    from pipeline.config.compose import register_configs, to_typed
    from pipeline.slurm.cluster import read_cluster
    from pipeline.submit.checks import cluster_problems

    conf = tmp_path / "conf"
    import shutil

    shutil.copytree(REPO / "conf", conf)
    for path in out_dir.glob("*.yaml"):
        shutil.copy(path, conf / "partition" / f"found-{path.name}")
    register_configs()
    cluster = read_cluster()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        for name in sorted(stubs):
            overrides = [f"partition=found-{name}", "parallelism.gpus_per_node=2"]
            cfg = to_typed(compose(config_name="config", overrides=overrides), overrides)
            assert cfg.partition.slurm_partition is not None
            assert cluster_problems(cfg, cluster) == [], name


# --------------------------------------------------------------------------------------------
# parsing of Slurm's output (no cluster needed)


def test_parse_scontrol_records() -> None:
    from pipeline.slurm.cluster import _expand_array, parse_gres, parse_minutes, parse_record

    rec = parse_record(
        "NodeName=h100-1 Arch=x86_64 Gres=gpu:h100:4(S:0-1) NodeAddr=10.0.0.7 "
        "OS=Linux 6.18.44-fc-v509 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=64000 Partitions=h100,urgent"
    )
    assert rec["OS"] == "Linux 6.18.44-fc-v509 #1 SMP PREEMPT_DYNAMIC @0"
    assert rec["RealMemory"] == "64000" and rec["Partitions"] == "h100,urgent"
    assert parse_gres("gpu:h100:4(S:0-1),gpu:a100:2,shard:8") == {"h100": 4, "a100": 2}
    assert parse_gres("gpu:2") == {"": 2} and parse_gres("(null)") == {}
    assert parse_minutes("01:00:00") == 60 and parse_minutes("1-00:00:00") == 1440
    assert parse_minutes("30:00") == 30 and parse_minutes("UNLIMITED") is None
    assert _expand_array("12_[0-2,5%4]") == ["12_0", "12_1", "12_2", "12_5"]
    assert _expand_array("12_3") == ["12_3"]


def test_cluster_problems_on_a_described_cluster() -> None:
    """The checks on a cluster given as data: MaxNodes, mixed node sizes, a local partition."""
    from pipeline.config.compose import compose_sweep
    from pipeline.slurm.cluster import ClusterInfo, NodeInfo, PartitionInfo
    from pipeline.submit.checks import check_against_cluster, cluster_problems

    big = NodeInfo("g1", 64, 512000, {"h100": 8}, ("h100",), "10.0.0.1", "IDLE")
    small = NodeInfo("g2", 64, 512000, {"h100": 4}, ("h100",), "10.0.0.2", "IDLE")
    cluster = ClusterInfo(
        {"h100": PartitionInfo("h100", 60, 1, "REQUEUE", True, "UP")}, {"g1": big, "g2": small}
    )
    (ok,) = compose_sweep("slurm_ci", ["partition=ci_h100", "parallelism.gpus_per_node=4"])
    assert cluster_problems(ok.cfg, cluster) == []
    (two,) = compose_sweep(
        "slurm_ci", ["partition=ci_h100", "parallelism.gpus_per_node=8", "parallelism.nodes=2"]
    )
    (problem,) = cluster_problems(two.cfg, cluster)  # only g1 has 8, and MaxNodes=1
    assert "parallelism.nodes=2" in problem and "1 node(s) (g1)" in problem and "MaxNodes=1" in problem
    # the YAML's copies of cluster facts do not decide: 8 GPUs fit g1 though ci_h100.yaml says 4,
    # and a MaxTime of 10 in the YAML is stale when the cluster says 60
    # (64 GB per node: 8 ranks need about 17 GB of host memory, which ci_h100.yaml's 16 does not hold)
    (stale,) = compose_sweep(
        "slurm_ci",
        [
            "partition=ci_h100",
            "parallelism.gpus_per_node=8",
            "partition.max_time_min=10",
            "partition.mem_gb_per_node=64",
        ],
    )
    check_against_cluster([(stale.point_id, stale.cfg)], cluster)
    (local,) = compose_sweep("smoke", [])
    with pytest.raises(ConfigError, match="slurm_partition is null"):
        check_against_cluster([(local.point_id, local.cfg)], cluster)
    # more points than the controller holds jobs: refused before sbatch sleeps and fails
    cluster.max_job_count = 2
    with pytest.raises(ConfigError, match=r"3 points are 3 Slurm jobs.*MaxJobCount=2"):
        check_against_cluster([(f"p{i}", ok.cfg) for i in range(3)], cluster)
    check_against_cluster([(f"p{i}", ok.cfg) for i in range(2)], cluster)


@pytest.mark.slurm
def test_a_refused_group_cancels_the_groups_already_queued(
    tmp_path: Path, slurm_cluster: None, sqlite_uri: str
) -> None:
    """sbatch refuses the second group (a node feature the cluster lacks, which the checks
    do not know): the first group, already queued, is cancelled, and status says why."""
    from pipeline.submit.status import watch
    from pipeline.submit.sweep import SubmissionError, plan, submit

    pl = plan(
        "slurm_ci",
        [
            "partition=ci_a100,ci_h100",
            "launcher.hold=true",
            f"runs_dir={tmp_path}",
            f"tracking.uri={sqlite_uri}",
        ],
        launcher_kind="slurm",
    )
    pl.points[1].cfg.partition.constraint = "no-such-feature"
    with pytest.raises(SubmissionError, match="Invalid feature specification") as err:
        submit(pl)
    assert "Cancelled the 1 job(s) already queued" in str(err.value)
    m = pl.manifest
    assert m.error and not m.submitted and not any(p.job_id for p in m.points)
    wait_for(lambda: not _queued_under(tmp_path), 10, "the queued group to be cancelled")

    class Out:
        text = ""

        def write(self, s: str) -> None:
            self.text += s

        def flush(self) -> None:
            pass

        def isatty(self) -> bool:
            return False

    out = Out()
    assert watch(pl.sweep_dir, follow=True, interval_s=0.1, out=out) == []
    assert "was not submitted: sbatch refused group h100" in out.text


@pytest.mark.slurm
def test_a_sweep_past_the_max_submit_jobs_limit_is_refused(
    slurm_cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MaxSubmitJobs read from the real accounting database (sacctmgr) and the user's queue
    (squeue): the association's limit (2 on qualify/root) is tighter than the QOS's (3 on
    normal), one held job already counts, so a sweep of 2 points is refused before anything is
    submitted and one of 1 passes. The local cluster does not enforce limits
    (AccountingStorageEnforce=none): its `scontrol show config` answer is read through with
    that one line changed, as on a site that enforces them; unchanged, no limit binds."""
    from pipeline.config.compose import compose_sweep
    from pipeline.slurm import commands
    from pipeline.slurm.cluster import SubmitLimit, submit_limit
    from pipeline.submit.checks import check_against_cluster

    user = "root"
    assert submit_limit(user, None, None) is None  # not enforced here: nothing to read
    real_show_config = commands.show_config

    def enforcing(
        timeout_s: float = commands.CLIENT_TIMEOUT_S, at: commands.Address | None = None
    ) -> list[str]:
        return [
            "AccountingStorageEnforce = associations,limits"
            if ln.startswith("AccountingStorageEnforce")
            else ln
            for ln in real_show_config(timeout_s, at)
        ]

    monkeypatch.setattr(commands, "show_config", enforcing)

    def sacctmgr(*args: str) -> None:
        subprocess.run(["sacctmgr", "-i", *args], check=True, capture_output=True, timeout=30)

    held = ""
    try:
        sacctmgr("modify", "qos", "where", "name=normal", "set", "MaxSubmitJobsPerUser=3")
        assert submit_limit(user, None, None) == SubmitLimit(3, "QOS normal's MaxSubmitJobsPerUser", 0)
        sacctmgr("modify", "user", "where", f"name={user}", "account=qualify", "set", "MaxSubmitJobs=2")
        held = subprocess.run(
            ["sbatch", "--parsable", "--hold", "-p", "a100", "-J", "sq-limit-test", "--wrap=true"],
            check=True, capture_output=True, text=True, timeout=30,
        ).stdout.strip().split(";")[0]  # fmt: skip
        got = submit_limit(user, None, None)
        assert got == SubmitLimit(2, "association qualify/root's MaxSubmitJobs", 1), got
        (ok,) = compose_sweep("slurm_ci", ["partition=ci_a100"])
        with pytest.raises(
            ConfigError, match=r"2 point\(s\) .* MaxSubmitJobs is 2 and 1 of your jobs .* room for 1"
        ):
            check_against_cluster([(f"p{i}", ok.cfg) for i in range(2)])
        check_against_cluster([("p0", ok.cfg)])
    finally:
        if held:
            subprocess.run(["scancel", held], timeout=30)
        sacctmgr("modify", "user", "where", f"name={user}", "account=qualify", "set", "MaxSubmitJobs=-1")
        sacctmgr("modify", "qos", "where", "name=normal", "set", "MaxSubmitJobsPerUser=-1")
