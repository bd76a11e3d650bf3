"""Fake finished points of an adaptive sweep: real configs, outcomes and ledgers with known
step times (test_adaptive_rounds, test_adaptive_controller)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.contract.outcome import Outcome
from pipeline.contract.pointdir import PointDir
from pipeline.contract.sweepdir import SweepDir
from pipeline.submit.manifest import PointEntry
from pipeline.tracking import keys as K
from pipeline.tracking.ledger import EventKind, LedgerDir, LedgerEvent
from tests.support.helpers import compose_point_yaml

RNG = np.random.default_rng


def fake_point(
    sweep_dir: Path, index: int, parallelism: str, seed: int, mean_s: float, hours: float
) -> PointEntry:
    cfg, text = compose_point_yaml([f"parallelism={parallelism}", f"train.seed={seed}"])
    from pipeline.config.resolved import candidate_name

    pid = f"p{index:04d}-{candidate_name(cfg).replace('/', '-')}-none"
    point = SweepDir(sweep_dir).point(pid)
    point.path.mkdir(parents=True)
    point.write_inputs(text, [f"parallelism={parallelism}", f"train.seed={seed}"])
    record(point, mean_s, hours, seed)
    return PointEntry(pid, index, [f"parallelism={parallelism}", f"train.seed={seed}"], candidate_name(cfg),
                      "local", "none", str(point.path), "fits")  # fmt: skip


def record(point: PointDir, mean_s: float, hours: float, seed: int) -> None:
    """What a finished job leaves: its outcome and its ledger's step times (known mean, 5% CV)."""
    times = RNG(seed).normal(mean_s, 0.05 * mean_s, 40)
    ledger = LedgerDir(point.tracking)
    ledger.path.mkdir(parents=True, exist_ok=True)
    lines = [
        LedgerEvent(EventKind.METRICS, {K.PERF_STEP_TIME_S: float(t)}, s, 0).to_line()
        for s, t in enumerate(times)
    ]
    lines.append(LedgerEvent(EventKind.METRICS, {K.PERF_WARMUP_STEPS: 3}, None, 0).to_line())
    ledger.ledger.write_text("".join(lines))
    metrics = {K.COST_GPU_HOURS: hours, K.COST_USD: hours * 2}
    point.write_outcome({"point_id": point.path.name, "outcome": Outcome.ACCEPTED, "metrics": metrics})
