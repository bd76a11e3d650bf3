"""sweep.adaptive on the local Slurm (cluster/cluster.sh up), as a user runs it: `qualify sweep`
queues round 1 and a controller job and returns; the controllers submit the next rounds. The
first controller is scancel'd in the middle of its submission of round 2 (its arrays queued
held, their ids not yet recorded: SQ_CONTROLLER_PAUSE holds it there); `qualify resume`
completes that submission once (the held orphans cancelled, never run). A `qualify cancel` in
round 2 leaves nothing in squeue (the controller included); `qualify resume` finishes the sweep
without running round 1 again; the rounds end with the full grid's winner, having spent fewer
GPU-hours (sacct's) than the full grid.

Three candidates (conf/sweep/slurm_ci_adaptive.yaml): two tiny ZeRO-2 points on the same CPUs
(a tie in step time, so the rounds go on; ci_a100's price is 0.6 of ci_h100's, so the full grid
picks it by cost) and one with 16x the tokens per step, out after round 2 (the preset's
sweep.min_repeats=2: one run of each twin can measure them apart). sweep.repeats=4: about 4
minutes beside the rest of CI on 2 cores (a job's start-up is most of it).
Run: .venv/bin/python -m pytest tests/integration/test_adaptive_slurm.py
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.contract.sweepdir import SweepDir
from pipeline.sched import sweep_job_name
from pipeline.submit.controller import PAUSE_ENV, SubmitStep
from pipeline.submit.rounds import Ended, controller_job_name, markers
from pipeline.tracking import keys as K
from tests.support.slurm_sweep import manifest_of, qualify, sweep_id_of

ROUNDS_WAIT_S = 420.0  # a round and its controller, on a loaded 2-core machine (1 min idle)


def _ours(sweep_id: str) -> list[str]:
    """squeue's jobs of this sweep: its points' arrays and its controllers (id|name|state|reason)."""
    out = subprocess.run(
        ["squeue", "-h", "-r", "-o", "%i|%j|%T|%r"], capture_output=True, text=True, timeout=10
    )
    return [line for line in out.stdout.splitlines() if f"|sq-{sweep_id}" in line]


def _sacct(job: str) -> list[tuple[str, str]]:
    """sacct's (state, nodes) of every task of a job, the allocations only."""
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job, "-o", "State,NodeList"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return [tuple(line.split("|", 1)) for line in out.stdout.splitlines() if "|" in line]  # type: ignore[misc]


def _cancelled_unstarted(job: str) -> bool:
    tasks = _sacct(job)
    return bool(tasks) and all(s.startswith("CANCELLED") and nodes == "None assigned" for s, nodes in tasks)


