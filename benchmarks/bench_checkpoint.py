"""Checkpoint and restart figures, measured side by side in one run (issue goals):

  1. checkpoint write GB/s  /  the disk's fsync'd sequential write GB/s    (goal >= 0.8)
     for a real DeepSpeed ZeRO-2 (or --zero 3) checkpoint of at least 1 GB, saved through the
     pipeline's CheckpointManager (staged, hashed, fsynced, manifest, atomic rename), 2 gloo
     ranks, a synchronous save (as at a stop and for the final checkpoint: the loop waits for
     the commit) after every training step, for every train.checkpoint_io mode
     (direct, the default; buffered; deepspeed: torch.save by path, files read back to hash).
     Just before each save, every rank writes the bytes it wrote in the last save, all at
     once, in one stream of 8 MiB writes each: buffered + fsync, then O_DIRECT + fsync. The
     ratio is taken against the better of the two, pair by pair, because this VM's disk varies
     by 2x from minute to minute. One O_DIRECT stream of the whole checkpoint is measured
     alongside, and the save taken against it too (goal >= 0.8), and the ranks writing their
     shares one after the other (whether the ranks' concurrent streams fight);
  2. restart time minus the scheduler's wait  /  (process start -> engine ready + read time)
     (goal <= 1.2), from a real preemption drill on the local executor;
  3. what a background save holds the step loop (ckpt/stall_s)  /  a synchronous save of the same
     state, start to commit (goal <= 0.05): the same >= 1 GB ZeRO-2 checkpoint, 2 gloo ranks, one
     run, saves alternating synchronous (the previous save committed first) and background; the
     background saves' time to commit and the step times beside them are printed too.

Run: .venv/bin/python -m benchmarks.bench_checkpoint [--dir DIR] [--only stall|write] [--io direct,...]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

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


def disk_write(path: Path, nbytes: int, direct: bool, chunk: int = 8 << 20) -> tuple[int, float]:
    """One sequential write of `nbytes` (rounded down to whole chunks) in `chunk` writes, one
    fsync at the end, like a checkpoint file; the file is deleted afterwards, as pruned
    checkpoints are. Returns (bytes, seconds)."""
    buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(chunk))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
    t0 = time.perf_counter()
    fd = os.open(path, flags, 0o644)
    try:
        for _ in range(nbytes // chunk):
            os.write(fd, buf)
        os.fsync(fd)
    finally:
        os.close(fd)
    seconds = time.perf_counter() - t0
    path.unlink()
    return nbytes // chunk * chunk, seconds


SAVER = """
import json, os, sys, time
from pathlib import Path
import torch.distributed as dist
from benchmarks.bench_checkpoint import disk_write
from pipeline.train.checkpoint import MANIFEST, owner_rank
from pipeline.config.resolved import config_from_yaml
from pipeline.job.distributed import init_process_group, rank_env_from_environ
from pipeline.contract.spec import JobSpec
from pipeline.train.trainer import Trainer, run_dir_checkpoints
spec = JobSpec(**json.loads(Path(sys.argv[1]).read_text()))
cfg = config_from_yaml(spec.config_yaml)
renv = rank_env_from_environ()
rank, world = renv.rank, renv.world_size
init_process_group("cpu", 600)

