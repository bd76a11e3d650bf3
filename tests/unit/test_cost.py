"""Cost and goodput, checked against hand arithmetic."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.contract.records import AttemptRecord
from pipeline.measure.cost import (
    BadputParts,
    BilledAttempt,
    CostBreakdown,
    CostParams,
    Price,
    cost_per_finished_run,
    cost_per_successful_checkpoint,
    goodput,
    run_cost,
    sum_costs,
    tokens_per_dollar,
)

PRICE = Price(usd_per_gpu_hour=2.50, date="2026-11-01", source="example price list")
PARAMS = CostParams(
    storage_usd_per_gb_month=0.02,
    retention_days=30,
    egress_usd_per_gb=0.09,
    orchestration_usd_per_run=0.10,
    labor_usd_per_hour=100.0,
    labor_hours_per_failure=0.5,
)


def test_two_failed_attempts_then_accepted() -> None:
    # One run, three attempts of 4 GPUs x 0.5 h: a crash that needed a person, a preemption
    # requeued automatically, then the attempt that finished.
    attempts = [BilledAttempt(4, 1800, needed_person=True), BilledAttempt(4, 1800), BilledAttempt(4, 1800)]
    c = run_cost(attempts, PRICE, PARAMS, ckpt_bytes_stored=10 * 10**9, egress_bytes=5 * 10**9)
    # compute: 3 * 4 GPUs * 0.5 h = 6 GPU-h * $2.50 = $15.00
    assert c.gpu_hours == pytest.approx(6.0)
    assert c.compute == pytest.approx(15.0)
    # storage: $0.02/GB-month * 10 GB * 30/30 month = $0.20
    assert c.storage == pytest.approx(0.20)
    # egress: $0.09/GB * 5 GB = $0.45
    assert c.egress == pytest.approx(0.45)
    # orchestration once per run: $0.10
    assert c.overhead == pytest.approx(0.10)
    # labor: 1 failure needing a person * 0.5 h * $100/h = $50
    assert c.labor == pytest.approx(50.0)
    # total 15 + 0.20 + 0.45 + 0.10 + 50 = $65.75
    assert c.total == pytest.approx(65.75)
    # One accepted run: $65.75 per finished run; 5 verified checkpoints: 65.75/5 = $13.15 each.
    assert cost_per_finished_run(c.total, 1) == pytest.approx(65.75)
    assert cost_per_successful_checkpoint(c.total, 5) == pytest.approx(13.15)
    # 1,000,000 accepted tokens / $65.75 = 15,209.125... tokens per dollar
    assert tokens_per_dollar(1_000_000, c.total) == pytest.approx(15_209.125475)


def test_retention_is_prorated_and_gb_is_decimal() -> None:
    # 7 days of 10 GB at $0.02/GB-month: 0.02 * 10 * 7/30 = $0.046666...
    # 10 GiB = 10.737... GB, billed as such: 0.02 * 10.737418 * 1 = $0.214748
    seven = CostParams(0.02, 7, 0.0, 0.0, 0.0, 0.0)
    assert run_cost([], PRICE, seven, 10 * 10**9, 0).storage == pytest.approx(0.0466667, abs=1e-7)
    assert run_cost([], PRICE, PARAMS, 10 * 2**30, 0).storage == pytest.approx(0.2147484, abs=1e-7)


def test_candidate_with_no_accepted_run() -> None:
    # Two runs, both ended by OOM on 8 GPUs after 6 minutes: 2 * 8 * 0.1 h = 1.6 GPU-h = $4.00
    # + 2 * $0.10 orchestration = $4.20 spent, nothing accepted.
    runs = [run_cost([BilledAttempt(8, 360)], PRICE, PARAMS, 0, 0) for _ in range(2)]
    total = sum_costs(runs)
    assert total.gpu_hours == pytest.approx(1.6)
    assert total.total == pytest.approx(4.20)
    assert cost_per_finished_run(total.total, 0) is None
    assert cost_per_successful_checkpoint(total.total, 0) is None
    assert tokens_per_dollar(0, total.total) == 0.0  # money spent, nothing accepted: zero, defined


def test_unknown_or_zero_cost() -> None:
    assert cost_per_finished_run(None, 3) is None
    assert tokens_per_dollar(1000, None) is None
    assert tokens_per_dollar(1000, 0.0) is None  # free: tokens per dollar is not defined


def test_missing_price_raises() -> None:
    with pytest.raises(ValueError, match="no GPU price"):
        run_cost([BilledAttempt(4, 1800)], None, PARAMS, 0, 0)
    with pytest.raises(ValueError, match="usd_per_gpu_hour"):
        run_cost([BilledAttempt(4, 1800)], Price(-1.0, "2026-11-01", "typo"), PARAMS, 0, 0)
    with pytest.raises(ValueError, match="allocated_s"):
        run_cost([BilledAttempt(4, float("nan"))], PRICE, PARAMS, 0, 0)


def test_sum_costs_part_by_part() -> None:
    a = CostBreakdown(1.0, 2.0, 3.0, 4.0, 5.0, 15.0, 0.5)
    assert sum_costs([a, a]) == CostBreakdown(2.0, 4.0, 6.0, 8.0, 10.0, 30.0, 1.0, 0.0)
    assert sum_costs([]).total == 0


def test_goodput_breakdown() -> None:
    # 1 h allocated, 45 min of steps that count; startup 120 + save 60 + restore 30 + lost 90
    # + drills 300 = 600 s; idle = 3600 - 2700 - 600 = 300 s; goodput 2700/3600 = 0.75
    parts = BadputParts(startup_s=120, ckpt_save_s=60, restore_s=30, lost_work_s=90, drills_s=300)
    g = goodput(2700, 3600, parts)
    assert g.goodput == pytest.approx(0.75)
    assert g.idle_s == pytest.approx(300)
    assert (g.startup_s, g.ckpt_save_s, g.restore_s, g.lost_work_s, g.drills_s) == (120, 60, 30, 90, 300)


def test_goodput_never_negative_idle_nor_above_one() -> None:
    # Parts overshoot: 100 - 90 - 20 = -10 -> idle 0; goodput 0.9
    g = goodput(90, 100, BadputParts(startup_s=20))
    assert g.idle_s == 0.0
    assert g.goodput == pytest.approx(0.9)
    # sacct's whole seconds can make allocated a hair short of productive: capped at 1.
    assert goodput(100.4, 100, BadputParts()).goodput == 1.0
    assert goodput(0, 0, BadputParts()).goodput is None
    with pytest.raises(ValueError, match="lost_work_s"):
        goodput(10, 100, BadputParts(lost_work_s=-1))


def test_reusable_value_per_verified_checkpoint_is_subtracted() -> None:
    # 1 GPU x 1 h at $2.50 + orchestration $0.10 = $2.60; 3 verified checkpoints worth $0.20
    # each: reusable $0.60, total $2.00. Default value 0: nothing claimed.
    params = CostParams(0.0, 30, 0.0, 0.10, 0.0, 0.0, reusable_usd_per_verified_checkpoint=0.20)
    c = run_cost([BilledAttempt(1, 3600)], PRICE, params, 0, 0, verified_checkpoints=3)
    assert c.reusable == pytest.approx(0.60)
    assert c.total == pytest.approx(2.00)
    assert run_cost([BilledAttempt(1, 3600)], PRICE, PARAMS, 0, 0, verified_checkpoints=3).reusable == 0.0


# Recorded from the local Slurm (sacct -D -X -n -P -o JobID,ElapsedRaw,AllocTRES,Start,State -j 1):
# a 2-GPU h100 job requeued once (scontrol requeue) after 2 s, then run to the end in 4 s.
SACCT_REQUEUED = [
    "1|2|billing=1,cpu=1,gres/gpu:h100=2,gres/gpu=2,node=1|2026-11-30T17:47:09|REQUEUED",
    "1|4|billing=1,cpu=1,gres/gpu:h100=2,gres/gpu=2,node=1|2026-11-30T17:47:18|COMPLETED",
]


def test_parse_sacct_allocations() -> None:
    from pipeline.slurm.cluster import Allocation, parse_allocations

    allocs = parse_allocations(reversed(SACCT_REQUEUED))  # sorted by start, whatever the order
    assert allocs == [
        Allocation(2.0, 2, "2026-11-30T17:47:09", "REQUEUED"),
        Allocation(4.0, 2, "2026-11-30T17:47:18", "COMPLETED"),
    ]
    # a CPU-only allocation holds no GPU; a line that is not an allocation is skipped
    cpu = parse_allocations(["7|30|billing=1,cpu=1,node=1|2026-11-30T18:00:00|RUNNING", "garbage"])
    assert cpu == [Allocation(30.0, None, "2026-11-30T18:00:00", "RUNNING")]
    # with the job name: another sweep's job of the same id (a fresh cluster restarts at 1) is not ours
    named = [line + "|sq-abc" for line in SACCT_REQUEUED] + [
        "1|9|gres/gpu=8|2026-11-29T10:00:00|COMPLETED|other"
    ]
    assert [a.elapsed_s for a in parse_allocations(named, "sq-abc")] == [2.0, 4.0]


def _config(**cost: object) -> object:
    from pipeline.config.schema import Config, CostConfig

    cfg = Config()
    cfg.partition.price_usd_per_gpu_hour = 4.00
    cfg.cost = CostConfig(**cost)  # type: ignore[arg-type]
    cfg.train.keep_last = 2
    return cfg


def test_whole_formula_for_a_slurm_accounted_point() -> None:
    """Every cost term by hand for the recorded sacct job above, with its two attempt records
    (a preempted attempt, requeued; then one that crashed for good and needed a person)."""
    from pipeline.contract.accounting import run_totals
    from pipeline.slurm.cluster import parse_allocations
    from pipeline.tracking import keys as K

    cfg = _config(
        storage_usd_per_gb_month=0.023,
        retention_days=30,
        egress_usd_per_gb=0.09,
        orchestration_usd_per_run=0.10,
        labor_usd_per_hour=120.0,
        labor_hours_per_failure=0.5,
        ship_checkpoints=True,
        reusable_usd_per_verified_checkpoint=0.05,
    )
    attempts = [  # the process clocks (1.2 s, 3.1 s) are shorter than what Slurm bills
        {
            "allocated_s": 1.2,
            "ranks": 2,
            "productive_s": 0.5,
            "saved_bytes": 3 * 10**9,
            "verified": 1,
            "stop": "preempt",
        },
        {
            "allocated_s": 3.1,
            "ranks": 2,
            "productive_s": 2.0,
            "saved_bytes": 2 * 10**9,
            "verified": 1,
            "needed_person": True,
        },
    ]
    # two checkpoints of 1.5 GB kept on disk at the end
    out, source = run_totals(
        cfg, AttemptRecord.read_all(attempts), 3 * 10**9, parse_allocations(SACCT_REQUEUED)
    )
    assert source == "sacct"
    # GPU-hours: sacct 2 s x 2 GPUs + 4 s x 2 GPUs = 12 GPU-s = 0.0033333 GPU-h
    assert out[K.COST_GPU_HOURS] == pytest.approx(12 / 3600)
    # compute: 12/3600 GPU-h x $4.00 = $0.0133333
    assert out[K.COST_COMPUTE_USD] == pytest.approx(12 / 3600 * 4.00)
    # storage: the 3 GB kept x $0.023/GB-month x 30/30 = $0.069
    assert out[K.COST_STORAGE_USD] == pytest.approx(0.069)
    # egress (checkpoints shipped): 3 GB + 2 GB saved = 5 GB x $0.09 = $0.45
    assert out[K.COST_EGRESS_GB] == pytest.approx(5.0)
    assert out[K.COST_EGRESS_USD] == pytest.approx(0.45)
    assert out[K.COST_OVERHEAD_USD] == pytest.approx(0.10)
    # labor: one failure that needed a person x 0.5 h x $120 = $60 (the preemption: none)
    assert out[K.COST_FAILURES_NEEDING_PERSON] == 1
    assert out[K.COST_LABOR_USD] == pytest.approx(60.0)
    # reusable: 2 verified checkpoints x $0.05 = $0.10, subtracted
    assert out[K.COST_REUSABLE_USD] == pytest.approx(0.10)
    # total 0.0133333 + 0.069 + 0.45 + 0.10 + 60 - 0.10 = $60.5323333
    assert out[K.COST_USD] == pytest.approx(60.5323333, abs=1e-7)
    # goodput on sacct's allocated wall time: 2.5 s productive / 6 s = 0.416667
    assert out[K.TIME_ALLOCATED_S] == 6.0
    assert out[K.GOODPUT] == pytest.approx(2.5 / 6)


def test_without_slurm_the_process_clock_is_billed_and_labelled() -> None:
    from pipeline.contract.accounting import run_totals
    from pipeline.tracking import keys as K

    cfg = _config()
    attempts = [{"allocated_s": 1800.0, "ranks": 2, "productive_s": 900.0, "saved_bytes": 10**9}]
    out, source = run_totals(cfg, AttemptRecord.read_all(attempts), 0, None)
    assert source == "process_clock"
    # 2 ranks x 0.5 h x $4 = $4.00; checkpoints not shipped: no egress; automatic: no labor
    assert out[K.COST_COMPUTE_USD] == pytest.approx(4.00)
    assert out[K.COST_EGRESS_USD] == 0.0 and out[K.COST_LABOR_USD] == 0.0
    assert out[K.GOODPUT] == pytest.approx(0.5)


def test_an_attempt_that_never_had_a_trainer_measures_no_time_split() -> None:
    """fp16 refused on CPU before the engine exists: the allocation is billed, nothing trained,
    and start-up, saves and idle time were never measured: absent, not 0."""
    from pipeline.contract.accounting import attempt_record, run_totals
    from pipeline.tracking import keys as K

    rec = attempt_record(process_start=100.0, ranks=2, trainer=None, now=106.5)
    out, _ = run_totals(_config(), [rec], 0, None)
    assert out[K.TIME_ALLOCATED_S] == 6.5 and out[K.TIME_PRODUCTIVE_S] == 0.0 and out[K.GOODPUT] == 0.0
    assert not {K.TIME_STARTUP_S, K.TIME_CKPT_SAVE_S, K.TIME_IDLE_S, K.TIME_LOST_S} & set(out)
    trained = replace(rec, productive_s=3.0, startup_s=2.0)  # a later attempt that trained
    out, _ = run_totals(_config(), [rec, trained], 0, None)
    assert out[K.TIME_STARTUP_S] == 2.0 and out[K.TIME_IDLE_S] == pytest.approx(13.0 - 5.0)


# Who pays a person for each way a point can end (docs/design.md, "Cost"), written from the
# design's rule, not from the code's table: a person repairs the partition after a crash of the
# partition itself or a checkpoint that did not restore, and for nothing else.
ENDINGS = [
    (
        "failed",
        "crash",
        True,
    ),  # a node, GPU, interconnect or storage failure; workers failing past max_restarts
    ("failed", "checkpoint_not_verified", True),
    ("failed", "disk_full", True),  # the partition's storage or the user's quota: someone frees space
    ("failed", "timeout", False),  # the scheduler's time limit, by design
    ("failed", "preempted", False),  # preempted past max_restarts: the partition's preemption rate
    ("failed", "preempt_cancelled", False),  # a preemption on a partition that cancels: by design
    ("failed", "drill_failed", False),  # a drill's failure is a measurement (its trigger's failure too)
    ("failed", "oom", False),  # a measured property of the candidate, not an incident
    ("failed", "does_not_fit", False),
    ("failed", "unsupported_precision", False),
    ("failed", "unsupported_method", False),
    ("failed", "loss_above_bound", False),
    ("failed", "target_not_reached", False),
    ("failed", "node_unhealthy", False),  # caught by the gate before it cost a run; resubmitted elsewhere
    ("failed", "interrupted", False),  # the user's Ctrl-C
    ("failed", "cancelled", False),  # the user's or an admin's scancel
    ("error", "tool_error", False),  # slurm-qualify's own defect: never charged to the partition
    ("accepted", "", False),
]


def test_every_ending_reason_is_covered_by_the_labor_table() -> None:
    from pipeline.contract.outcome import Reason

    reasons = {r.value for r in Reason}
    assert reasons == {r for _, r, _ in ENDINGS if r}


@pytest.mark.parametrize(("outcome", "reason", "person"), ENDINGS)
def test_labor_is_charged_only_for_the_failures_that_need_a_person(
    outcome: str, reason: str, person: bool
) -> None:
    """The bill of a point that ended this way after a preempted, requeued attempt: labor is
    0.5 h x $120 when a person is needed, else 0, whatever the earlier attempts were."""
    from pipeline.contract.accounting import needed_person, run_totals
    from pipeline.tracking import keys as K

    preempted = {"start": 0.0, "end": 60.0, "allocated_s": 60.0, "ranks": 2, "stop": "preempt"}
    last = {
        "start": 70.0,
        "end": 130.0,
        "allocated_s": 60.0,
        "ranks": 2,
        "outcome": outcome,
        "needed_person": needed_person(outcome, reason),
    }
    cfg = _config(labor_usd_per_hour=120.0, labor_hours_per_failure=0.5)
    out, _ = run_totals(cfg, AttemptRecord.read_all([preempted, last]), 0, None)
    assert out[K.COST_LABOR_USD] == (60.0 if person else 0.0)
    assert out[K.COST_FAILURES_NEEDING_PERSON] == (1 if person else 0)


def test_restart_parts_across_skewed_clocks_are_clamped(caplog: pytest.LogCaptureFixture) -> None:
    from pipeline.job.drills import StopRecord, breakdown

    # the previous attempt's host is 5 s ahead: its exit (t=105) is after this start (t=101)
    prev = StopRecord("preempt", signal_time=100.0, exit_time=105.0, stop_step=10, saved_step=10)
    timeline = {"engine_ready": 103.0, "load_done": 104.0, "first_step_done": 104.5}
    b = breakdown(prev, 101.0, timeline, 10)
    assert b.exit_to_start_s == 0.0  # -4 s clamped
    assert (b.signal_to_exit_s, b.start_to_ready_s, b.load_s, b.first_step_s) == (5.0, 2.0, 1.0, 0.5)
    (warned,) = caplog.records  # the job log's `[job] restart/exit_to_start_s is -4.00 s: ...`
    assert warned.name.startswith("pipeline.job.") and "disagree by more than 1 s" in warned.getMessage()
    caplog.clear()
    # within a second: clamped without a warning
    breakdown(StopRecord("preempt", 100.0, 101.5, 10, 10), 101.0, timeline, 10)
    assert caplog.records == []


def test_step_cv_of_one_timed_step_is_not_defined() -> None:
    from pipeline.measure.stats import step_stats

    one = step_stats([1.0, 2.0], warmup=1)
    assert one is not None and one.cv is None  # absent, not 0
    two = step_stats([1.0, 2.0, 4.0], warmup=1)
    assert two is not None and two.cv == pytest.approx(1 / 3)  # pstdev 1 / mean 3


def _hand_count(folder: Path) -> tuple[int, int]:
    """Committed checkpoint folders and the bytes of their files, counted by hand with
    `find checkpoints/step* -type f -printf %s` (not through pipeline.contract.retention)."""
    dirs = sorted(str(p) for p in folder.glob("step*"))
    if not dirs:
        return 0, 0
    find = ["find", *dirs, "-type", "f", "-printf", "%s\\n"]
    out = subprocess.run(find, capture_output=True, text=True, check=True).stdout
    return len(dirs), sum(int(n) for n in out.split())


@pytest.mark.parametrize(("saves", "kept"), [(1, 1), (3, 2)])
def test_storage_is_billed_for_the_checkpoints_kept_on_disk(tmp_path: Path, saves: int, kept: int) -> None:
    """keep_last=2: a run that saved once keeps one checkpoint and is billed for one (it was
    billed for keep_last x the last one's size, two); a run that saved three times keeps two.
    The bill against a hand count of the folders on disk, written by the real checkpoint
    manager (a fake engine's files)."""
    from pipeline.contract.accounting import run_totals
    from pipeline.contract.retention import kept_checkpoint_bytes
    from pipeline.tracking import keys as K
    from pipeline.train.checkpoint import CheckpointManager
    from tests.support.fakes import FakeEngine, LocalComm

    root = tmp_path / "checkpoints"
    m = CheckpointManager(root, interval=1, keep_last=2, rank=0, world=1, comm=LocalComm(), io="buffered")
    engine = FakeEngine(numel=1 << 18)
    for step in range(1, saves + 1):
        engine.set_step(step)
        m.save(engine, step, {"step": step})
    m.wait()
    folders, stored = _hand_count(root)
    assert folders == kept and stored > kept * 2 * (1 << 18) * 4  # at least each one's 2 fp32 tensors
    assert kept_checkpoint_bytes(root) == stored
    cfg = _config(storage_usd_per_gb_month=0.5, retention_days=15)
    out, _ = run_totals(cfg, [AttemptRecord(allocated_s=3600.0, ranks=1)], kept_checkpoint_bytes(root), None)
    # $0.50/GB-month x the bytes kept / 1e9 x 15/30 days
    assert out[K.COST_STORAGE_USD] == pytest.approx(0.5 * stored / 1e9 * 15 / 30, rel=1e-12)
    assert kept_checkpoint_bytes(tmp_path / "none") == 0


def test_the_reports_cost_definitions_are_what_the_code_computes() -> None:
    """Issue #46: the report's Definitions once said storage x keep_last and labor for time-outs
    and cancelled preemptions. Each cost row is now the code's own text, and what the text says
    is checked against what run_cost and needed_person do."""
    from analysis.report import METRIC_DEFINITIONS, cost_definition
    from pipeline.contract.accounting import needed_person
    from pipeline.contract.outcome import Outcome, Reason
    from pipeline.measure.cost import COST_DEFINITIONS

    rows = {name: text for name, text, _ in METRIC_DEFINITIONS}
    assert {n: rows[n] for n in COST_DEFINITIONS} == {n: cost_definition(n) for n in COST_DEFINITIONS}
    assert not any("keep_last" in text for text in rows.values())

    # labor: charged exactly for the reasons the Definitions name, for every reason there is
    labor = rows["labor cost"]
    named = {r for r in Reason if f" {r.value}," in labor or f" {r.value}." in labor}
    assert (
        named
        == {r for r in Reason if needed_person(Outcome.FAILED, r)}
        == {Reason.CRASH, Reason.CKPT_NOT_VERIFIED, Reason.DISK_FULL}  # disk_full: someone frees space
    )
    assert not any(needed_person(Outcome.ERROR, r) for r in Reason)  # the tool's defects: none
    person = run_cost([BilledAttempt(1, 0.0, needed_person=True)], PRICE, PARAMS, 0, 0)
    assert person.labor == PARAMS.labor_hours_per_failure * PARAMS.labor_usd_per_hour

    # storage: "$/GB-month x bytes kept / 1e9 x retention_days / 30", by hand: 7 GB kept, 30 days
    assert "bytes of the checkpoints the point kept" in rows["storage cost"]
    kept = 7 * 10**9
    assert run_cost([], PRICE, PARAMS, kept, 0).storage == pytest.approx(0.02 * 7 * 30 / 30)
    assert run_cost([], PRICE, replace(PARAMS, retention_days=15), kept, 0).storage == pytest.approx(0.07)
