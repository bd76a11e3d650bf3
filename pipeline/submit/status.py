"""Where a sweep stands, from its manifest, its points' outcome files and Slurm's accounting:
survives a closed terminal, needs no MLflow, and records points whose job died silently."""

from __future__ import annotations

import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.job.pointdir import PointDir, read_json
from pipeline.submit.manifest import (
    MANIFEST,
    PARENT_LEDGER,
    Manifest,
    PointEntry,
    finish_parent_run,
    log_manifest,
    parent_status,
    parent_tracker,
    slurm_job_name,
)
from pipeline.tracking import keys as K
from pipeline.tracking import store
from pipeline.tracking.ledger import Tracker

if TYPE_CHECKING:
    from pipeline.slurm.cluster import JobState

FINAL = ("accepted", "failed")
# Slurm states of a job that will not run again, and the reason a point gets when its job
# ended in one of them without writing an outcome
SLURM_ENDED = {
    "COMPLETED": K.REASON_CRASH,
    "FAILED": K.REASON_CRASH,
    "CANCELLED": K.REASON_CRASH,
    "TIMEOUT": K.REASON_TIMEOUT,
    "DEADLINE": K.REASON_TIMEOUT,
    "NODE_FAIL": K.REASON_CRASH,
    "BOOT_FAIL": K.REASON_CRASH,
    "OUT_OF_MEMORY": K.REASON_OOM,
    "PREEMPTED": K.REASON_PREEMPT_CANCELLED,
}
SLURM_RUNNING = ("RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT")
# a job's outcome file may reach a shared file system a little after the job ends: wait
# this long after the end before calling the point lost
LOST_GRACE_S = 5.0


def read_outcome(entry: PointEntry) -> dict[str, Any] | None:
    return PointDir(entry.point_dir).read_outcome()


def record_lost_point(
    entry: PointEntry,
    detail: str,
    tracking_uri: str | None = None,
    parent: str | None = None,
    reason: str = K.REASON_CRASH,
    experiment: str | None = None,
    sweep_id: str = "",
) -> dict[str, Any]:
    """A job that ended without an outcome (killed, cancelled, node failure): failed with
    `reason`, written to the point's outcome file and, when MLflow answers, to its run."""
    summary = {
        "point_id": entry.point_id,
        "candidate": entry.candidate,
        "outcome": K.OUTCOME_FAILED,
        "reason": reason,
        "detail": detail,
        "metrics": {},
    }
    point = PointDir(entry.point_dir)
    point.write_outcome(summary)
    meta = read_json(point.tracking / "tracker.json") or {}
    uri = tracking_uri or meta.get("uri")
    if uri:
        try:
            exp = experiment or meta.get("experiment", "slurm-qualify")
            _mark_run_failed(uri, exp, sweep_id, entry, point, parent, detail, reason)
        except Exception as e:  # status must work without MLflow
            print(f"[status] could not record {entry.point_id} in MLflow: {e}", file=sys.stderr)
    return summary


def _mark_run_failed(
    uri: str,
    experiment: str,
    sweep_id: str,
    entry: PointEntry,
    point: PointDir,
    parent: str | None,
    detail: str,
    reason: str,
) -> None:
    tags = {
        K.TAG_PARENT_KIND: "point",
        **({K.TAG_SWEEP_ID: sweep_id} if sweep_id else {}),
        K.TAG_POINT_ID: entry.point_id,
        K.TAG_CANDIDATE: entry.candidate,
        K.TAG_PARTITION: entry.partition,
        K.TAG_DRILLS: entry.drills,
        K.TAG_OUTCOME: K.OUTCOME_FAILED,
        K.TAG_REASON: reason,
        K.TAG_REASON_DETAIL: detail,
    }
    # through the point's ledger: into the job's run if it made one, kept for `qualify sync`
    # when MLflow does not answer
    tracker = Tracker(
        uri,
        experiment,
        point.tracking,
        run_name=entry.point_id,
        parent_run_id=parent,
        parent_dir=point.path.parent.parent / PARENT_LEDGER,
        background=False,
    )
    tracker.set_tags(tags)
    tracker.close("FAILED")


