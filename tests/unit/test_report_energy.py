"""The report's energy, node-health and straggler table, and the power plot of one run, from
runs logged into a real MLflow store (analysis/energy.py)."""

from __future__ import annotations

from typing import Any

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from analysis import energy
from analysis.runs import RunRecord
from analysis.table import Row
from pipeline.contract.outcome import Outcome
from pipeline.tracking import keys as K


def _run(
    i: int, outcome: str, metrics: dict[str, float], tags: dict[str, str], price: str | None
) -> RunRecord:
    params = (
        {"cost.electricity_usd_per_kwh": price}
        if price is not None
        else {"cost.electricity_usd_per_kwh": "None"}
    )
    return RunRecord(f"r{i}", f"p{i}", "FINISHED", 0, {K.TAG_OUTCOME: outcome, **tags}, params, metrics)


def _row(runs: list[RunRecord]) -> Row:
    row = Row("h100/tiny/fp32/zero2", "h100", "tiny", "fp32", "zero2", runs)
    row.values = {K.ENERGY_GPU_MEAN_POWER_W: 305.0, K.PERF_STRAGGLER_SCORE: 1.31}
    return row


def test_energy_per_accepted_output_counts_failed_runs_energy() -> None:
    health = {f"{K.TAG_HEALTH_NODE_PREFIX}h100-1": "healthy"}
    runs = [
        _run(1, Outcome.ACCEPTED, {K.ENERGY_GPU_KWH: 2.0, K.COST_ENERGY_USD: 0.4}, health, "0.2"),
        _run(
            2,
            Outcome.FAILED,
            {K.ENERGY_GPU_KWH: 1.0, K.COST_ENERGY_USD: 0.2, K.PERF_STRAGGLER_SCORE: 1.3},
            {
                f"{K.TAG_HEALTH_NODE_PREFIX}h100-2": "failed: GPU 0: 1 uncorrected ECC error(s)",
                K.TAG_STRAGGLER_NODE: "h100-2",
                K.TAG_STRAGGLER_RANK: "1",
            },
            "0.2",
        ),
    ]
    row = _row(runs)
    assert energy.energy_per_output(row) == (3.0, "")
    cost, why = energy.energy_cost(row)
    assert cost == pytest.approx(0.6) and why == ""
    (line,) = energy.energy_table([row]).rows
    assert line[1] == "3" and line[2].startswith("$0.6") and line[3] == "305"
    assert line[4] == "h100-1: healthy x1; h100-2: failed x1 (GPU 0: 1 uncorrected ECC error(s))"
    assert line[5] == "1.31" and line[6] == "h100-2 (rank 1)"


def test_without_a_counter_or_a_price_the_energy_is_absent_with_the_reason() -> None:
    note = {K.TAG_ENERGY_NOTE: "GPU energy absent: no NVML energy counter in every attempt"}
    row = _row([_run(1, Outcome.ACCEPTED, {}, note, None)])
    per, why = energy.energy_per_output(row)
    assert per is None and "no NVML energy counter" in why
    cost, cost_why = energy.energy_cost(row)
    assert cost is None and cost_why == "no electricity price (cost.electricity_usd_per_kwh)"
    (line,) = energy.energy_table([row]).rows
    assert line[1].startswith("not defined (1 of 1 finished run(s) without GPU energy")


def test_power_plot_of_one_run(sqlite_uri: str) -> None:
    client = MlflowClient(tracking_uri=sqlite_uri)
    exp = client.create_experiment("e")
    run_id = client.create_run(exp).info.run_id
    t0 = 1_796_000_000_000
    batch = [
        Metric(f"sys/n1/gpu{g}/{what}", value, t0 // 1000, t0 + 500 * i)
        for i in range(5)
        for g in (0, 1)
        for what, value in (("power_w", 300 + 10 * g + i), ("utilization_pct", 90))
    ]
    client.log_batch(run_id, metrics=batch)  # one call: the store is SQLite
    metrics: dict[str, Any] = {k: v for k, v in client.get_run(run_id).data.metrics.items()}
    rec = RunRecord(run_id, "p1", "FINISHED", 0, {K.TAG_OUTCOME: Outcome.ACCEPTED}, {}, metrics)
    plot = energy.power_plot(client, [_row([rec])])
    assert plot.png is not None and plot.png.startswith(b"\x89PNG")
    assert "2 GPU power and 2 utilisation series, mean sampled power 307 W per GPU" in plot.note
    empty = energy.power_plot(client, [_row([_run(2, Outcome.ACCEPTED, {}, {}, None)])])
    assert empty.png is None and empty.note == "no run with telemetry"
