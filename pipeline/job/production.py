"""`python -m pipeline.job.production <launch folder>` on every rank of `qualify launch`'s
job.sbatch: the project's own trainer at production settings (train.yaml), one MLflow run under
the sweep's parent (tag sq.kind=production), its outcome and restarts recorded like a point's,
requeued from its checkpoint (pipeline.job.entry.run_point does all of that). A smoke run's
rank 0 then writes smoke.md: its measured step time and checkpoint stall against the
projection's inputs (launch.json), and whether they hold."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pipeline import logs
from pipeline.contract.outcome import Outcome
from pipeline.contract.spec import JobSpec
from pipeline.files import write_atomic
from pipeline.measure.launch import SMOKE_TOLERANCE, smoke_checks
from pipeline.tracking import keys as K


def smoke_report(launch: dict[str, Any], summary: dict[str, Any]) -> str:
    """smoke.md from launch.json and the run's end (its metrics: the last attempt's values)."""
    ev, d = launch["evidence"], launch["derived"]
    metrics = summary.get("metrics", {})
    stall = ev["inputs"].get("ckpt_stall_s", [0.0])[0]
    measured_stall = metrics.get(K.CKPT_STALL_S, metrics.get(K.CKPT_SAVE_S))
    checks = smoke_checks(d["step_s"], stall, metrics.get(K.PERF_STEP_P50_S), measured_stall)
    lines = [
        f"# Smoke run of {ev['candidate']}",
        "",
        f"Outcome: {summary.get('outcome')} {summary.get('reason') or ''}".rstrip(),
        f"{d['steps']} steps on {d['nodes']} x {d['per_node']} ranks; the projection's step time at this "
        f"per-GPU batch and its checkpoint stall (launch.json) against what this run measured "
        f"(median step time {K.PERF_STEP_P50_S}; {K.CKPT_STALL_S}, else {K.CKPT_SAVE_S}, of its last save).",
        "",
        "| what | projected | measured | measured / projected | holds |",
        "|---|---|---|---|---|",
    ]
    for c in checks:
        measured = "-" if c.measured is None else f"{c.measured:.4g}"
        ratio = "-" if c.ratio is None else f"{c.ratio:.3f}"
        holds = "not measured" if c.holds is None else ("yes" if c.holds else "NO")
        lines.append(f"| {c.what} | {c.projected:.4g} | {measured} | {ratio} | {holds} |")
    verdict = all(c.holds for c in checks)
    lines += [
        "",
        f"A value holds when measured <= projected x {1 + SMOKE_TOLERANCE:g}. "
        + (
            "The projection's inputs hold: the production job's time and cost stand as WHY.md states them."
            if verdict
            else "The projection's inputs do NOT all hold: its time and cost (WHY.md) are not to be relied on; "
            "qualify again on this partition or launch with the measured figures."
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from pipeline.job.distributed import rank_env_from_environ
    from pipeline.job.entry import run_point

    logs.setup()
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m pipeline.job.production LAUNCH_FOLDER", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    spec = JobSpec(**json.loads((folder / "spec.json").read_text()))
    spec.config_yaml = (folder / "train.yaml").read_text()
    renv = rank_env_from_environ()
    summary = run_point(spec, renv)
    launch = json.loads((folder / "launch.json").read_text())
    if renv.is_main and launch["derived"]["smoke"]:
        report = smoke_report(launch, summary)
        write_atomic(folder / "smoke.md", report)
        print(report, flush=True)
    return 0 if summary["outcome"] == Outcome.ACCEPTED else 1


if __name__ == "__main__":
    raise SystemExit(main())
