"""The micro-batch search: its plan (pure), its bad input (refused before submission), and a real
2-rank CPU search under a real memory limit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pipeline.config.validate import point_problems
from pipeline.contract.outcome import Reason
from pipeline.job.results import classify
from pipeline.job.search import next_size
from pipeline.tracking import keys as K
from tests.support.helpers import compose, launch_ranks, point_runs, write_spec


def _simulate(limit: int, start: int, cap: int) -> list[int]:
    tried: list[tuple[int, bool]] = []
    while (b := next_size(tried, start, cap)) is not None:
        tried.append((b, b <= limit))
    return [b for b, _ in tried]


@pytest.mark.parametrize(
    ("limit", "start", "cap"), [(13, 2, 64), (1, 1, 64), (64, 4, 64), (40, 3, 100), (0, 4, 64)]
)
def test_plan_doubles_then_bisects(limit: int, start: int, cap: int) -> None:
    tried = _simulate(limit, start, cap)
    fits = [b for b in tried if b <= limit]
    found = max(fits, default=0)
    assert found == min(limit, cap)  # the boundary, exactly
    if found < cap:
        assert found + 1 in tried or found == 0 and 1 in tried  # the next size up was tried and failed
    doubling = math.ceil(math.log2(max(found, 1) / start)) if found >= start else 0
    bisection = len(tried) - doubling - 2
    assert bisection <= math.ceil(math.log2(max(2, start))) + math.ceil(math.log2(max(found, 1))) + 1
    assert len(tried) == len(set(tried))  # no size twice


def test_plan_examples() -> None:
    assert _simulate(13, 2, 64) == [2, 4, 8, 16, 12, 14, 13]
    assert _simulate(64, 4, 64) == [4, 8, 16, 32, 64]  # the cap, fitting, ends it
    assert _simulate(0, 4, 64) == [4, 2, 1]  # nothing fits


def test_cpu_allocation_failure_is_oom() -> None:
    err = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
        "to allocate 838860800 bytes. Error code 12 (Cannot allocate memory)"
    )
    assert classify(err)[1] == Reason.OOM
    assert classify(MemoryError())[1] == Reason.OOM
    import torch.distributed as dist

    assert classify(dist.DistNetworkError("Connection closed by peer"))[1] == Reason.CRASH


def test_bad_search_input_is_refused() -> None:
    cap = point_problems(compose(["search.micro_batch=true", "search.start=8", "search.cap=4"]))
    assert any("search.cap=4 is below search.start=8" in p for p in cap)
    small = point_problems(
        compose(["search.micro_batch=true", "model=gpt2-125m", "partition.gpu_mem_gib=0.5"])
    )
    assert any("below the model states alone" in p for p in small)
    assert point_problems(compose(["search.micro_batch=true", "partition.gpu_mem_gib=2.5"])) == []


SEARCH = [
    "model=tiny",
    "model.vocab_size=8192",
    "model.seq_len=256",
    "precision=fp32",
    "parallelism=zero2",
    "drill=none",
    "train.steps=4",
    "train.warmup_steps=1",
    "train.measure_comm=false",
    "train.measure_ceiling=false",
    "search.micro_batch=true",
    "train.loss_bound_frac=1.0",
    "search.start=8",
    "search.cap=128",
    "partition.gpu_mem_gib=3",  # DeepSpeed allocates a 2e9-byte reduce bucket (fp32) first
]


@pytest.mark.slow
@pytest.mark.long(114)
def test_search_finds_the_boundary_under_a_real_memory_limit(tmp_path: Path, sqlite_uri: str) -> None:
    point = tmp_path / "point"
    out = launch_ranks(write_spec(tmp_path, point, SEARCH, sqlite_uri), timeout=600)
    logs = out[0].stdout[-4000:] + out[1].stdout[-3000:]
    outcome = json.loads((point / "outcome.json").read_text())
    assert outcome["reason"] not in (Reason.OOM, Reason.CRASH), (outcome, logs)  # ran at the found size
    assert out[0].returncode == out[1].returncode, logs  # both ranks ended the same way: none hung
    res = json.loads((point / "search.json").read_text())
    trials = res["trials"]
    found = res["micro_batch"]
    assert found >= 8, logs
    over = [t for t in trials if t["micro_batch"] > found]
    assert over, "the search never met a failure"
    nearest = min(over, key=lambda t: t["micro_batch"])
    assert nearest["micro_batch"] == found + 1 and not nearest["fits"]
    assert any(t["oom"] and "allocate memory" in t["error"] for t in over), trials  # a real failure
    doubling = math.ceil(math.log2(found / 8))
    bisection = len([t for t in trials if t["micro_batch"] not in {8 * 2**i for i in range(12)}])
    assert len(trials) <= doubling + 2 + bisection
    run = point_runs(sqlite_uri)[0]
    assert run.data.metrics[K.SEARCH_MICRO_BATCH] == found
    assert f"-mb{found}-" in outcome["candidate"]  # the rest of the point ran at the found size
    from mlflow.tracking import MlflowClient

    hist = MlflowClient(sqlite_uri).get_metric_history(run.info.run_id, K.SEARCH_TRIAL_MICRO_BATCH)
    assert sorted(m.value for m in hist) == sorted(t["micro_batch"] for t in trials)  # every trial logged


ASYMMETRIC = """
import sys, time
import torch, torch.distributed as dist
from deepspeed.utils import groups
from pipeline.job.distributed import init_process_group
from pipeline.job.search import _Phases, trial_group

init_process_group("cpu", 60)
rank = dist.get_rank()
ph = _Phases("cpu")
t0 = time.monotonic()
with trial_group(3):
    def bucket():
        # the engine's collectives run on DeepSpeed's clone of the world group; rank 1 fails an
        # allocation before the all-reduce that rank 0 already waits in
        if rank == 1:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes")
        dist.all_reduce(torch.ones(4), group=groups._clone_world_group())
    ok = ph.run(bucket)
waited = time.monotonic() - t0
with trial_group(3):  # the next trial's group is in step
    t = torch.ones(2) * (rank + 1)
    dist.all_reduce(t, group=groups._clone_world_group())
import json
print("RESULT", json.dumps([ok, waited, t.tolist(), ph.error]), flush=True)
"""


@pytest.mark.slow
def test_a_trial_failed_on_one_rank_between_collectives_fails_on_both() -> None:
    """The failure the search meets at the boundary: one rank runs out of memory between two of
    the engine's collectives while the other waits in one. Both ranks agree the trial failed,
    within the trial's timeout, and the next trial's collectives are in step (real gloo)."""
    import sys

    out = launch_ranks(None, timeout=120, command=[sys.executable, "-c", ASYMMETRIC])
    logs = out[0].stdout[-3000:] + out[1].stdout[-3000:]
    results = [
        line.split(" ", 1)[1] for o in out for line in o.stdout.splitlines() if line.startswith("RESULT")
    ]
    assert len(results) == 2, logs
    (ok0, waited0, sum0, err0), (ok1, waited1, sum1, err1) = (json.loads(r) for r in results)
    assert ok0 is False and ok1 is False, logs
    assert max(waited0, waited1) < 30, logs  # the trial's 3 s timeout, not the job's 60 s
    assert sum0 == sum1 == [3.0, 3.0], logs  # 1 + 2 on both ranks: the next group is in step
    assert err1.startswith("RuntimeError: DefaultCPUAllocator: can't allocate memory"), logs  # why it failed
    assert err0.startswith("another rank failed the trial: ") and "Timed out" in err0, logs  # rank 0 waited