@dataclass
class PointState:
    entry: PointEntry
    state: str  # pending | running | accepted | failed | unknown
    outcome: dict[str, Any] | None


def point_states(m: Manifest) -> list[PointState]:
    """State of every point: its outcome file if it has one, else its Slurm job's state; a
    job that ended without an outcome is recorded as failed (file and MLflow) here."""
    slurm: dict[str, JobState] = {}
    if m.launcher == "slurm":
        from pipeline.slurm.cluster import job_states

        slurm = job_states([p.job_id for p in m.points if p.job_id], job_name=slurm_job_name(m.sweep_id))
    states = []
    for entry in m.points:
        outcome = read_outcome(entry)
        if outcome is not None:
            states.append(PointState(entry, outcome["outcome"], outcome))
            continue
        js = slurm.get(entry.job_id)
        s = js.state if js else ""
        ended = s in SLURM_ENDED and (js is not None and (js.ended_s_ago or 0.0) >= LOST_GRACE_S)
        if ended and read_outcome(entry) is None:
            # the job ended without writing an outcome: that is a result too
            outcome = record_lost_point(
                entry,
                f"Slurm job {entry.job_id} ended {s} without an outcome",
                m.tracking_uri,
                m.parent_run_id,
                reason=SLURM_ENDED[s],
                experiment=m.experiment,
                sweep_id=m.sweep_id,
            )
            states.append(PointState(entry, K.OUTCOME_FAILED, outcome))
        elif ended:
            outcome = read_outcome(entry)
            assert outcome is not None
            states.append(PointState(entry, outcome["outcome"], outcome))
        elif s in SLURM_RUNNING or s in SLURM_ENDED:  # ended a moment ago: its outcome may follow
            states.append(PointState(entry, "running", None))
        elif s:
            states.append(PointState(entry, "pending", None))
        else:
            states.append(PointState(entry, "pending" if m.launcher == "slurm" else "unknown", None))
    return states


def bar(done: int, total: int, width: int = 24) -> str:
    filled = int(width * done / total) if total else width
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"


def status_table(m: Manifest, states: list[PointState]) -> str:
    by_part: dict[str, Counter[str]] = defaultdict(Counter)
    for s in states:
        by_part[s.entry.partition][s.state] += 1
    cols = ("pending", "running", "accepted", "failed")
    lines = [f"sweep {m.sweep_id} ({m.sweep}, {m.launcher}): {len(states)} points", ""]
    lines.append(f"{'partition':<12}" + "".join(f"{c:>10}" for c in cols) + "  progress")
    for part in sorted(by_part):
        c = by_part[part]
        total = sum(c.values())
        lines.append(
            f"{part:<12}"
            + "".join(f"{c[k]:>10}" for k in cols)
            + "  "
            + bar(c["accepted"] + c["failed"], total)
        )
    done = sum(s.state in FINAL for s in states)
    lines += ["", "all     " + bar(done, len(states))]
    return "\n".join(lines)


