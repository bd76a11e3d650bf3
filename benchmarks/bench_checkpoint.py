"""Checkpoint and restart figures, measured side by side in one run (issue goals):

  1. checkpoint write GB/s  /  the disk's fsync'd sequential write GB/s    (goal >= 0.8)
     for a real DeepSpeed ZeRO-2 (or --zero 3) checkpoint of at least 1 GB, saved through the pipeline's
     CheckpointManager (staged, hashed, fsynced, manifest, atomic rename), 2 gloo ranks, with an
     interval save after every training step; both train.checkpoint_io modes (direct, the
     default, and buffered). The disk's figure is the better of a buffered write + fsync and
     an O_DIRECT write + fsync, each one stream of 8 MiB writes, best of three;
  2. restart time minus the scheduler's wait  /  (process start -> engine ready + read time)
     (goal <= 1.2), from a real preemption drill on the local executor.

Run: .venv/bin/python benchmarks/bench_checkpoint.py [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
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


def disk_write_gbps(folder: Path, nbytes: int, direct: bool, chunk: int = 8 << 20, repeats: int = 3) -> float:
    """Sequential write of `nbytes` in `chunk` writes, one fsync at the end, like a checkpoint
    file; best of a few, each file deleted before the next (as pruned checkpoints are)."""
    path = folder / "seqwrite.bin"
    buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(chunk))
    best = 0.0
    for _ in range(repeats):
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
        t0 = time.perf_counter()
        fd = os.open(path, flags, 0o644)
        try:
            for _ in range(nbytes // chunk):
                os.write(fd, buf)
            os.fsync(fd)
        finally:
            os.close(fd)
        best = max(best, nbytes // chunk * chunk / (time.perf_counter() - t0) / 1e9)
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
tr.train()  # an interval save after every step, as in a run: the steps between saves are real
if renv.rank == 0:
    stats = tr.checkpoints.saves
    print("SAVE " + json.dumps([{"bytes": s.bytes, "seconds": s.seconds} for s in stats]), flush=True)
"""


def checkpoint_write_gbps(tmp: Path, zero: int, io: str) -> tuple[list[float], int]:
    from helpers import PY, launch_ranks, write_spec

    overrides = [
        "model=tiny",
        *WIDE,
        "precision=fp32",
        f"parallelism=zero{zero}",
        "train.steps=6",
        "train.warmup_steps=0",
        "train.checkpoint_interval=1",
        "train.keep_last=1",
        f"train.checkpoint_io={io}",
    ]
    spec = write_spec(tmp, tmp / f"ckpt-{io}", overrides, f"sqlite:///{tmp / 'm.db'}", f"ckpt-{io}")
    results = launch_ranks(spec, timeout=1800, command=[PY, "-c", SAVER])
    outs = [r.stdout for r in results]
    line = next((ln for ln in outs[0].splitlines() if ln.startswith("SAVE ")), None)
    assert line, outs[0][-3000:]
    saves = json.loads(line[5:])
    return [s["bytes"] / s["seconds"] / 1e9 for s in saves], saves[0]["bytes"]


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
        saves = {}
        for io in ("direct", "buffered"):
            saves[io], nbytes = checkpoint_write_gbps(tmp, args.zero, io)
        disk = {direct: disk_write_gbps(tmp, max(nbytes, 1 << 30), direct) for direct in (False, True)}
        r = restart_ratio(tmp)
    disk_gbps = max(disk.values())
    print(
        f"checkpoint: {nbytes / 1e9:.2f} GB over 2 ranks (ZeRO-{args.zero}, fp32 + Adam), "
        "staged, hashed, fsynced, renamed; a save after each of 6 steps"
    )
    print(f"  disk, buffered write + fsync  {disk[False]:6.3f} GB/s")
    print(f"  disk, O_DIRECT write + fsync  {disk[True]:6.3f} GB/s")
    for io, figures in saves.items():
        # the first two saves also pay for the page cache's first touch; from the third on
        # the process is in the steady state of a run that keeps the last K
        steady = figures[2:]
        print(
            f"  checkpoint_io={io:<8} per save " + " ".join(f"{g:.2f}" for g in figures) + " GB/s;"
            f" steady best {max(steady):.3f}, median {statistics.median(steady):.3f}"
        )
    best = max(saves["direct"][2:])
    print(
        f"  ratio checkpoint (direct, the default) / disk = {best:.3f} / {disk_gbps:.3f} = {best / disk_gbps:.3f}   (goal >= 0.8)"
    )
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
