"""Checkpoint and restart figures, measured side by side in one run (issue goals):

  1. checkpoint write GB/s  /  the disk's fsync'd sequential write GB/s    (goal >= 0.8)
     for a real DeepSpeed ZeRO-2 (or --zero 3) checkpoint of at least 1 GB, saved through the pipeline's
     CheckpointManager (staged, fsynced, hashed, manifest, atomic rename), 2 gloo ranks;
  2. restart time minus the scheduler's wait  /  (process start -> engine ready + read time)
     (goal <= 1.2), from a real preemption drill on the local executor.

Run: .venv/bin/python benchmarks/bench_checkpoint.py [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

# ~90 M parameters: 4 + 12 bytes/param of fp32 weights and Adam state -> ~1.5 GB on disk
WIDE = [
    "model.hidden=1024",
    "model.n_layers=6",
    "model.n_heads=8",
    "model.n_kv_heads=8",
    "model.ffn_hidden=2816",
    "model.vocab_size=8192",
    "model.seq_len=64",
]


def disk_write_gbps(folder: Path, nbytes: int, chunk: int = 8 << 20, repeats: int = 3) -> float:
    """Sequential write of `nbytes` with one fsync at the end, like a checkpoint file; best of
    a few, each file deleted before the next (the same page-cache state as pruned checkpoints)."""
    path = folder / "seqwrite.bin"
    buf = os.urandom(chunk)
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            for _ in range(nbytes // chunk):
                f.write(buf)
            f.flush()
            os.fsync(f.fileno())
        best = max(best, nbytes / (time.perf_counter() - t0) / 1e9)
        path.unlink()
    return best


SAVER = """
import json, os, sys, time
from pathlib import Path
from pipeline.compose import config_from_yaml
from pipeline.distributed import init_process_group, rank_env_from_environ
from pipeline.job import JobSpec
from pipeline.trainer import Trainer, run_dir_checkpoints
spec = JobSpec(**json.loads(Path(sys.argv[1]).read_text()))
cfg = config_from_yaml(spec.config_yaml)
renv = rank_env_from_environ()
init_process_group("cpu", 600)
ck = run_dir_checkpoints(Path(spec.point_dir), cfg.train, renv.rank, renv.world_size)
tr = Trainer(cfg.model, cfg.precision, cfg.parallelism, cfg.train, renv.rank, renv.world_size, "cpu", ck)
tr.setup()
tr.train()
stats = [tr.save(cfg.train.steps + i) for i in range(4)]
if renv.rank == 0:
    print("SAVE " + json.dumps([{"bytes": s.bytes, "seconds": s.seconds} for s in stats]), flush=True)
"""


def checkpoint_write_gbps(tmp: Path, zero: int) -> tuple[float, int]:
    from helpers import PY, launch_ranks, write_spec

    overrides = [
        "model=tiny",
        *WIDE,
        "precision=fp32",
        f"parallelism=zero{zero}",
        "train.steps=1",
        "train.warmup_steps=0",
        "train.keep_last=1",
    ]
    spec = write_spec(tmp, tmp / "ckpt", overrides, f"sqlite:///{tmp / 'm.db'}", "ckpt")
    results = launch_ranks(spec, timeout=1800, command=[PY, "-c", SAVER])
    outs = [r.stdout for r in results]
    line = next((ln for ln in outs[0].splitlines() if ln.startswith("SAVE ")), None)
    assert line, outs[0][-3000:]
    saves = json.loads(line[5:])
    # steady state, as in a run that keeps the last K: from the third save on, the pruned
    # checkpoints' page cache is being reused, as the disk baseline's is
    best = max(s["bytes"] / s["seconds"] / 1e9 for s in saves[2:])
    return best, saves[0]["bytes"]


def restart_ratio(tmp: Path) -> dict[str, float]:
    from helpers import point_runs, qualify

    uri = f"sqlite:///{tmp / 'drill.db'}"
    res = qualify(
        [
            "sweep",
            "--sweep",
            "smoke",
            "--launcher",
            "local",
            f"runs_dir={tmp / 'runs'}",
            f"tracking.uri={uri}",
            "drill=preempt",
            "drill.preempt.trigger=local",
            "train.steps=20",
            "drill.reference=false",
        ]
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (run,) = point_runs(uri)
    return {k.split("/")[1]: v for k, v in run.data.metrics.items() if k.startswith("restart/")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None, help="where to write (default: a temp folder on the runs disk)")
    ap.add_argument("--zero", type=int, default=2, choices=(1, 2, 3), help="ZeRO stage of the checkpoint")
    args = ap.parse_args()
    base = Path(args.dir) if args.dir else REPO / "runs"
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as d:
        tmp = Path(d)
        ckpt_gbps, nbytes = checkpoint_write_gbps(tmp, args.zero)
        disk_gbps = disk_write_gbps(tmp, max(nbytes, 1 << 30))
        r = restart_ratio(tmp)
    print(
        f"checkpoint: {nbytes / 1e9:.2f} GB over 2 ranks (ZeRO-{args.zero}, fp32 + Adam), staged, fsynced, hashed, renamed"
    )
    print(f"  checkpoint write      {ckpt_gbps:7.3f} GB/s")
    print(f"  disk fsync'd seq write {disk_gbps:6.3f} GB/s")
    print(f"  ratio checkpoint/disk  {ckpt_gbps / disk_gbps:6.3f}   (goal >= 0.8)")
    wait = r["exit_to_start_s"]
    denom = r["start_to_ready_s"] + r["load_s"]
    print("restart after a preemption (local executor, tiny model):")
    for k in ("signal_to_exit_s", "exit_to_start_s", "start_to_ready_s", "load_s", "first_step_s", "total_s"):
        print(f"  {k:<18} {r[k]:8.3f} s")
    print(
        f"  (total - scheduler wait) / (start->ready + read) = {(r['total_s'] - wait) / denom:.3f}   (goal <= 1.2)"
    )


if __name__ == "__main__":
    main()
