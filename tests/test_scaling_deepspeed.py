"""What DeepSpeed really issues in one ZeRO step, counted over gloo on 2 CPU ranks, against the
communication model's bytes per stage (pipeline/measure/scaling.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.measure.scaling import wire_bytes_per_rank, zero_collectives

REPO = Path(__file__).resolve().parents[1]

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