def fmt(value: Any, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def summary_table(states: list[PointState]) -> str:
    """One line per point with the numbers a reviewer looks at first."""
    head = f"{'point':<46} {'outcome':<9} {'reason':<22} {'tok/s':>9} {'p50 s':>8} {'CV':>6} {'MFU*':>6} {'peak GiB':>8} {'save s':>7} {'load s':>7} {'verified':>8}"
    lines = [head, "-" * len(head)]
    for s in states:
        mt = (s.outcome or {}).get("metrics", {})
        lines.append(
            f"{s.entry.point_id[:46]:<46} {s.state:<9} {(s.outcome or {}).get('reason', '')[:22]:<22} "
            f"{fmt(mt.get(K.PERF_TOKENS_PER_S), '.0f'):>9} {fmt(mt.get(K.PERF_STEP_P50_S), '.4f'):>8} "
            f"{fmt(mt.get(K.PERF_STEP_CV), '.2f'):>6} {fmt(mt.get(K.PERF_MFU_VS_CEILING), '.2f'):>6} "
            f"{fmt(mt.get(K.MEM_PEAK_ALLOCATED_GIB, mt.get(K.MEM_PEAK_RSS_GIB)), '.2f'):>8} "
            f"{fmt(mt.get(K.CKPT_SAVE_S), '.3f'):>7} {fmt(mt.get(K.CKPT_LOAD_S), '.3f'):>7} "
            f"{('yes' if mt.get(K.CKPT_VERIFIED) == 1.0 else 'no' if K.CKPT_VERIFIED in mt else '-'):>8}"
        )
    lines.append(
        "MFU* = model FLOP/s over the measured matmul ceiling (catalog MFU is in MLflow for GPU runs)."
    )
    return "\n".join(lines)


def watch(sweep_dir: Path, follow: bool, interval_s: float = 5.0, out: Any = None) -> list[PointState]:
    """Print the table; with follow, redraw until every point is accepted or failed (and, on
    Slurm, until their jobs ended and were billed from sacct, for at most BILL_WAIT_S). `out`:
    a stream, default the sys.stdout of the call (not of the import)."""
    out = sys.stdout if out is None else out
    done_at: float | None = None
    while True:
        m = Manifest.read(sweep_dir)
        if m.error:  # submission failed: nothing of this sweep runs
            out.write(f"sweep {m.sweep_id} was not submitted: {m.error}\n")
            out.flush()
            return []
        states = point_states(m)
        text = status_table(m, states)
        done = all(s.state in FINAL for s in states)
        if follow and out.isatty():
            out.write("\033[2J\033[H")
        out.write(text + "\n")
        out.flush()
        if done and m.launcher == "slurm":
            done_at = done_at or time.monotonic()
            if _bill(m) and follow and time.monotonic() - done_at < BILL_WAIT_S:
                time.sleep(min(interval_s, 2.0))  # a job still tearing down: bill it once it ended
                continue
            _close_parent(m, sweep_dir)
        if done or not follow:
            return states
        time.sleep(interval_s)


BILL_WAIT_S = 120.0  # how long a following watch waits for ended points' jobs to leave Slurm


def _bill(m: Manifest) -> int:
    """Bill the ended Slurm points from sacct's final figures; how many jobs have not ended."""
    from pipeline.slurm.cluster import job_states
    from pipeline.submit.billing import bill_ended_points

    ids = [p.job_id for p in m.points if p.job_id]
    return bill_ended_points(m, job_states(ids, job_name=slurm_job_name(m.sweep_id)))


def _close_parent(m: Manifest, sweep_dir: Path) -> None:
    """End a Slurm sweep's parent run once every point has its outcome (through its ledger:
    kept there when MLflow does not answer, sent by `qualify sync`)."""
    marker = sweep_dir / ".parent_closed"
    if marker.exists():
        return
    try:
        # one bounded probe: a dead server must not hold `status` through three MLflow calls
        tracker = parent_tracker(m, sweep_dir, offline=store.unreachable(m.tracking_uri) is not None)
        log_manifest(m, sweep_dir / MANIFEST, tracker)
        finish_parent_run(m, tracker)
        marker.write_text("")
    except Exception as e:
        print(f"[status] could not close the parent run: {e}", file=sys.stderr)


def final_status(ledger_dir: Path) -> str | None:
    """The status a run ends with after `qualify sync`: a point's from its outcome file
    (FINISHED when accepted, else FAILED), the sweep's parent from its manifest; None while
    the point or the sweep still runs."""
    folder = Path(ledger_dir).parent
    if (folder / MANIFEST).exists():
        return parent_status(folder)
    outcome = PointDir(folder).read_outcome()
    if outcome is None:
        return None
    return "FINISHED" if outcome.get("outcome") == K.OUTCOME_ACCEPTED else "FAILED"
