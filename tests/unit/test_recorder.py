"""The attempt's recorder (pipeline.job.recorder): the one door by which metrics, params, tags
and artifacts leave the job. A scan holds every module of the job, the drills and the trainer
to it; the recorder itself is checked against a real ledger and a real MLflow store."""

from __future__ import annotations

import ast
import json
import math
import textwrap
from pathlib import Path

import pytest

from pipeline.config.schema import Config
from pipeline.contract.pointdir import PointDir
from pipeline.contract.spec import JobSpec
from pipeline.job.distributed import RankEnv
from pipeline.job.recorder import Recorder
from pipeline.tracking import keys as K
from pipeline.tracking.ledger import NullTracker, Tracker

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("pipeline/job", "pipeline/drills", "pipeline/train")  # where an attempt runs
DOOR = "pipeline/job/recorder.py"
TRAIN = "pipeline/train"
# what a tracker (ours, MLflow's client or its fluent API) is told to record
RECORDING = {
    "log_metrics",
    "log_metric",
    "log_batch",
    "log_params",
    "log_param",
    "set_tags",
    "set_tag",
    "log_artifact",
    "log_artifacts",
    "set_terminated",
}
TRACKERS = {"Tracker", "NullTracker"}  # pipeline.tracking.ledger's: the recorder builds them


def door_breaches(source: str, rel: str) -> list[str]:
    """What in one module reaches a tracker other than through the recorder: a tracker named
    (`ctx.tracker`, `tracker`), a tracker class imported, or a recording call. The trainer's
    package may call `log_metrics` on its sink (the MetricsSink protocol the recorder
    implements), nothing else."""
    if rel == DOOR:
        return []
    out = []
    for node in ast.walk(ast.parse(source)):
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Attribute) and node.attr == "tracker":
            out.append(f"{where}: {ast.unparse(node)}")
        elif isinstance(node, ast.Name) and node.id == "tracker":
            out.append(f"{where}: {node.id}")
        elif isinstance(node, ast.ImportFrom) and TRACKERS & {a.name for a in node.names}:
            out.append(f"{where}: imports {', '.join(sorted(TRACKERS & {a.name for a in node.names}))}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in RECORDING
        ):
            receiver = ast.unparse(node.func.value)
            on_sink = node.func.attr == "log_metrics" and receiver.split(".")[-1] == "sink"
            if not (rel.startswith(TRAIN + "/") and on_sink):
                out.append(f"{where}: {receiver}.{node.func.attr}(...)")
    return out


def scan(root: Path) -> list[str]:
    out = []
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            out += door_breaches(path.read_text(), rel)
    return sorted(set(out))


def test_metrics_leave_the_job_by_the_recorder_alone() -> None:
    assert scan(REPO) == [], (
        "only pipeline/job/recorder.py reaches the tracker: log through the attempt's Recorder "
        "(log, series, tags, params, artifact), the trainer through its sink"
    )


@pytest.mark.parametrize(
    ("rel", "source"),
    [  # the three doors main had (runner, observer and reshape drill; MetricLog), and others
        ("pipeline/job/runner.py", "self.tracker.log_metrics(m, step=i)"),
        ("pipeline/job/observe.py", "self.cfg, self.tracker = ctx.cfg, ctx.tracker"),
        ("pipeline/job/drills/reshape.py", "attempt.tracker.log_metrics({'x': 1.0}, step=3)"),
        ("pipeline/job/attempt.py", "def log(self, m):\n    tracker.log_metrics(m)"),
        ("pipeline/job/entry.py", "from pipeline.tracking.ledger import NullTracker, flatten"),
        ("pipeline/job/runner.py", "self.recorder.log_metrics(m, step=i)"),  # the sink is the trainer's
        ("pipeline/drills/reshape.py", "import mlflow\nmlflow.log_metric('x', 1.0)"),
        ("pipeline/train/trainer.py", "self.client.log_batch(run_id, metrics=[])"),
        ("pipeline/train/commtimer.py", "trainer.sink.set_tags({'a': 'b'})"),
    ],
)
def test_the_scan_finds_a_second_door(rel: str, source: str) -> None:
    assert door_breaches(textwrap.dedent(source), rel)


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("pipeline/train/trainer.py", "self.sink.log_metrics({'x': 1.0}, step=step)"),
        ("pipeline/train/commtimer.py", "trainer.sink.log_metrics(m, step=step)"),
        ("pipeline/job/recorder.py", "self.tracker.log_metrics(metrics, step)"),
        ("pipeline/job/runner.py", "self.recorder.series(m, step=i); self.recorder.tags({'a': 'b'})"),
    ],
)
def test_the_scan_lets_the_door_and_the_sink_pass(rel: str, source: str) -> None:
    assert door_breaches(source, rel) == []


