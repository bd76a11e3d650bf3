"""Failure drills end to end, through the real CLI: each one interrupts a real run, the job is
requeued and resumes, every step's loss equals an uninterrupted reference run, and the
restart-time breakdown in MLflow adds up to its total.

Integration tests as data (torchtitan's OverrideDefinitions): a name, the launcher, the
overrides, and the lost steps expected."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import point_runs, qualify

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


TINY = ["model=tiny", "precision=fp32", "parallelism=zero2", "train.measure_comm=false"]
DRILLS = [
    Drill("preempt-local", "local", ["drill=preempt", "drill.preempt.trigger=local", "train.steps=20"], 0),
    Drill(
        "kill_worker-local",
        "local",
        ["drill=kill_worker", "train.checkpoint_interval=5", "train.steps=20"],
        None,
    ),
    Drill(
        "timeout-local",
        "local",
        [
            "drill=timeout",
            "drill.timeout.time_limit_min=1",
            "drill.timeout.signal_delay_s=30",
            "train.steps=3500",
            "launcher.max_num_timeout=6",
            "train.checkpoint_interval=0",
        ],
        0,
    ),
    Drill(
        "preempt-signal",
        "slurm",
        ["partition=a100", "drill=preempt", "drill.preempt.trigger=signal", "train.steps=20"],
        0,
    ),
    Drill(  # an adapter checkpoint (LoRA weights and their optimizer state) resumes bit-exact
        "preempt-signal-lora",
        "slurm",
        [
            "partition=h100",
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
        ["partition=a100", "drill=preempt", "drill.preempt.trigger=urgent", "train.steps=20"],
        0,
    ),
    Drill(
        "preempt-requeue",
        "slurm",
        ["partition=h100", "drill=preempt", "drill.preempt.trigger=requeue", "train.steps=20"],
        0,
    ),
    Drill(
        "kill_worker-slurm",
        "slurm",
        ["partition=h100", "drill=kill_worker", "train.checkpoint_interval=5", "train.steps=20"],
        None,
    ),
    Drill(
        "timeout-slurm",
        "slurm",
        # Slurm may send the warning up to a minute off (its event resolution): with a
        # 2-minute limit, a 60 s delay and a run of about 110 s, the run itself (not only its
        # resumable reference run) is interrupted at least once
        [
            "partition=h200",
            "drill=timeout",
            "drill.timeout.time_limit_min=2",
            "drill.timeout.signal_delay_s=60",
            "train.steps=9000",
            "launcher.max_num_timeout=8",
        ],
        0,
    ),
]


def run_drill(d: Drill, tmp_path: Path) -> tuple[dict, dict, dict]:
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
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
        *d.overrides,
    ]
    res = qualify(args, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = point_runs(uri)
    (point_dir,) = list((tmp_path / "runs").glob("*/points/*"))
    attempts = json.loads((point_dir / "attempts.json").read_text())
    return run.data.tags, run.data.metrics, {"attempts": attempts, "stdout": res.stdout}


def check(d: Drill, tags: dict, m: dict, info: dict) -> None:
    assert tags["sq.outcome"] == "accepted", (
        tags.get("sq.reason"),
        tags.get("sq.reason_detail"),
        info["stdout"][-2000:],
    )
    assert "losses equal the uninterrupted reference (tolerance 0.0)" in tags["sq.reason_detail"]
    assert m["run/attempts"] >= d.min_attempts
    assert m["train/steps_done"] == int(
        next(o for o in d.overrides if o.startswith("train.steps=")).split("=")[1]
    )
    parts = [m[k] for k in RESTART_PARTS]
    assert all(p >= 0 for p in parts), dict(zip(RESTART_PARTS, parts, strict=True))
    assert abs(sum(parts) - m["restart/total_s"]) < 1.0, "the restart parts must add up to the total"
    expected_lost = d.lost_steps
    if expected_lost is None:  # a killed worker loses the steps since the last interval checkpoint
        killed_at = info["attempts"][0]["end_step"]
        interval = int(
            next(o for o in d.overrides if o.startswith("train.checkpoint_interval=")).split("=")[1]
        )
        expected_lost = killed_at - killed_at // interval * interval
        assert expected_lost < interval
    assert m["restart/lost_steps"] == expected_lost
    assert m["time/goodput"] > 0
    stops = [a.get("stop") for a in info["attempts"][:-1]]
    expected = {"preempt": "preempt", "kill_worker": "peer_failure", "timeout": "timeout"}[
        d.name.split("-")[0]
    ]
    if "requeue" in d.name:
        expected = "terminated"  # scontrol requeue sends SIGTERM: save, and Slurm requeues
    assert set(stops) == {expected}, stops


@pytest.mark.slow
@pytest.mark.parametrize("d", [d for d in DRILLS if d.launcher == "local"], ids=lambda d: d.name)
def test_drill_local(d: Drill, tmp_path: Path) -> None:
    check(d, *run_drill(d, tmp_path))


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.parametrize("d", [d for d in DRILLS if d.launcher == "slurm"], ids=lambda d: d.name)
def test_drill_slurm(d: Drill, tmp_path: Path, slurm_cluster: None) -> None:
    check(d, *run_drill(d, tmp_path))


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
        [*(["partition=a100"] if launcher == "slurm" else []), "drill=reshape", "train.steps=20"],
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
