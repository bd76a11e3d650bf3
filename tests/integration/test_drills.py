"""Failure drills end to end, through the real CLI: each one interrupts a real run, the job is
requeued and resumes, every step's loss equals an uninterrupted reference run, and the
restart-time breakdown in MLflow adds up to its total.

Integration tests as data (torchtitan's OverrideDefinitions): a name, the launcher, the
overrides, and the lost steps expected.

The time-out drills depend on time, not on this machine's speed: their runs are paced
(drill.timeout.step_floor_s: a step at most every STEP_FLOOR_S, the ranks sleeping between
steps, so a run of minutes holds no core), their time limit comes from the start-up measured
just before, under the same load (see timed_overrides), and they allow as many time-outs as a
slow machine needs; what must hold is asserted instead (every attempt but the last stopped on a
time-out, the run itself was interrupted, nothing was lost, every loss equals the reference
where the drill runs one). They carry the `paced` mark: scripts/test.sh runs the local one in a
stream of its own at the machine's priority (not beside niced work), so that the start-up
measured holds roughly while it runs."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.tracking import keys as K
from tests.support.data_fixtures import learnable_tokens
from tests.support.helpers import point_runs, qualify

RESTART_PARTS = [
    "restart/signal_to_exit_s",
    "restart/exit_to_start_s",
    "restart/start_to_ready_s",
    "restart/load_s",
    "restart/first_step_s",
]


@dataclass
class Drill:
    name: str
    launcher: str
    overrides: list[str]
    lost_steps: int | None  # steps redone after the resume; None: the steps done since the
    # last interval checkpoint before the kill (where in the run a SIGKILL lands is timing)
    min_attempts: int = 2
    extra: list[str] = field(default_factory=list)
    timed: bool = False  # a paced run, its limit and steps from the pace measured now (timed_overrides)

    def value(self, key: str, overrides: list[str] | None = None) -> str:
        return next(o for o in overrides or self.overrides if o.startswith(f"{key}=")).split("=", 1)[1]


TINY = ["model=tiny", "precision=fp32", "parallelism=zero2", "train.measure_comm=false"]
DRILLS = [
    Drill("preempt-local", "local", ["drill=preempt", "drill.preempt.trigger=local", "train.steps=20"], 0),
    Drill(
        # 4 gloo ranks (on 2 cores): the survivors of a kill must leave one attempt record, not
        # one each; the killed rank is neither rank 0 (the writer) nor rank 1 (its stand-in)
        "kill_worker-local",
        "local",
        [
            "drill=kill_worker",
            "parallelism.gpus_per_node=4",
            "drill.kill_worker.rank=2",
            "train.checkpoint_interval=5",
            "train.steps=20",
        ],
        None,
    ),
    Drill("timeout-local", "local", ["drill=timeout", "train.checkpoint_interval=0"], 0, timed=True),
    # the full fine-tune preempted by USR2 on Slurm: test_preempt_drill_on_a_token_file_... (the
    # same drill, checked the same way, on the user's token file instead of the synthetic data)
    Drill(  # an adapter checkpoint (LoRA weights and their optimizer state) resumes bit-exact
        "preempt-signal-lora",
        "slurm",
        [
            "partition=ci_h100",
            "method=lora",
            "train.lr=0.01",
            "drill=preempt",
            "drill.preempt.trigger=signal",
            "train.steps=20",
        ],
        0,
    ),
    Drill(
        "preempt-urgent",
        "slurm",
        ["partition=ci_a100", "drill=preempt", "drill.preempt.trigger=urgent", "train.steps=20"],
        0,
    ),
    Drill(
        # on the SECOND local cluster, submitted from the first's login node (--clusters,
        # docs/clusters.md section 10): the job requeues itself with its own `scontrol requeue`,
        # which must reach sqlocal2's controller (slurmd hands the job that cluster's SLURM_CONF),
        # and its bill is read there (sacct -M)
        "preempt-requeue",
        "slurm",
        ["partition=sqlocal2/ci_h100", "drill=preempt", "drill.preempt.trigger=requeue", "train.steps=20"],
        0,
    ),
    Drill(
        "kill_worker-slurm",
        "slurm",
        ["partition=ci_h100", "drill=kill_worker", "train.checkpoint_interval=5", "train.steps=20"],
        None,
    ),
    # no reference run on Slurm: its windows are minutes (slurmctld checks limits every 30 s) and a
    # reference would double them; a resume after USR2 on Slurm is compared with its reference by
    # preempt-signal-lora and the token-file drill. What only this drill shows is Slurm's own warning and requeue at the limit.
    Drill(
        "timeout-slurm",
        "slurm",
        ["partition=ci_h200", "drill=timeout", "drill.reference=false"],
        0,
        timed=True,
    ),
]
TIMED_DRILL_S = 2400  # a time-out drill on a machine loaded enough to need 4-minute attempts
STEP_FLOOR_S = 0.25  # a paced step; the tiny model's compute in about 12 ms idle (42,083 tokens/s of 512)


@dataclass(frozen=True)
class Pace:
    """How fast the job runs now, for the tiny model on 2 ZeRO-2 ranks."""

    startup_s: float  # the job's startup: process start to a trainer ready to step
    step_s: float  # the job's productive seconds per optimizer step (unpaced; under STEP_FLOOR_S)


FACTOR = 1.1  # a run this many first windows long, at the longest the first window can be


def timed_overrides(launcher: str, pace: Pace) -> list[str]:
    """A time-out drill sized by time: a time limit long enough for most attempts to train
    after they start, and a run that outlasts the first attempt's warning (so the run itself,
    not only its resumable reference run, is interrupted), whatever the speed.

    The local executor sends the warning on time; Slurm checks time limits periodically and
    sends it early or late: measured here with a 2-minute limit, 53 s early with a 30 s delay,
    7 s late with 60 s. Allow a minute early and 10 s late.

    The steps: FACTOR x the longest the first window can be (the latest warning, a start-up of
    0 s), at the paced step: a paced run never steps faster than its floor, so however fast the
    machine runs it outlasts its first window (unpaced, sized from the pace of a minute before,
    a run once ended unwarned). Slower than the floor (a loaded machine), it takes more
    attempts, which the drill allows. Local: the run and its unpaced reference fit in two or
    three attempts; Slurm (no reference): two or three as the warning comes."""
    slurm = launcher == "slurm"
    delay_s, early_s, late_s = (30, 60, 10) if slurm else (20, 0, 2)
    # the median warning leaves 10 s of training after a startup 1.5 x the one measured
    limit_min = math.ceil((delay_s + early_s / 2 + 1.5 * pace.startup_s + 10) / 60)
    window_s = 60 * limit_min - delay_s + late_s
    return [
        f"drill.timeout.time_limit_min={limit_min}",
        f"drill.timeout.signal_delay_s={delay_s}",
        f"drill.timeout.step_floor_s={STEP_FLOOR_S}",
        # a run that ends before the first warning is no drill
        f"train.steps={math.ceil(FACTOR * window_s / STEP_FLOOR_S)}",
        # attempts that start too late to train are only slower; submitit's local controller
        # requeues 6 times at most
        f"launcher.max_num_timeout={25 if slurm else 6}",
    ]


@pytest.fixture
def pace(tmp_path_factory: pytest.TempPathFactory) -> Pace:
    """Measured now, under the machine's present load, by the job itself: a local point of the
    drills' shape trains 40 steps, unpaced; its startup and productive seconds per step, from
    MLflow. Measured again before each drill: under `make test` another stream loads the machine,
    and once the Slurm drill's steps took 1.8 x the pace measured ten minutes before it."""
    folder = tmp_path_factory.mktemp("pace")
    uri = f"sqlite:///{folder / 'mlruns.db'}"
    args = ["sweep", "--sweep", "smoke", "--launcher", "local", "--wait", f"runs_dir={folder / 'runs'}"]
    args += [f"tracking.uri={uri}", *TINY, "train.checkpoint_interval=0", "train.steps=40"]
    res = qualify(args, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = point_runs(uri)
    m = run.data.metrics
    measured = Pace(m["time/startup_s"], m["time/productive_s"] / m["train/steps_done"])
    print(f"pace: {measured}")
    return measured


def run_drill(d: Drill, tmp_path: Path, pace: Pace | None = None) -> tuple[dict, dict, dict]:
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    overrides = list(d.overrides)
    if d.launcher == "slurm" and not any(o.startswith("parallelism.gpus_per_node=") for o in overrides):
        overrides.append("parallelism.gpus_per_node=2")  # 2 CPU ranks of a fake node's 4 GRES
    if d.timed:
        assert pace is not None
        overrides += timed_overrides(d.launcher, pace)
    args = [
        "sweep",
        "--sweep",
        "smoke",
        "--launcher",
        d.launcher,
        "--wait",
        f"runs_dir={tmp_path / 'runs'}",
        f"tracking.uri={uri}",
        *TINY,
        *overrides,
    ]
    res = qualify(args, timeout=TIMED_DRILL_S if d.timed else 900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = point_runs(uri)
    (point_dir,) = list((tmp_path / "runs").glob("*/points/*"))
    attempts = json.loads((point_dir / "attempts.json").read_text())
    info = {
        "attempts": attempts,
        "stdout": res.stdout,
        "overrides": overrides,
        "pace": pace,
        "point": point_dir,
    }
    return run.data.tags, run.data.metrics, info


def check(d: Drill, tags: dict, m: dict, info: dict) -> None:
    assert tags["sq.outcome"] == "accepted", (
        tags.get("sq.reason"),
        tags.get("sq.reason_detail"),
        info["stdout"][-2000:],
    )
    if "drill.reference=false" in d.overrides:
        assert "no reference run (drill.reference=false)" in tags["sq.reason_detail"], tags
    else:
        assert "losses equal the uninterrupted reference (tolerance 0.0)" in tags["sq.reason_detail"]
    assert m["run/attempts"] >= d.min_attempts
    steps = int(d.value("train.steps", info["overrides"]))
    assert m["train/steps_done"] == steps
    parts = [m[k] for k in RESTART_PARTS]
    assert all(p >= 0 for p in parts), dict(zip(RESTART_PARTS, parts, strict=True))
    # the requeue gap measured independently: the stopped attempt's own exit time (its record)
    # against the next attempt's process start (the next record), not from the parts' sum. The
    # breakdown is logged by an attempt that reached an optimizer step after resuming: the last
    # attempt that trained (a time-out drill's last attempt can resume at the final step)
    records = info["attempts"]
    pairs = [(b, a) for b, a in zip(records, records[1:], strict=False) if a["end_step"] > b["end_step"]]
    before, after = pairs[-1]
    assert m["restart/exit_to_start_s"] == pytest.approx(max(0.0, after["start"] - before["end"]), abs=0.01)
    assert m["restart/total_s"] >= m["restart/exit_to_start_s"] + m["restart/start_to_ready_s"]
    assert m["cost/usd_labor"] == 0.0, "a drill that recovered by itself needed nobody"
    if d.launcher == "slurm":
        _check_sacct_billing(tags, m)
    expected_lost = d.lost_steps
    if expected_lost is None:  # a killed worker loses the steps since its last committed checkpoint
        killed, resumed = info["attempts"][0], info["attempts"][1]
        interval = int(d.value("train.checkpoint_interval"))
        # the last interval save the survivors saw committed; a background save still writing
        # when the worker died is not one (under load it can lag a few intervals)
        saved = killed.get("saved_step", 0)
        assert saved >= interval and saved % interval == 0 and saved <= killed["end_step"], killed
        assert resumed["loaded_step"] == saved, (killed, resumed)  # resumed from exactly that one
        expected_lost = killed["end_step"] - saved
    assert m["restart/lost_steps"] == expected_lost
    assert m["time/goodput"] > 0
    stops = [a.get("stop") for a in info["attempts"][:-1]]
    expected = {"preempt": "preempt", "kill_worker": "peer_failure", "timeout": "timeout"}[
        d.name.split("-")[0]
    ]
    if "requeue" in d.name:
        expected = "terminated"  # scontrol requeue sends SIGTERM: save, and Slurm requeues
    assert set(stops) == {expected}, stops
    if d.timed:  # the warning came while the run trained, not only in its reference
        assert info["attempts"][0]["end_step"] < steps, (info["attempts"][0], info["pace"], info["overrides"])
    if d.launcher == "local":
        check_accounting(d, m, tags, info["attempts"], info["point"])
    check_probes(expected, tags, m, info["point"])


def check_probes(stop: str, tags: dict, m: dict, point_dir: Path) -> None:
    """The restart measured its node probes again after a peer failure, and otherwise reused
    those of the attempt that measured them, on the same nodes (local: one machine; Slurm: the
    requeue may land elsewhere, then it measures): the figures MLflow has are the record's."""
    record = json.loads((point_dir / "probes.json").read_text())
    if stop == "peer_failure":
        assert tags["sq.probes"] == "measured", tags["sq.probes"]
    elif tags.get("sq.launcher") == "local":
        assert tags["sq.probes"].startswith(f"reused from attempt {record['attempt']}, "), tags["sq.probes"]
    if tags["sq.probes"].startswith("reused"):
        assert record["attempt"] < m["run/attempts"] - 1 and record["metrics"], record
        for key, value in record["metrics"].items():
            assert m[key] == pytest.approx(value, rel=1e-6), (key, m[key], value)


PRICE_LOCAL = 0.05  # conf/partition/local.yaml, USD per rank-hour
STORAGE_USD_PER_GB_MONTH = 0.023  # conf/cost/default.yaml (retention 30 days)


def kept_on_disk(point_dir: Path) -> tuple[int, int]:
    """The checkpoint folders the point kept and the bytes of their files, counted by hand
    (`find checkpoints/step* -type f -printf %s`), not through the code's keep_last rule."""
    import subprocess

    dirs = sorted(str(p) for p in (point_dir / "checkpoints").glob("step*"))
    if not dirs:
        return 0, 0
    out = subprocess.run(
        ["find", *dirs, "-type", "f", "-printf", "%s\\n"], capture_output=True, text=True, check=True
    ).stdout
    return len(dirs), sum(int(n) for n in out.split())


def check_accounting(d: Drill, m: dict, tags: dict, attempts: list[dict], point_dir: Path) -> None:
    """The point's attempts, goodput and cost by hand from its attempt records (process clock:
    no Slurm here, and the tag says so)."""
    assert m["run/attempts"] == len(attempts)  # one record per attempt, whatever the ranks
    if d.name.startswith("kill_worker"):
        assert len(attempts) == 2, attempts  # the killed attempt and the one that finished
        assert [a["ranks"] for a in attempts] == [4, 4]
    assert tags["sq.allocated_source"] == "process_clock"
    allocated = sum(a["allocated_s"] for a in attempts)
    productive = sum(a["productive_s"] - a.get("lost_s", 0.0) for a in attempts)
    assert m["time/allocated_s"] == pytest.approx(allocated, rel=1e-9)
    assert m["time/goodput"] == pytest.approx(productive / allocated, rel=1e-9)
    # ranks x hours x price, + the checkpoints on disk at the end stored 30 of 30 days; no
    # egress, orchestration or labor (the requeues recovered by themselves)
    compute = sum(a["ranks"] * a["allocated_s"] / 3600 * PRICE_LOCAL for a in attempts)
    folders, stored = kept_on_disk(point_dir)
    assert folders >= 1 and stored > 0, f"no checkpoint kept in {point_dir}"
    storage = STORAGE_USD_PER_GB_MONTH * stored / 1e9
    assert m["cost/usd_storage"] == pytest.approx(storage, rel=1e-9)
    assert m["cost/usd_compute"] == pytest.approx(compute, rel=1e-9)
    assert m["cost/usd_run"] == pytest.approx(compute + storage, rel=1e-9)


def _check_sacct_billing(tags: dict, m: dict) -> None:
    """On Slurm the point is billed sacct's Elapsed x AllocTRES GPUs of every allocation of its
    job, requeues included, read as the point ended."""
    import subprocess

    assert tags["sq.allocated_source"] == "sacct_final"  # re-read by the login node after the end
    on = ["-M", tags["sq.cluster"]]  # the cluster the run says it ran on: sacct -M checks that too
    out = subprocess.run(
        ["sacct", *on, "-D", "-X", "-n", "-P", "-o", "ElapsedRaw,AllocTRES", "-j", tags["sq.slurm_job_id"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    rows = [
        (int(e), dict(kv.split("=", 1) for kv in tres.split(","))) for e, tres in (x.split("|") for x in out)
    ]
    assert len(rows) >= 2, rows  # the requeue is an allocation of its own
    gpu_s = [e * int(t["gres/gpu"]) for e, t in rows]
    gpus = int(rows[-1][1]["gres/gpu"])
    billed = m["cost/gpu_hours"] * 3600
    assert abs(billed - sum(gpu_s)) <= len(rows) * gpus, (billed, gpu_s)  # within 1 s per attempt
    assert m["time/allocated_s"] == pytest.approx(sum(e for e, _ in rows), abs=len(rows))
    # the queue wait of the last allocation (the latest point of time/queue_wait_s), by hand
    # from sacct's own Eligible and Start
    from datetime import datetime

    last = subprocess.run(
        ["sacct", *on, "-D", "-X", "-n", "-P", "-o", "Eligible,Start", "-j", tags["sq.slurm_job_id"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[-1]
    eligible, start = (datetime.fromisoformat(t) for t in last.split("|"))
    assert m["time/queue_wait_s"] == pytest.approx((start - eligible).total_seconds(), abs=0.5)


def _params(launcher: str) -> list:
    """The drills of a launcher, the timed ones marked `paced`."""
    return [
        pytest.param(d, marks=pytest.mark.paced) if d.timed else d for d in DRILLS if d.launcher == launcher
    ]


@pytest.mark.slow
@pytest.mark.timeout(TIMED_DRILL_S + 300)
@pytest.mark.parametrize("d", _params("local"), ids=lambda d: d.name)
def test_drill_local(d: Drill, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    check(d, *run_drill(d, tmp_path, request.getfixturevalue("pace") if d.timed else None))


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(TIMED_DRILL_S + 300)
@pytest.mark.parametrize("d", _params("slurm"), ids=lambda d: d.name)
def test_drill_slurm(d: Drill, tmp_path: Path, slurm_cluster: None, request: pytest.FixtureRequest) -> None:
    check(d, *run_drill(d, tmp_path, request.getfixturevalue("pace") if d.timed else None))


RESHAPE_PARTS = ["reshape/convert_s", "reshape/start_to_ready_s", "reshape/load_s", "reshape/first_step_s"]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def test_reshape_resumes_on_fewer_ranks_through_a_universal_checkpoint(
    launcher: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """2 ranks save at step 10; the checkpoint is converted to a universal one and 1 rank goes
    on to step 20 with the same global batch. Every loss matches the 2-rank reference run,
    the resumed run's own final round trip verifies, and the reshape's times are logged."""
    if launcher == "slurm":
        request.getfixturevalue("slurm_cluster")
    d = Drill(
        f"reshape-{launcher}",
        launcher,
        [*(["partition=ci_a100"] if launcher == "slurm" else []), "drill=reshape", "train.steps=20"],
        0,
    )
    tags, m, info = run_drill(d, tmp_path)
    assert tags["sq.outcome"] == "accepted", (tags.get("sq.reason_detail"), info["stdout"][-2000:])
    assert tags["sq.reason_detail"].startswith("resumed on 1 of 2 rank(s) from step 10 through a universal")
    assert "20 losses equal the uninterrupted reference" in tags["sq.reason_detail"]
    assert m["reshape/world_size"] == 1 and m["reshape/from_step"] == 10 and m["train/steps_done"] == 20
    assert m["reshape/max_loss_diff"] <= 1e-4 and m["ckpt/verified"] == 1.0
    parts = [m[k] for k in RESHAPE_PARTS]
    assert all(p > 0 for p in parts) and sum(parts) <= m["reshape/total_s"], (parts, m["reshape/total_s"])
    (point_dir,) = list((tmp_path / "runs").glob("*/points/*"))
    resumed = json.loads((point_dir / "reshape" / "resumed.json").read_text())
    assert sorted(int(s) for s in resumed["losses"]) == list(range(11, 21))
    assert (point_dir / "universal" / "step00000010" / "zero").is_dir()


@pytest.mark.slow
@pytest.mark.slurm
def test_preempt_drill_on_a_token_file_resumes_with_every_loss_equal_to_its_reference(
    tmp_path: Path, slurm_cluster: None
) -> None:
    """The acceptance drill of issue #12: data=tokens on the local Slurm (2 ranks, 2 loader
    workers each), preempted at step 10 (USR2), requeued and resumed; every loss equals the
    uninterrupted reference run's, the point is accepted on its target eval loss, and the data
    path and the target are logged."""
    tokens = learnable_tokens(tmp_path / "train.bin", 60_000)
    d = Drill(
        "preempt-tokens",
        "slurm",
        [
            "partition=ci_a100",
            "drill=preempt",
            "drill.preempt.trigger=signal",
            "train.steps=20",
            "data=tokens",
            f"data.path={tokens}",
        ],
        0,
    )
    tags, m, info = run_drill(d, tmp_path)
    check(d, tags, m, info)
    assert tags[K.TAG_DATA] == f"tokens:{tokens}" and "reached eval loss" in tags["sq.reason_detail"]
    assert tags[K.TAG_CANDIDATE].endswith("-tokens"), "real data is its own candidate"
    assert m[K.TARGET_STEPS] in (10, 20) and m[K.EVAL_FIRST_LOSS] > m[K.EVAL_FINAL_LOSS]
    assert m[K.TARGET_EVAL_LOSS] == pytest.approx(0.9 * m[K.EVAL_FIRST_LOSS])
    assert m[K.TARGET_TIME_S] == pytest.approx(m[K.TARGET_STEPS] * m[K.PERF_STEP_P50_S])
    assert m[K.TARGET_USD] == pytest.approx(m[K.TARGET_TIME_S] * 2 / 3600 * m[K.COST_PRICE_USD_PER_GPU_HOUR])
    assert m[K.DATA_READ_TOKENS_PER_S] > 0 and m[K.DATA_READ_MB_PER_S] > 0 and 0 <= m[K.DATA_WAIT_FRAC] < 1
    assert m[K.DATA_TRAIN_TOKENS] == 54_000 and m[K.DATA_EVAL_TOKENS] == 6_000
    from mlflow.tracking import MlflowClient

    (run,) = point_runs(f"sqlite:///{tmp_path / 'mlruns.db'}")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    evals = client.get_metric_history(run.info.run_id, K.EVAL_LOSS)
    assert sorted({e.step for e in evals}) == [0, 10, 20], "evaluated before step 1, at 10, after the last"
    assert len({e.step for e in client.get_metric_history(run.info.run_id, K.DATA_WAIT_S)}) == 20