class DiskProbe:
    # after each step: the disk, on the bytes the last save wrote, then a synchronous save (what
    # a stop and the final checkpoint do: the loop waits for the commit)
    def __init__(self):
        self.figures = {}
    def after_step(self, trainer, step):
        ck = trainer.checkpoints
        if ck.saves:
            self.probe(ck, step)
        trainer.save(step, blocking=True)
    def probe(self, ck, step):
        files = json.loads((ck.root / ck.tags()[0] / MANIFEST).read_text())["files"]
        chunk = 8 << 20
        shares = [sum(e["bytes"] for n, e in files.items() if owner_rank(n, world) == r) // chunk * chunk for r in range(world)]
        figures = {}
        for direct in (False, True):  # every rank writes its share at once, as in the save
            dist.barrier()
            t0 = time.perf_counter()
            disk_write(ck.root.parent / f"probe-{rank}.bin", shares[rank], direct)
            dist.barrier()
            figures["ranks_direct" if direct else "ranks_buffered"] = sum(shares) / (time.perf_counter() - t0) / 1e9
        if rank == 0:  # and one stream of the whole checkpoint
            nbytes, seconds = disk_write(ck.root.parent / "probe.bin", sum(shares), True)
            figures["one_direct"] = nbytes / seconds / 1e9
        dist.barrier()
        t0 = time.perf_counter()  # the ranks' shares one after the other: do their streams fight?
        for r in range(world):
            if r == rank:
                disk_write(ck.root.parent / f"probe-{rank}.bin", shares[rank], True)
            dist.barrier()
        figures["ranks_serial"] = sum(shares) / (time.perf_counter() - t0) / 1e9
        self.figures[step] = figures

probe = DiskProbe()
ck = run_dir_checkpoints(Path(spec.point_dir), cfg.train, rank, world)
tr = Trainer(cfg.model, cfg.precision, cfg.parallelism, cfg.train, rank, world, "cpu", ck, hooks=[probe])
tr.setup()
tr.train()  # an interval save after every step, as in a run: the steps between saves are real
if rank == 0:
    out = [{"step": s.step, "bytes": s.bytes, "seconds": s.seconds, "stages": s.stages, "disk": probe.figures.get(s.step)} for s in ck.saves]
    print("SAVE " + json.dumps(out), flush=True)
"""


STALL = """
import json, sys, time
from pathlib import Path
from pipeline.config.resolved import config_from_yaml
from pipeline.job.distributed import init_process_group, rank_env_from_environ
from pipeline.contract.spec import JobSpec
from pipeline.train.trainer import Trainer, run_dir_checkpoints
spec = JobSpec(**json.loads(Path(sys.argv[1]).read_text()))
cfg = config_from_yaml(spec.config_yaml)
renv = rank_env_from_environ()
init_process_group("cpu", 600)

class Alternate:
    # odd steps: a synchronous save (start to commit); even steps: a background save
    def __init__(self):
        self.rows = []
    def after_step(self, trainer, step):
        ck = trainer.checkpoints
        if step % 2:
            ck.wait()  # the background save before it is committed: the synchronous one starts clean
            s = trainer.save(step, blocking=True)
            self.rows.append({"step": step, "mode": "sync", "loop_s": s.seconds, "bytes": s.bytes})
        else:
            trainer.save(step, blocking=False)  # its stall_s is final once committed (below)
            self.rows.append({"step": step, "mode": "background"})

alt = Alternate()
ck = run_dir_checkpoints(Path(spec.point_dir), cfg.train, renv.rank, renv.world_size)
tr = Trainer(cfg.model, cfg.precision, cfg.parallelism, cfg.train, renv.rank, renv.world_size, "cpu", ck, hooks=[alt])
tr.setup()
res = tr.train()  # waits for the last background save
committed = {s.step: s for s in ck.saves}
for row in alt.rows:
    row["commit_s"] = committed[row["step"]].seconds
    # background: the hand-over plus the wait of the next optimizer update for the host copy
    row.setdefault("loop_s", committed[row["step"]].stall_s)
    row["next_step_s"] = res.step_times.get(row["step"] + 1)
if renv.rank == 0:
    print("STALL " + json.dumps(alt.rows), flush=True)
"""


def stall_ratio(tmp: Path, zero: int, steps: int = 9) -> list[dict[str, Any]]:
    """Saves alternating synchronous and background in one run of the wide model."""
    from tests.support.helpers import PY, launch_ranks, write_spec

    overrides = [
        "model=tiny",
        *WIDE,
        "precision=fp32",
        f"parallelism=zero{zero}",
        f"train.steps={steps}",
        "train.warmup_steps=0",
        "train.checkpoint_interval=0",
        "train.keep_last=2",
    ]
    spec = write_spec(tmp, tmp / "ckpt-stall", overrides, f"sqlite:///{tmp / 's.db'}", "ckpt-stall")
    results = launch_ranks(spec, timeout=1800, command=[PY, "-c", STALL])
    out = results[0].stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("STALL ")), None)
    assert line, out[-3000:] + results[1].stdout[-2000:]
    rows: list[dict[str, Any]] = json.loads(line[6:])
    return rows


def print_stall(rows: list[dict[str, Any]]) -> None:
    nbytes = next(r["bytes"] for r in rows if r["mode"] == "sync")
    print(
        f"background checkpoints: {nbytes / 1e9:.2f} GB over 2 ranks, saves alternating synchronous / "
        "background in one run (loop_s: what the step loop waited; commit_s: start to commit)"
    )
    for r in rows:
        nxt = f"{r['next_step_s']:6.2f} s" if r["next_step_s"] is not None else "     -"
        print(
            f"  step {r['step']}: {r['mode']:<10} loop waited {r['loop_s']:7.3f} s   "
            f"committed after {r['commit_s']:7.3f} s   next step {nxt}"
        )
    sync = [r["loop_s"] for r in rows if r["mode"] == "sync"]
    stall = [r["loop_s"] for r in rows if r["mode"] == "background"]
    ratio = statistics.median(stall) / statistics.median(sync)
    after = {
        mode: statistics.median(r["next_step_s"] for r in rows if r["mode"] == mode and r["next_step_s"])
        for mode in ("sync", "background")
    }
    print(
        f"  median step after a synchronous save {after['sync']:.2f} s, after a background save "
        f"{after['background']:.2f} s (the background writing shares the CPU with training)"
    )
    print(
        f"  median stall {statistics.median(stall):.3f} s / median synchronous save {statistics.median(sync):.3f} s"
        f" = {ratio:.3f}   (goal <= 0.05)"
    )


def checkpoint_saves(tmp: Path, zero: int, io: str) -> list[dict[str, Any]]:
    """The interval saves of a real run (one after each of 6 steps), each with the disk's
    buffered and O_DIRECT write GB/s measured on the same bytes just before it."""
    from tests.support.helpers import PY, launch_ranks, write_spec

    overrides = [
        "model=tiny",
        *WIDE,
        "precision=fp32",
        f"parallelism=zero{zero}",
        "train.steps=7",
        "train.warmup_steps=0",
        "train.checkpoint_interval=0",  # the probe saves, synchronously, after every step
        "train.keep_last=1",
        f"train.checkpoint_io={io}",
    ]
    spec = write_spec(tmp, tmp / f"ckpt-{io}", overrides, f"sqlite:///{tmp / 'm.db'}", f"ckpt-{io}")
    results = launch_ranks(spec, timeout=1800, command=[PY, "-c", SAVER])
    outs = [r.stdout for r in results]
    line = next((ln for ln in outs[0].splitlines() if ln.startswith("SAVE ")), None)
    assert line, outs[0][-3000:]
    saves: list[dict[str, Any]] = json.loads(line[5:])
    for save in saves:
        save["gbps"] = save["bytes"] / save["seconds"] / 1e9
    return saves


def restart_ratio(tmp: Path) -> dict[str, float]:
    from tests.support.helpers import point_runs, qualify

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
    ap.add_argument(
        "--only", choices=("stall", "write"), help="only the background-save figure (3) or the write (1)"
    )
    ap.add_argument(
        "--io", default="direct,buffered,deepspeed", help="train.checkpoint_io modes of the write figure"
    )
    args = ap.parse_args()
    base = Path(args.dir) if args.dir else REPO / "runs"
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as d:
        tmp = Path(d)
        stall = stall_ratio(tmp, args.zero) if args.only != "write" else []
        if args.only == "stall":
            print_stall(stall)
            return
        runs = {io: checkpoint_saves(tmp, args.zero, io) for io in args.io.split(",")}
        r = restart_ratio(tmp) if args.only != "write" else {}
    nbytes = runs["direct"][0]["bytes"]
    print(
        f"checkpoint: {nbytes / 1e9:.2f} GB over 2 ranks (ZeRO-{args.zero}, fp32 + Adam), "
        "staged, hashed, fsynced, renamed; a synchronous save after each of 7 steps. Just before each, the "
        "disk: each rank writes the bytes it saved, at once, buffered + fsync and O_DIRECT + fsync"
    )
    ratios: dict[str, list[float]] = {}
    single: dict[str, list[float]] = {}
    for io, saves in runs.items():
        print(f"  train.checkpoint_io={io}")
        for save in saves:
            line = f"    save at step {save['step']}: {save['gbps']:5.2f} GB/s"
            if save["disk"]:
                disk = save["disk"]
                best = max(disk["ranks_buffered"], disk["ranks_direct"])
                line += (
                    f"   disk: 2 ranks buffered {disk['ranks_buffered']:5.2f}, O_DIRECT {disk['ranks_direct']:5.2f},"
                    f" 1 stream O_DIRECT {disk['one_direct']:5.2f}, ranks one after the other"
                    f" {disk['ranks_serial']:5.2f} GB/s   ratio {save['gbps'] / best:5.3f}"
                )
                if save["step"] >= 3:  # the first saves also pay for the page cache's first touch
                    ratios.setdefault(io, []).append(save["gbps"] / best)
                    single.setdefault(io, []).append(save["gbps"] / disk["one_direct"])
            print(line)
            print("      stages (rank 0, s): " + ", ".join(f"{k} {v:.3f}" for k, v in save["stages"].items()))
    print("  ratio = checkpoint write / the better of the 2-rank disk writes measured just before it")
    for io, rs in ratios.items():
        print(
            f"  steps 3-7, {io:<9}: median {statistics.median(rs):.3f}, best {max(rs):.3f};"
            f" against the single stream: median {statistics.median(single[io]):.3f}"
        )
    if "direct" in ratios:
        print(
            f"  goal: the default (direct), median >= 0.8 of the 2-rank write: {statistics.median(ratios['direct']):.3f},"
            f" >= 0.8 of the single stream: {statistics.median(single['direct']):.3f}"
        )
    if args.only == "write":
        return
    wait = r["exit_to_start_s"]
    denom = r["start_to_ready_s"] + r["load_s"]
    print("restart after a preemption (local executor, tiny model):")
    for k in ("signal_to_exit_s", "exit_to_start_s", "start_to_ready_s", "load_s", "first_step_s", "total_s"):
        print(f"  {k:<18} {r[k]:8.3f} s")
    print(
        f"  (total - scheduler wait) / (start->ready + read) = {(r['total_s'] - wait) / denom:.3f}   (goal <= 1.2)"
    )
    print_stall(stall)


if __name__ == "__main__":
    main()