# -- the recorder against a real ledger and MLflow store ------------------------------------------


def _spec(tmp_path: Path, uri: str) -> JobSpec:
    return JobSpec(
        sweep_id="s1",
        point_id="p0",
        config_yaml="",
        point_dir=str(tmp_path / "point"),
        parent_run_id=None,
        tracking_uri=uri,
        launcher="local",
    )


def _rank(rank: int) -> RankEnv:
    return RankEnv(rank, 2, rank, "127.0.0.1", 29500, "local", "node0", ["node0"])


def _ledger(spec: JobSpec) -> list[dict]:
    path = PointDir(spec.point_dir).tracking / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_what_the_recorder_logs_reaches_the_ledger_and_mlflow_with_its_step(
    tmp_path: Path, sqlite_uri: str
) -> None:
    from mlflow.tracking import MlflowClient

    spec = _spec(tmp_path, sqlite_uri)
    rec = Recorder.open(spec, Config(), _rank(0))
    assert isinstance(rec.tracker, Tracker)
    rec.params({"model.name": "tiny"})
    rec.log({K.PERF_CEILING_TFLOPS: 2.5, K.PERF_MFU: None})  # MFU could not be computed
    rec.log({K.RESTART_COLD_START_S: 7.0}, step=1)
    rec.series({K.TRAIN_LOSS: 4.0, K.DATA_WAIT_S: None}, step=3)
    rec.log_metrics({K.TRAIN_LOSS: math.nan}, step=4)  # the trainer's sink: a diverged loss is a value
    rec.series({K.PERF_MFU: None}, step=5)  # nothing left to send: no event
    rec.tags({K.TAG_OUTCOME: "accepted"})
    rec.close("FINISHED")

    # the outcome keeps the attempt's metrics, not the points of a series, and no None
    assert rec.values == {K.PERF_CEILING_TFLOPS: 2.5, K.RESTART_COLD_START_S: 7.0}
    metrics = [(e["d"], e["s"]) for e in _ledger(spec) if e["k"] == "m"]
    assert len(metrics) == 4
    assert metrics[:3] == [
        ({K.PERF_CEILING_TFLOPS: 2.5}, None),
        ({K.RESTART_COLD_START_S: 7.0}, 1),
        ({K.TRAIN_LOSS: 4.0}, 3),
    ]
    assert metrics[3][1] == 4 and math.isnan(metrics[3][0][K.TRAIN_LOSS])

    client = MlflowClient(tracking_uri=sqlite_uri)
    run = client.get_run(rec.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"model.name": "tiny"}
    assert run.data.tags[K.TAG_OUTCOME] == "accepted"
    assert K.PERF_MFU not in run.data.metrics and K.DATA_WAIT_S not in run.data.metrics  # absent, not 0
    history = {
        k: [(m.step, m.value) for m in client.get_metric_history(rec.run_id, k)] for k in run.data.metrics
    }
    assert history[K.PERF_CEILING_TFLOPS] == [(0, 2.5)]
    assert history[K.RESTART_COLD_START_S] == [(1, 7.0)]
    loss = sorted(history[K.TRAIN_LOSS])
    assert loss[0] == (3, 4.0) and loss[1][0] == 4 and math.isnan(loss[1][1])


@pytest.mark.parametrize("off", ["another rank", "tracking off"])
def test_only_rank_0_records_but_every_rank_keeps_its_values(tmp_path: Path, off: str) -> None:
    spec = _spec(tmp_path, f"sqlite:///{tmp_path / 'never.db'}")
    cfg = Config()
    if off == "tracking off":
        cfg.tracking.enabled = False
    rec = Recorder.open(spec, cfg, _rank(1 if off == "another rank" else 0))
    assert type(rec.tracker) is NullTracker
    rec.log({K.MEM_CAPACITY_GIB: 80.0, K.PERF_MFU: None})
    rec.series({K.TRAIN_LOSS: 4.0}, step=1)
    rec.tags({K.TAG_OUTCOME: "accepted"})
    rec.close()
    assert rec.values == {K.MEM_CAPACITY_GIB: 80.0}  # the stages read them on every rank
    assert rec.run_id is None
    assert not PointDir(spec.point_dir).tracking.exists() and not (tmp_path / "never.db").exists()