def _state(sd: SweepDir, sweep_id: str) -> str:
    """What a person debugging a stuck round reads: the sweep's jobs in squeue and sacct, each
    point's outcome, and the tail of every controller's log."""
    acct = subprocess.run(
        ["sacct", "-n", "-X", "-P", "--name", f"{sweep_job_name(sweep_id)},{controller_job_name(sweep_id)}",
         "-o", "JobID,JobName,State,Elapsed,Reason"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    lines = ["squeue:", *_ours(sweep_id), "sacct:", acct.stdout.strip()]
    for point in sorted((sd.path / "points").glob("p*")):
        out = point / "outcome.json"
        lines.append(
            f"{point.name}: {json.loads(out.read_text())['outcome'] if out.exists() else 'no outcome'}"
        )
    for log in sorted(sd.adaptive.glob("controller-*.out")):
        lines += [f"--- {log.name} (last 40 lines)", *log.read_text(errors="replace").splitlines()[-40:]]
    return "\n".join(lines)


ENDS = ("the rounds to end", "squeue to empty", "the parent run to close", "sacct to record")
"""What the test waits for that may come after the rounds ended."""


def _wait(what: str, ok: Any, sd: SweepDir, sweep_id: str, timeout_s: float = ROUNDS_WAIT_S) -> None:
    """Poll `ok` until it holds; fail at once when a controller ended in error (its log says
    why; nothing would come) or the rounds ended while `what` needs them going on, else after
    `timeout_s`, with the sweep's state either way."""
    deadline = time.monotonic() + timeout_s
    while not ok():
        done = Ended.read(sd)
        assert done is None or what.startswith(ENDS), f"waiting for {what}: {done}\n{_state(sd, sweep_id)}"
        failed = [
            log.name for log in sd.adaptive.glob("controller-*.out")
            if "Traceback (most recent call last)" in log.read_text(errors="replace")
        ]  # fmt: skip
        assert not failed, f"waiting for {what}: controller(s) failed: {failed}\n{_state(sd, sweep_id)}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{_state(sd, sweep_id)}"
        time.sleep(2)


def _round_running(sd: SweepDir, k: int, sweep_id: str) -> bool:
    found = [mk for mk in markers(sd) if mk.round == k and mk.submitted]
    if not found:
        return False
    bases = {j.split("_", 1)[0] for j in found[0].job_ids}
    return any(
        line.split("|")[0].split("_", 1)[0] in bases and "|RUNNING" in line for line in _ours(sweep_id)
    )


def _round_2_paused(runs: Path, uri: str) -> tuple[str, SweepDir, dict[str, str]]:
    """`qualify sweep` of the three candidates, returning at once, and its first controller
    paused in the middle of its submission of round 2: the sweep id, its folder and round 1's
    jobs by point. Round 2 comes by rule (sweep.min_repeats=2 in the preset), not by a tie that
    one run of each twin may not measure."""
    t0 = time.monotonic()
    res = qualify(
        "sweep", "--sweep", "slurm_ci_adaptive", "--launcher", "slurm", f"runs_dir={runs}", f"tracking.uri={uri}",
        "sweep.repeats=4", "train.steps=30", "train.warmup_steps=2", "train.checkpoint_interval=5",
        env={PAUSE_ENV: SubmitStep.ARRAYS_QUEUED.value},  # the first controller only: it submits the next
    )  # fmt: skip
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    assert took < 30, f"qualify sweep took {took:.0f} s: the login node must not wait for the rounds"
    assert "[adaptive] controller job" in res.stdout, res.stdout
    sweep_id = sweep_id_of(res.stdout)
    sd = SweepDir(runs / sweep_id)
    round1 = {p["point_id"]: p["job_id"] for p in manifest_of(sd.path)["points"]}
    assert len(round1) == 3
    paused = sd.controller_paused(SubmitStep.ARRAYS_QUEUED.value)
    _wait("the first controller to queue round 2", paused.exists, sd, sweep_id)
    return sweep_id, sd, round1


@pytest.mark.slurm
@pytest.mark.timeout(1500)  # the waits below fail first, with the sweep's state
def test_adaptive_rounds_run_in_slurm_through_cancel_and_resume(tmp_path: Path, slurm_cluster: None) -> None:
    runs, uri = tmp_path / "runs", f"sqlite:///{tmp_path / 'mlruns.db'}"
    # the first controller, stopped after sbatch queued round 2's arrays (held) and before their
    # ids were recorded, is killed there; resume completes the round: the orphans are cancelled
    sweep_id, sd, round1 = _round_2_paused(runs, uri)
    paused = sd.controller_paused(SubmitStep.ARRAYS_QUEUED.value)
    ctl1 = json.loads(paused.read_text())["job_id"]
    assert ctl1 and markers(sd)[0].controllers == [ctl1]
    known = set(round1.values())
    orphans = {
        ln.split("|")[0].split("_", 1)[0] for ln in _ours(sweep_id) if "held" in ln.split("|")[3].lower()
    }
    orphans -= {ctl1, *known}
    assert orphans, f"no held arrays of round 2 in squeue: {_ours(sweep_id)}"
    subprocess.run(["scancel", ctl1], check=True, timeout=30)
    _wait(
        "the controller to leave squeue",
        lambda: not any(ln.startswith(f"{ctl1}|") for ln in _ours(sweep_id)),
        sd,
        sweep_id,
        60,
    )
    st = qualify("status", "--sweep", sweep_id, "--runs-dir", str(runs))
    assert "round 2's submission did not finish" in st.stdout, st.stdout
    resume = qualify("resume", "--sweep", sweep_id, "--runs-dir", str(runs))
    assert resume.returncode == 0, resume.stdout + resume.stderr
    assert "round 2: its submission is complete" in resume.stdout, resume.stdout
    round2 = markers(sd)[1]
    assert round2.submitted and not {j.split("_", 1)[0] for j in round2.job_ids} & orphans
    for base in orphans:  # cancelled while held: never given a node
        _wait(f"sacct to record {base} cancelled", lambda b=base: _cancelled_unstarted(b), sd, sweep_id, 60)  # type: ignore[misc]

    # cancel in the middle of round 2: nothing of the sweep is left in Slurm
    _wait("round 2 to run", lambda: _round_running(sd, 2, sweep_id), sd, sweep_id)
    cancel = qualify("cancel", "--sweep", sweep_id, "--runs-dir", str(runs))
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert _ours(sweep_id) == [], f"left in squeue after cancel: {_ours(sweep_id)}"
    st = qualify("status", "--sweep", sweep_id, "--runs-dir", str(runs))
    assert "adaptive: round 2 of at most 4" in st.stdout and "stopped by qualify cancel" in st.stdout, (
        st.stdout
    )
    attempts1 = {pid: len(sd.point(pid).attempts()) for pid in round1}

    resume = qualify("resume", "--sweep", sweep_id, "--runs-dir", str(runs))
    assert resume.returncode == 0, resume.stdout + resume.stderr
    assert "queued controller" in resume.stdout, resume.stdout
    _wait("the rounds to end", lambda: Ended.read(sd) is not None, sd, sweep_id, 900)
    _wait("squeue to empty", lambda: not _ours(sweep_id), sd, sweep_id, 120)

    m = manifest_of(sd.path)
    points = m["points"]
    # round 1 never ran again: its points kept their jobs and attempts
    assert {p["point_id"]: p["job_id"] for p in points[:3]} == round1
    assert {pid: len(sd.point(pid).attempts()) for pid in round1} == attempts1
    done = Ended.read(sd)
    assert done is not None and done.rounds >= 2 and len(markers(sd)) == done.rounds
    assert all(mk.submitted for mk in markers(sd)[:-1])
    # each round submitted once: the markers' points are the manifest's, each once, each point's
    # job the one its marker recorded
    planned = [pid for mk in markers(sd) for pid in mk.point_ids]
    assert sorted(planned) == sorted(p["point_id"] for p in points) and len(set(planned)) == len(planned)
    job_of = {p["point_id"]: p["job_id"] for p in points}
    assert all(job_of[pid] in mk.job_ids or mk.round == 2 for mk in markers(sd) for pid in mk.point_ids)
    slow = next(p["candidate"] for p in points if "mb64" in p["candidate"])
    assert slow not in done.contenders and sum(p["candidate"] == slow for p in points) == 2  # min_repeats
    # the winner: the full grid's pick is the candidate with the least step time (each run's p50, averaged); the slow
    # one ran once, the contenders ran every round, so the rounds hold everything the full grid
    # would rank them on
    outcomes = [json.loads((Path(p["point_dir"]) / "outcome.json").read_text()) for p in points]
    assert all(o["outcome"] == "accepted" for o in outcomes), [o.get("reason") for o in outcomes]
    steps: dict[str, list[float]] = {}
    for p, o in zip(points, outcomes, strict=True):
        steps.setdefault(p["candidate"], []).append(o["metrics"][K.PERF_STEP_P50_S])
    fastest = min(steps, key=lambda c: sum(steps[c]) / len(steps[c]))
    assert fastest in done.contenders, (fastest, done.contenders, steps)
    # GPU-hours from sacct's bills, fewer than the full grid (every candidate x 4 at its mean)
    bills = [json.loads((Path(p["point_dir"]) / "billed.json").read_text()) for p in points]
    # the winner: the full grid's pick by cost per accepted run (sacct's bill of each run at its
    # partition's price, over the candidate's runs), by hand, against the report's recommendation
    usd: dict[str, list[float]] = {}
    for p, b in zip(points, bills, strict=True):
        usd.setdefault(p["candidate"], []).append(b[K.COST_USD])
    pick = min(usd, key=lambda c: sum(usd[c]) / len(usd[c]))
    assert "ci_a100" in pick, (pick, usd)
    rep = qualify("report", "--sweep", sweep_id, "--tracking-uri", uri,
                  "--out", str(tmp_path / "rep"), "--no-attach", "--no-tag-runs", timeout=300)  # fmt: skip
    assert rep.returncode == 0, rep.stdout[-3000:] + rep.stderr[-3000:]
    md = "\n".join(f.read_text() for f in (tmp_path / "rep").glob("*.md"))
    assert re.search(rf"tiny: {re.escape(pick)}, ", md), md[:4000]
    assert all(b.get("source") == K.ALLOCATED_SACCT_FINAL for b in bills), bills
    spent = sum(b[K.COST_GPU_HOURS] for b in bills)
    assert done.gpu_hours == pytest.approx(spent, rel=1e-6)
    assert done.full_grid_gpu_hours is not None and done.gpu_hours < done.full_grid_gpu_hours
    assert done.controller_s is not None and done.controller_s > 0
    # the parent run closed after its last child, with why the rounds ended
    _wait("the parent run to close", lambda: sd.parent_closed.exists(), sd, sweep_id, 60)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(m["parent_run_id"])
    assert parent.info.status == "FINISHED", parent.info.status
    assert parent.data.tags[K.TAG_ADAPTIVE] == "4" and parent.data.tags[K.TAG_ADAPTIVE_ENDED] == done.why
    assert parent.data.tags[K.TAG_POINTS] == str(len(points))
    assert float(parent.data.tags[K.TAG_ADAPTIVE_CONTROLLER_S]) == pytest.approx(done.controller_s, abs=1)
    st = qualify("status", "--sweep", sweep_id, "--runs-dir", str(runs))
    assert f"adaptive: ended after round {done.rounds} of at most 4" in st.stdout, st.stdout
    print(f"{done.rounds} rounds, {len(points)} points; {done.line}")
