"""What DeepSpeed really issues in one ZeRO step, counted over gloo on 2 CPU ranks, against the
communication model's bytes per stage (pipeline/measure/scaling.py)."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.measure.scaling import bucket_messages, wire_bytes_per_rank, zero_collectives

REPO = Path(__file__).resolve().parents[2]

# Psi = 256x512 + 512 + 512x256 + 256 = 262,912 fp32 parameters = 1,051,648 bytes (by hand)
PSI_BYTES = 1_051_648
SMALL = 1024  # scalar collectives (the overflow / norm all-reduce, ZeRO-3's bookkeeping broadcasts)

_WORKER = """
import json, sys
import torch, deepspeed
import torch.distributed as dist
from pipeline.train.commtimer import CollectiveCounter

dist.init_process_group("gloo")
out = {}
cases = {"0": {}, "1": {}, "2": {}, "3": {},
         "3-released": {"stage3_max_reuse_distance": 0, "stage3_param_persistence_threshold": 0,
                        "stage3_prefetch_bucket_size": 0},
         "2-reduce": {"use_multi_rank_bucket_allreduce": False}}
for name, extra in cases.items():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cfg = {"train_micro_batch_size_per_gpu": 4, "train_batch_size": 8, "steps_per_print": 10**9,
           "zero_optimization": dict({"stage": int(name[0])}, **extra), "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, model_parameters=model.parameters(), config=cfg)
    x = torch.randn(4, 256)
    for counted in (False, True):  # the first step builds buffers; the second is counted
        with CollectiveCounter() as c:
            loss = engine(x).pow(2).mean()
            engine.backward(loss)
            engine.step()
    out[name] = {op: t.sizes for op, t in c.counts.ops.items()}
    out[name + ":wire"] = c.counts.wire_bytes
    engine.destroy()

# buckets: 8 x Linear(64, 64) (4,160 parameters each), caps of 2 layers (8,320 elements)
B = 8320
buckets = {"0": {"reduce_bucket_size": B},
           "1": {"reduce_bucket_size": B, "allgather_bucket_size": B},
           "2": {"reduce_bucket_size": B, "allgather_bucket_size": B},
           "3": {"reduce_bucket_size": B, "stage3_prefetch_bucket_size": B,
                 "stage3_param_persistence_threshold": 0},
           "3-whole": {"stage3_param_persistence_threshold": 0}}
for name, extra in buckets.items():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cfg = {"train_micro_batch_size_per_gpu": 4, "train_batch_size": 8, "steps_per_print": 10**9,
           "zero_optimization": dict({"stage": int(name[0])}, **extra), "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, model_parameters=model.parameters(), config=cfg)
    for counted in (False, True):
        with CollectiveCounter() as c:
            engine.backward(engine(torch.randn(4, 64)).pow(2).mean())
            engine.step()
    out["bucket:" + name] = {op: t.sizes for op, t in c.counts.ops.items()}
    engine.destroy()

# the step timer on a real ZeRO-2 engine, hooked as the job hooks it (in_step then after_step)
from types import SimpleNamespace
from pipeline.train.commtimer import StepCommTimer
from pipeline.job.commsplit import step_metrics
import time

class Sink:
    logged = {}
    def log_metrics(self, metrics, step=None):
        self.logged[step] = dict(metrics)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
cfg = {"train_micro_batch_size_per_gpu": 4, "train_batch_size": 8, "steps_per_print": 10**9,
       "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
engine, *_ = deepspeed.initialize(model=model, optimizer=opt, model_parameters=model.parameters(), config=cfg)
timer = StepCommTimer("cpu", every=1, metrics=step_metrics)
trainer = SimpleNamespace(engine=engine, sink=Sink(), world_size=2,
                          result=SimpleNamespace(step_times={}, data_wait={}))
def train_step(n):
    timer.in_step(trainer, n)
    loss = engine(torch.randn(4, 256)).pow(2).mean()
    engine.backward(loss)
    engine.step()
trainer.train_step = train_step
for n in (1, 2, 3):
    t0 = time.perf_counter()
    trainer.train_step(n)
    trainer.result.step_times[n] = time.perf_counter() - t0
    trainer.result.data_wait[n] = 0.0
    timer.after_step(trainer, n)
out["timer"] = {str(k): v for k, v in trainer.sink.logged.items()}
out["split"] = {str(k): [s.step_s, s.compute_s, s.exposed_s, s.optimizer_s] for k, s in timer.splits.items()}
json.dump(out, open(sys.argv[1], "w"))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _large(sizes: dict[str, list[int]]) -> dict[str, int]:
    """Bytes per op over the collectives that carry the model (SMALL ones left out)."""
    out = {op: sum(s for s in calls if s >= SMALL) for op, calls in sizes.items()}
    return {op: b for op, b in out.items() if b}


def _model(stage: int, volume: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in zero_collectives(stage, PSI_BYTES, volume=volume):
        out[c.op] = out.get(c.op, 0) + int(c.size_bytes)
    return out


@pytest.mark.slow
def test_deepspeed_issues_the_modelled_bytes(tmp_path: Path) -> None:
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=str(REPO))
        cmd = [sys.executable, "-c", _WORKER, str(tmp_path / f"rank{rank}.json")]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env))
    for p in procs:
        assert p.wait(timeout=600) == 0
    got = json.loads((tmp_path / "rank0.json").read_text())
    # ZeRO-0: the gradients all-reduced, as the paper and the "deepspeed" volume say
    assert _large(got["0"]) == _model(0, "paper") == {"all_reduce": PSI_BYTES}
    # ZeRO-1/2: DeepSpeed all-reduces the gradient buckets (not the paper's reduce-scatter),
    # then all-gathers the updated parameters: 3 Psi (n-1)/n on the wire, not 2
    for stage in ("1", "2"):
        assert _large(got[stage]) == _model(int(stage), "deepspeed")
        assert _large(got[stage]) != _model(int(stage), "paper")
    # without multi-rank bucket all-reduce, one reduce per owner: Psi in all
    assert _large(got["2-reduce"]) == {"reduce": PSI_BYTES, "all_gather": PSI_BYTES}
    # ZeRO-3 with parameters released after use: the paper's all-gather in forward and again in
    # backward, and a reduce-scatter of the gradients
    assert (
        _large(got["3-released"])
        == _model(3, "paper")
        == {"all_gather": 2 * PSI_BYTES, "reduce_scatter": PSI_BYTES}
    )
    # ZeRO-3 with DeepSpeed's defaults keeps a model this small gathered into backward: one all-gather
    assert _large(got["3"]) == {"all_gather": PSI_BYTES, "reduce_scatter": PSI_BYTES}
    # the wire bytes per rank (2 ranks: bus factor 1 for all-reduce, 1/2 for the others), by hand
    assert got["2:wire"] == pytest.approx(PSI_BYTES * 1.5, abs=SMALL)
    assert wire_bytes_per_rank(zero_collectives(2, PSI_BYTES, volume="deepspeed"), 2) == PSI_BYTES * 1.5
    _check_step_timer(got)
    _check_buckets(got)


# 8 x Linear(64, 64): 8 x (64 x 64 + 64) = 33,280 fp32 parameters, 133,120 bytes; a cap of
# 8,320 elements holds two layers: 33,280 bytes (by hand)
LAYERS_BYTES, CAP = 133_120, 8320
CAP_BYTES = 33_280


def _check_buckets(got: dict) -> None:
    """The messages DeepSpeed sent, per op (scalar ones left out), against the hand-computed
    bucket sizes and against bucket_messages' prediction from the same config."""
    cases = {
        # ZeRO-0 all-reduces in buckets of 5e8 elements whatever reduce_bucket_size says
        "0": ({"reduce_bucket_size": CAP}, {"all_reduce": [LAYERS_BYTES]}),
        # ZeRO-1/2: all-reduces of reduce_bucket_size, one all-gather of the whole partition
        # (allgather_bucket_size is not used with all_gather_into_tensor)
        "1": (
            {"reduce_bucket_size": CAP, "allgather_bucket_size": CAP},
            {"all_reduce": [CAP_BYTES] * 4, "all_gather": [LAYERS_BYTES]},
        ),
        "2": (
            {"reduce_bucket_size": CAP, "allgather_bucket_size": CAP},
            {"all_reduce": [CAP_BYTES] * 4, "all_gather": [LAYERS_BYTES]},
        ),
        # ZeRO-3: all-gathers of stage3_prefetch_bucket_size, reduce-scatters of reduce_bucket_size
        "3": (
            {"reduce_bucket_size": CAP, "stage3_prefetch_bucket_size": CAP},
            {"all_gather": [CAP_BYTES] * 4, "reduce_scatter": [CAP_BYTES] * 4},
        ),
        # the defaults' buckets are larger than the model: it goes whole
        "3-whole": ({}, {"all_gather": [LAYERS_BYTES], "reduce_scatter": [LAYERS_BYTES]}),
    }
    for name, (zero, expected) in cases.items():
        counted = {op: [s for s in sizes if s >= SMALL] for op, sizes in got["bucket:" + name].items()}
        assert {op: sizes for op, sizes in counted.items() if sizes} == expected, name
        predicted = bucket_messages(int(name[0]), zero, LAYERS_BYTES // 4, 4, 4)
        assert {c.op: c.size_bytes for c in predicted} == {op: max(s) for op, s in expected.items()}, name


def _check_step_timer(got: dict) -> None:
    """The step timer: the first step it sees is not timed, the next ones are split and logged."""
    assert set(got["split"]) == {"2", "3"}
    for step, (step_s, compute, exposed, optimizer) in got["split"].items():
        assert exposed > 0 and optimizer > 0 and compute > 0
        assert compute + exposed + optimizer == pytest.approx(step_s, rel=1e-9)
        m = got["timer"][step]
        assert m["comm/exposed_s"] == exposed and m["perf/compute_s"] == compute
        # the model's bytes, plus the scalar all-reduce (overflow / norm) DeepSpeed adds
        assert PSI_BYTES <= m["comm/step_all_reduce_bytes"] < PSI_BYTES + SMALL
        assert m["comm/step_all_gather_bytes"] == PSI_BYTES
        assert m["comm/step_wire_bytes"] == pytest.approx(1.5 * PSI_BYTES, abs=SMALL)
        transfer = exposed - m["comm/skew_s"]  # the barrier before each collective took the skew
        assert 0 < transfer <= exposed
        assert m["comm/step_busbw_gbps"] == pytest.approx(m["comm/step_wire_bytes"] / transfer / 1e9)


@pytest.mark.slow
def _run_point(tmp_path: Path, sqlite_uri: str, overrides: list[str]) -> Any:
    """One tiny point on 2 gloo ranks (the job's own entry), without the matmul ceiling; its run."""
    from tests.support.helpers import launch_ranks, point_runs, write_spec

    spec = write_spec(
        tmp_path, tmp_path / "point", ["model=tiny", *overrides, "train.measure_ceiling=false"], sqlite_uri
    )
    results = launch_ranks(spec, timeout=600)
    assert all(r.returncode == 0 for r in results), results[0].stdout[-3000:]
    (run,) = point_runs(sqlite_uri)
    return run


def test_a_two_rank_point_logs_its_step_split(tmp_path: Path, sqlite_uri: str) -> None:
    """A real 2-rank point through the job entry: the split and the collectives per timed step
    are logged, and the run carries its series tag."""
    from mlflow.tracking import MlflowClient

    run = _run_point(tmp_path, sqlite_uri, ["precision=fp32", "parallelism=zero2", "train.steps=8"])
    # the series: the sweep id and the candidate without its size (1 node x 2 GPUs)
    assert run.data.tags["sq.series"] == "test/" + run.data.tags["sq.candidate"].replace("-1x2-", "-")
    client = MlflowClient(tracking_uri=sqlite_uri)
    history = {
        k: {m.step: m.value for m in client.get_metric_history(run.info.run_id, k)}
        for k in (
            "perf/step_time_s",
            "perf/timed_step_s",
            "perf/compute_s",
            "comm/exposed_s",
            "perf/optimizer_s",
            "data/wait_s",
            "comm/step_all_gather_bytes",
            "comm/step_busbw_gbps",
        )
    }
    assert set(history["comm/exposed_s"]) == {4, 8}  # one step in 4 is timed
    for step in (4, 8):
        parts = sum(
            history[k][step] for k in ("perf/compute_s", "comm/exposed_s", "perf/optimizer_s", "data/wait_s")
        )
        assert parts == pytest.approx(history["perf/step_time_s"][step], rel=1e-6)
        assert history["perf/timed_step_s"][step] == history["perf/step_time_s"][step]
        assert history["comm/exposed_s"][step] > 0 and history["comm/step_busbw_gbps"][step] > 0
        assert history["comm/step_all_gather_bytes"][step] > 0
    # the probe at ZeRO-2's messages: the tiny model (106,816 fp32 parameters, 427,264 bytes) is
    # under DeepSpeed's 5e8-element buckets, so each goes whole
    _check_bucket_probe(run.data.metrics, {"all_reduce": 427_264, "all_gather": 427_264})


def _check_bucket_probe(metrics: dict[str, float], expected: dict[str, int]) -> None:
    """The bucket keys of the ops the stage sends, at the hand-computed sizes, positive and finite
    bandwidths; none for the others; the plateau of all three ops at train.comm_sizes_mb."""
    logged = {k: v for k, v in metrics.items() if k.startswith("comm/bucket_")}
    assert logged.keys() == {
        f"comm/bucket_{op}_{what}" for op in expected for what in ("bytes", "busbw_gbps")
    }
    for op, size in expected.items():
        assert metrics[f"comm/bucket_{op}_bytes"] == size
        assert 0 < metrics[f"comm/bucket_{op}_busbw_gbps"] < math.inf
    for key in ("comm/allreduce_busbw_gbps", "comm/reducescatter_busbw_gbps", "comm/allgather_busbw_gbps"):
        assert 0 < metrics[key] < math.inf


@pytest.mark.slow
def test_a_zero3_point_probes_its_buckets(tmp_path: Path, sqlite_uri: str) -> None:
    """ZeRO-3 in bf16: the all-gather and the reduce-scatter at the whole tiny model, 106,816 x 2
    bytes (under both default buckets)."""
    run = _run_point(tmp_path, sqlite_uri, ["precision=bf16", "parallelism=zero3", "train.steps=4"])
    _check_bucket_probe(run.data.metrics, {"all_gather": 213_632, "reduce_scatter": 213_632})
