"""Fake sweeps shaped like the job's.

`make_fake_sweep` builds, through the MLflow API, a small sweep with every awkward case the
report must survive; `make_many_runs` builds thousands of realistic runs for the scale test
and the benchmark, in one transaction into MLflow's own tables (`bulk_insert_runs`, held equal
to the API's writes by a test). Costs are computed with pipeline.measure.cost, as the job does,
so the numbers agree.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from pipeline.config.schema import CostConfig
from pipeline.contract.outcome import Outcome
from pipeline.measure.cost import BadputParts, BilledAttempt, CostParams, Price, goodput, run_cost
from pipeline.submit.manifest import Manifest
from pipeline.tracking import keys as K

# partition -> (GPUs per node, GiB per GPU, $/GPU-hour or None: no price)
PARTITIONS: dict[str, tuple[int, float, float | None]] = {
    "h100": (4, 80.0, 3.00),
    "a100": (4, 80.0, 1.20),
    "l40s": (4, 48.0, 1.00),
    "h200": (4, 141.0, None),
}
PRICE_DATE, PRICE_SOURCE = "2026-11-01", "illustrative list price"
COST = CostConfig(labor_usd_per_hour=120.0, labor_hours_per_failure=0.5)
CKPT_BYTES = 20 * 10**9
TOKENS_PER_STEP = 4 * 4096


@dataclass(frozen=True)
class RunSpec:
    """One child run. Defaults: an accepted 7B bf16 run with one verified checkpoint."""

    partition: str
    model: str = "llama-7b"
    precision: str = "bf16"
    parallelism: str = "zero3-1x4-mb1-ga1-ac"
    outcome: str = Outcome.ACCEPTED
    reason: str = ""
    drills: str = "none"
    tokens_per_s: float | None = 10000.0
    mfu: float = 0.40
    peak_gib: float = 50.0
    allocated_s: float = 1200.0
    attempts: int = 1
    needed_person: bool = False
    verified_ckpts: int = 1
    with_metrics: bool = True
    steps: int = 20
    step_times: tuple[float, ...] = ()  # the step-time series to log (default: a fixed jittered one)
    startup_s: float = 60.0
    seq_len: int = 4096
    price_scale: float = 1.0  # another provider's price for the same partition (PARTITIONS x this)
    price_date: str = PRICE_DATE

    @property
    def price(self) -> float | None:
        base = PARTITIONS[self.partition][2]
        return None if base is None else base * self.price_scale

    @property
    def candidate(self) -> str:
        return f"{self.partition}/{self.model}/{self.precision}/{self.parallelism}"


@dataclass
class FakeSweep:
    uri: str
    experiment_id: str
    sweep_id: str
    parent_id: str
    run_ids: dict[str, str] = field(default_factory=dict)  # run name -> run id
    cluster_tags: dict[str, str] = field(default_factory=dict)  # sq.cluster* of every run (issue 36)


# the shape of each fake model, as the job logs a preset's model.* params
MODEL_SHAPES = {
    "llama-7b": {"n_layers": 32, "hidden": 4096, "n_heads": 32, "vocab_size": 32000},
    "llama-1b": {"n_layers": 16, "hidden": 2048, "n_heads": 32, "vocab_size": 128256},
}


def _params(spec: RunSpec) -> dict[str, str]:
    gpus, mem, _ = PARTITIONS[spec.partition]
    price = spec.price
    p = {
        "partition.name": spec.partition,
        "partition.gpus_per_node": str(gpus),
        "partition.gpu_mem_gib": str(mem),
        "partition.price_usd_per_gpu_hour": str(price),  # "None" when unknown, as Hydra flattens it
        "partition.price_date": spec.price_date if price is not None else "",
        "partition.price_source": PRICE_SOURCE if price is not None else "",
        "model.name": spec.model,
        "model.seq_len": str(spec.seq_len),
        **{f"model.{k}": str(v) for k, v in MODEL_SHAPES.get(spec.model, {}).items()},
        "method.name": "full",
        "data.kind": "synthetic",
        "data.alphabet": "32",
        "precision.name": spec.precision,
        "parallelism.name": spec.parallelism,
        "parallelism.zero_stage": spec.parallelism[4] if spec.parallelism.startswith("zero") else "2",
        "parallelism.gpus_per_node": str(gpus),
        "parallelism.nodes": "1",
        "train.steps": str(spec.steps),
        "train.warmup_steps": "3",
    }
    p.update({f"cost.{k}": str(v) for k, v in vars(COST).items()})
    return p


def _metrics(spec: RunSpec, ts: int) -> list[Metric]:
    gpus, mem, _ = PARTITIONS[spec.partition]
    price = spec.price
    m: dict[str, float] = {
        K.TIME_ALLOCATED_S: spec.allocated_s,
        K.ATTEMPTS: spec.attempts,
        K.MEM_CAPACITY_GIB: mem,
        K.MEM_PEAK_ALLOCATED_GIB: spec.peak_gib,
        K.MEM_PEAK_RESERVED_GIB: spec.peak_gib * 1.05,
        K.MEM_HEADROOM_FRAC: 1 - spec.peak_gib / mem,
    }
    series: list[Metric] = []
    if spec.tokens_per_s:
        step = TOKENS_PER_STEP / spec.tokens_per_s
        done = spec.steps if spec.outcome == Outcome.ACCEPTED else spec.steps // 2
        for i in range(done):
            t = step * (3.0 if i == 0 else 1.0 + 0.03 * ((i * 7) % 5 - 2))  # slow first step, jitter
            t = spec.step_times[i] if i < len(spec.step_times) else t
            series.append(Metric(K.PERF_STEP_TIME_S, t, ts + i, i + 1))
            series.append(Metric(K.TRAIN_LOSS, 5.5 * 0.97**i, ts + i, i + 1))
        # the fake's steps are few: productive time is a share of the allocation instead
        productive = spec.allocated_s * (0.75 if spec.outcome == Outcome.ACCEPTED else 0.4)
        m |= {
            K.PERF_TOKENS_PER_S: spec.tokens_per_s,
            K.PERF_STEP_P50_S: step,
            K.PERF_STEP_P95_S: step * 1.05,
            K.PERF_STEP_CV: 0.03,
            K.PERF_WARMUP_STEPS: 3,
            K.PERF_TIMED_STEPS: done - 3,
            K.PERF_MFU: spec.mfu,
            K.PERF_MFU_VS_CEILING: spec.mfu / 0.8,
            K.COMM_ALLREDUCE_BUSBW: 150.0 if spec.partition != "l40s" else 20.0,
            K.CKPT_SAVE_S: 20.0,
            K.CKPT_LOAD_S: 15.0,
            K.CKPT_BYTES: CKPT_BYTES,
            K.CKPT_VERIFIED: 1.0 if spec.verified_ckpts else 0.0,
            K.CKPT_VERIFIED_COUNT: spec.verified_ckpts,
            K.TRAIN_STEPS: done,
            K.TRAIN_TOKENS: done * TOKENS_PER_STEP,
            K.TIME_PRODUCTIVE_S: productive,
            K.TIME_STARTUP_S: spec.startup_s * spec.attempts,
            K.TIME_CKPT_SAVE_S: 20.0 * spec.verified_ckpts,
        }
        if "preempt" in spec.drills:
            parts = {
                K.RESTART_SIGNAL_TO_EXIT_S: 25.0,
                K.RESTART_EXIT_TO_START_S: 30.0,
                K.RESTART_START_TO_READY_S: 40.0,
                K.RESTART_LOAD_S: 15.0,
                K.RESTART_FIRST_STEP_S: 3.0,
            }
            m |= parts | {K.RESTART_TOTAL_S: sum(parts.values()), K.RESTART_LOST_STEPS: 2}
            m |= {K.TIME_CKPT_LOAD_S: 15.0, K.TIME_LOST_S: 2 * step, K.TIME_DRILLS_S: 25.0}
        g = goodput(
            productive,
            spec.allocated_s,
            BadputParts(
                startup_s=m[K.TIME_STARTUP_S],
                ckpt_save_s=m[K.TIME_CKPT_SAVE_S],
                restore_s=m.get(K.TIME_CKPT_LOAD_S, 0.0),
                lost_work_s=m.get(K.TIME_LOST_S, 0.0),
                drills_s=m.get(K.TIME_DRILLS_S, 0.0),
            ),
        )
        m |= {K.GOODPUT: g.goodput or 0.0, K.TIME_IDLE_S: g.idle_s}
    if price is not None:  # the job cannot cost a run without a price: it logs nothing then
        per = spec.allocated_s / spec.attempts
        attempts = [
            BilledAttempt(gpus, per, needed_person=spec.needed_person and i == 0)
            for i in range(spec.attempts)
        ]
        c = run_cost(
            attempts,
            Price(price, spec.price_date, PRICE_SOURCE),
            CostParams(**{k: v for k, v in vars(COST).items() if k in CostParams.__dataclass_fields__}),
            CKPT_BYTES,
            0,
        )
        m |= {
            K.COST_USD: c.total,
            K.COST_COMPUTE_USD: c.compute,
            K.COST_STORAGE_USD: c.storage,
            K.COST_EGRESS_USD: c.egress,
            K.COST_OVERHEAD_USD: c.overhead,
            K.COST_LABOR_USD: c.labor,
            K.COST_GPU_HOURS: c.gpu_hours,
            K.COST_PRICE_USD_PER_GPU_HOUR: price,
        }
    return [Metric(k, float(v), ts, 0) for k, v in m.items()] + series


@dataclass
class RunContent:
    """What the job writes for one child run: tags at creation, one batch, the final status."""

    name: str
    start_ms: int
    tags: dict[str, str]
    params: dict[str, str]
    metrics: list[Metric]
    status: str  # RUNNING, or FINISHED / FAILED once set_terminated
    end_ms: int | None


def run_content(sweep: FakeSweep, spec: RunSpec, name: str, start_ms: int) -> RunContent:
    gpus, _, _ = PARTITIONS[spec.partition]
    price = spec.price
    tags = {
        "mlflow.parentRunId": sweep.parent_id,
        K.TAG_PARENT_KIND: "point",
        K.TAG_SWEEP_ID: sweep.sweep_id,
        K.TAG_POINT_ID: name,
        K.TAG_CANDIDATE: spec.candidate,
        K.TAG_PARTITION: spec.partition,
        K.TAG_GPU_TYPE: spec.partition,
        K.TAG_MODEL: spec.model,
        K.TAG_PRECISION: spec.precision,
        K.TAG_PARALLELISM: spec.parallelism,
        K.TAG_DRILLS: spec.drills,
        K.TAG_OUTCOME: spec.outcome,
        K.TAG_REASON: spec.reason,
        K.TAG_REASON_DETAIL: f"{spec.reason} in step 7" if spec.reason else "",
        K.TAG_GPUS: str(gpus),
        K.TAG_PRICE_DATE: spec.price_date if price is not None else "",
        K.TAG_PRICE_SOURCE: PRICE_SOURCE if price is not None else "",
        K.TAG_MEM_VERDICT: "fits",
        K.TAG_MEM_SOURCE: "cuda_max_allocated",
        K.TAG_METHOD: "full",
        K.TAG_DATA_FINGERPRINT: "synthetic:alphabet=32",
        **sweep.cluster_tags,
    }
    terminated = spec.outcome in (Outcome.ACCEPTED, Outcome.FAILED)
    return RunContent(
        name=name,
        start_ms=start_ms,
        tags=tags,
        params=_params(spec),
        metrics=_metrics(spec, start_ms) if spec.with_metrics else [],
        status=("FINISHED" if spec.outcome == Outcome.ACCEPTED else "FAILED") if terminated else "RUNNING",
        end_ms=start_ms + int(spec.allocated_s * 1000) if terminated else None,
    )


def log_run(client: MlflowClient, sweep: FakeSweep, spec: RunSpec, name: str, start_ms: int) -> str:
    """One child run as the job logs it: tags at creation, then one log_batch."""
    c = run_content(sweep, spec, name, start_ms)
    run = client.create_run(sweep.experiment_id, start_time=start_ms, tags=c.tags, run_name=name)
    run_id = run.info.run_id
    params = [Param(k, v) for k, v in c.params.items()]
    for i in range(0, max(len(c.metrics), 1), 1000):  # log_batch takes at most 1000 metrics
        client.log_batch(run_id, metrics=c.metrics[i : i + 1000], params=params if i == 0 else [])
    if c.end_ms is not None:
        client.set_terminated(run_id, c.status, end_time=c.end_ms)
    sweep.run_ids[name] = run_id
    return run_id


def bulk_insert_runs(sweep: FakeSweep, contents: list[RunContent]) -> None:
    """Many child runs in one transaction, written into MLflow's own tables (its SQLAlchemy
    models) with the rows its SqlAlchemyStore writes for `log_run`'s calls. Only for building
    large fixtures: through the client each run is three transactions, and 5,000 runs took
    13 minutes on a loaded CI machine. `test_bulk_runs_read_back_as_logged_runs` holds the
    two writers equal through the read API (search_runs, get_metric_history)."""
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels.models import (
        SqlLatestMetric,
        SqlMetric,
        SqlParam,
        SqlRun,
        SqlTag,
    )
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.utils.uri import append_to_uri_path

    location = MlflowClient(tracking_uri=sweep.uri).get_experiment(sweep.experiment_id).artifact_location
    store = SqlAlchemyStore(sweep.uri, location)  # its engine, and its rule for NaN and infinity
    runs, tags, params, metrics, latest = [], [], [], [], []
    for c in contents:
        run_id = uuid.uuid4().hex
        runs.append(
            {
                "run_uuid": run_id,
                "name": c.name,
                "artifact_uri": append_to_uri_path(location, run_id, SqlAlchemyStore.ARTIFACTS_FOLDER_NAME),
                "experiment_id": int(sweep.experiment_id),
                "source_type": "UNKNOWN",
                "source_name": "",
                "entry_point_name": "",
                "user_id": "unknown",
                "status": c.status,
                "start_time": c.start_ms,
                "end_time": c.end_ms,
                "deleted_time": None,
                "source_version": "",
                "lifecycle_stage": "active",
            }
        )
        run_tags = c.tags | {"mlflow.runName": c.name}
        tags += [{"run_uuid": run_id, "key": k, "value": v} for k, v in run_tags.items()]
        params += [{"run_uuid": run_id, "key": k, "value": v} for k, v in c.params.items()]
        newest: dict[str, dict[str, object]] = {}
        for m in c.metrics:
            is_nan, value = store.sanitize_metric_value(m.value)
            row = {
                "run_uuid": run_id,
                "key": m.key,
                "value": value,
                "timestamp": m.timestamp,
                "step": m.step,
                "is_nan": is_nan,
            }
            metrics.append(row)
            old = newest.get(m.key)  # MLflow's rule: the latest is the largest (step, timestamp, value)
            if old is None or (m.step, m.timestamp, value) > (old["step"], old["timestamp"], old["value"]):
                newest[m.key] = row
        latest += list(newest.values())
        sweep.run_ids[c.name] = run_id
    with store.engine.begin() as conn:
        for model, rows in (
            (SqlRun, runs),
            (SqlTag, tags),
            (SqlParam, params),
            (SqlMetric, metrics),
            (SqlLatestMetric, latest),
        ):
            if rows:
                conn.execute(sa.insert(model.__table__), rows)


def artifact_root(uri: str) -> str:
    """Artifacts next to the SQLite file: MLflow's default (./mlruns under the current folder)
    would write into the project."""
    db = Path(uri.removeprefix("sqlite:///"))
    return (db.parent / "artifacts").as_uri()


def start_sweep(
    uri: str,
    sweep_id: str,
    experiment: str = "slurm-qualify",
    start_ms: int | None = None,
    cluster: dict[str, str] | None = None,
) -> FakeSweep:
    """The parent run, with its manifest artifact, as the sweep writes it before submitting:
    the production Manifest, written and named by its own code (manifest.MANIFEST)."""
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = (
        exp.experiment_id
        if exp
        else client.create_experiment(experiment, artifact_location=artifact_root(uri))
    )
    cluster_tags = K.cluster_tags(cluster or {})
    tags = {K.TAG_PARENT_KIND: "sweep", K.TAG_SWEEP_ID: sweep_id, **cluster_tags}
    start = start_ms if start_ms is not None else int(time.time() * 1000)
    parent = client.create_run(exp_id, start_time=start, tags=tags, run_name=f"sweep-{sweep_id}")
    created = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start / 1000))
    manifest = Manifest(sweep_id, "fake", created, "slurm", uri, experiment, [], parent.info.run_id)
    with tempfile.TemporaryDirectory() as tmp:
        client.log_artifact(parent.info.run_id, str(manifest.write(Path(tmp))))
    return FakeSweep(uri, exp_id, sweep_id, parent.info.run_id, cluster_tags=cluster_tags)


H100_A = "h100/llama-7b/bf16/zero3-1x4-mb1-ga1-ac"
H100_B = "h100/llama-7b/bf16/zero2-1x4-mb1-ga1"
A100_7B = "a100/llama-7b/bf16/zero3-1x4-mb1-ga1-ac"
L40S_7B = "l40s/llama-7b/bf16/zero3-1x4-mb1-ga1-ac"
H200_7B = "h200/llama-7b/bf16/zero3-1x4-mb1-ga1-ac"
A100_1B = "a100/llama-1b/bf16/zero2-1x4-mb4-ga1"


def fake_specs() -> dict[str, RunSpec]:
    """The awkward cases: failed runs, a candidate with zero accepted runs, a run with no
    metrics, a partition without price, a still-running run, a cheap candidate that fails
    its reference (tokens/s), a costlier one that passes."""
    z3, z2 = "zero3-1x4-mb1-ga1-ac", "zero2-1x4-mb1-ga1"
    return {
        "h100-a-1": RunSpec("h100", parallelism=z3, tokens_per_s=12000),
        "h100-a-2": RunSpec(
            "h100",
            parallelism=z3,
            tokens_per_s=11800,
            drills="preempt",
            allocated_s=1500,
            attempts=2,
            verified_ckpts=2,
        ),
        "h100-a-3": RunSpec(
            "h100",
            parallelism=z3,
            outcome="failed",
            reason="crash",
            tokens_per_s=11900,
            allocated_s=600,
            verified_ckpts=0,
        ),
        "h100-a-4": RunSpec("h100", parallelism=z3, outcome="running", with_metrics=False),
        "h100-b-1": RunSpec("h100", parallelism=z2, tokens_per_s=9000, allocated_s=1700),
        "h100-b-2": RunSpec("h100", parallelism=z2, tokens_per_s=9100, allocated_s=1700),
        "a100-7b-1": RunSpec("a100", parallelism=z3, tokens_per_s=5000, mfu=0.5, allocated_s=1500),
        "a100-7b-2": RunSpec("a100", parallelism=z3, tokens_per_s=5100, mfu=0.5, allocated_s=1500),
        "l40s-7b-1": RunSpec(
            "l40s",
            outcome="failed",
            reason="oom",
            tokens_per_s=None,
            peak_gib=48.0,
            allocated_s=120,
            verified_ckpts=0,
        ),
        "l40s-7b-2": RunSpec("l40s", outcome="failed", reason="crash", with_metrics=False),
        "h200-7b-1": RunSpec("h200", parallelism=z3, tokens_per_s=14000, peak_gib=60.0),
        "a100-1b-1": RunSpec("a100", model="llama-1b", parallelism="zero2-1x4-mb4-ga1", tokens_per_s=40000),
        "a100-1b-2": RunSpec("a100", model="llama-1b", parallelism="zero2-1x4-mb4-ga1", tokens_per_s=41000),
    }


# References used with the fake sweep: a generic bar, per-partition throughput, and a typo.
FAKE_REFERENCES = """\
references:
  "*":
    ckpt/verified: [1.0, 0.0, null, "bool"]       # restore must be bit-exact
  h100/llama-7b/bf16:
    perf/tokens_per_s: [11000, -0.25, null, "tokens/s"]
  a100/llama-7b/bf16:
    perf/tokens_per_s: [7000, -0.1, null, "tokens/s"]
  h200:
    perf/tokens_per_sec: [10000, -0.1, null, "tokens/s"]   # typo: no run has this key
"""


def make_fake_sweep(
    uri: str,
    sweep_id: str = "20261129-171500-ab12",
    start_ms: int | None = None,
    cluster: dict[str, str] | None = None,
    specs: dict[str, RunSpec] | None = None,
) -> FakeSweep:
    """The fake sweep (fake_specs, or `specs`); `cluster`: {name, controller, slurm_version}, the
    cluster its runs are tagged with (none by default: a sweep recorded before issue 36)."""
    sweep = start_sweep(uri, sweep_id, start_ms=start_ms, cluster=cluster)
    client = MlflowClient(tracking_uri=uri)
    t0 = int(time.time() * 1000) if start_ms is None else start_ms
    for i, (name, spec) in enumerate((specs or fake_specs()).items()):
        log_run(client, sweep, spec, name, t0 + 1000 * (i + 1))
    return sweep


def many_specs(n: int) -> list[RunSpec]:
    """n runs over 4 partitions x 2 models x 2 precisions x 3 parallelisms (48 candidates),
    about one in ten failed, a few with drills."""
    specs = []
    parts = ["h100", "a100", "l40s", "h200"]
    pars = ["zero2-1x4-mb1-ga1", "zero3-1x4-mb1-ga1-ac", "zero3-1x4-mb2-ga2"]
    for i in range(n):
        failed = i % 10 == 9
        specs.append(
            RunSpec(
                parts[i % 4],
                model=("llama-7b", "llama-1b")[(i // 4) % 2],
                precision=("bf16", "fp16")[(i // 8) % 2],
                parallelism=pars[(i // 16) % 3],
                outcome="failed" if failed else "accepted",
                reason="crash" if failed else "",
                drills="preempt" if i % 7 == 0 else "none",
                tokens_per_s=8000 + (i * 37) % 4000,
                allocated_s=1200 + (i * 13) % 600,
                verified_ckpts=0 if failed else 1,
            )
        )
    return specs


def make_many_runs(uri: str, n: int, sweep_id: str = "20261130-090000-bench") -> FakeSweep:
    """n child runs of many_specs, in one transaction (bulk_insert_runs)."""
    sweep = start_sweep(uri, sweep_id)
    t0 = int(time.time() * 1000)
    contents = [run_content(sweep, spec, f"p{i:05d}", t0 + i) for i, spec in enumerate(many_specs(n))]
    bulk_insert_runs(sweep, contents)
    return sweep
