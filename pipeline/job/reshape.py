"""The reshape drill's job-side machinery: resume a run on another number of ranks through
DeepSpeed's universal checkpoint. The drill itself (its hook, its hand-over, its verify) is
pipeline/drills/reshape.py, which calls `reshape_on_main_rank` and `wait_for_result` here.

After `drill.reshape.at_step` the job's ranks have saved a committed checkpoint. Rank 0 then
converts it with DeepSpeed's `ds_to_universal` (into `<point>/universal/<tag>`) and starts
`drill.reshape.world_size` fresh ranks on its own node (`python -m pipeline.job.reshape`), which
load it with `load_universal`, train to the end with the same global batch and the same
samples (more gradient accumulation per rank), do the final checkpoint round trip and write
what they measured to `<point>/reshape/resumed.json`. Rank 0 adds the conversion time and
publishes `<point>/reshape/result.json`; the job's other ranks wait for that file with no
collective pending, so no process-group timeout can fire however long it takes. The losses
are then compared with the uninterrupted run on the job's ranks, like every drill's.

The resumed ranks run in fresh processes because a torch process group and DeepSpeed's
cached groups cannot shrink in place. They use the devices rank 0 sees, as local ranks
0..world_size-1: with one GPU per task bound by Slurm, only world_size=1 fits.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.contract.pointdir import PointDir
from pipeline.files import write_json
from pipeline.measure.timeline import Mark
from pipeline.train.checkpoint import CheckpointManager

RESULT = "result.json"  # written by the job's rank 0 once the resumed run is over
RESUMED = "resumed.json"  # written by the resumed run's rank 0


@dataclass
class ReshapeResult:
    """What the resumed ranks measured (their rank 0's view), and the conversion before them."""

    world_size: int
    from_step: int
    losses: dict[int, float] = field(default_factory=dict)  # the steps after from_step
    convert_s: float = 0.0  # ds_to_universal
    start_to_ready_s: float = 0.0  # the resumed processes' start -> engine built
    load_s: float = 0.0  # universal checkpoint read
    first_step_s: float = 0.0
    first_step_done_at: float = 0.0  # wall clock
    ckpt_save_s: float = 0.0  # the resumed run's final checkpoint round trip
    ckpt_load_s: float = 0.0
    ckpt_bytes: int = 0
    verified: bool = False
    error: str | None = None


def reshape_dir(point_dir: Path) -> Path:
    return PointDir(point_dir).reshape


def convert_to_universal(checkpoints: Path, tag: str, out_root: Path) -> Path:
    """DeepSpeed's ds_to_universal, as a subprocess (it runs its own worker pools). Our runs
    do not register universal_checkpoint_info in the module, so its standard form is
    injected (--inject_missing_state)."""
    out = out_root / tag
    shutil.rmtree(out, ignore_errors=True)  # what a killed attempt may have left half-written
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(checkpoints / tag),
        "--output_folder",
        str(out),
        "--inject_missing_state",
        "--num_extract_workers",
        "2",
        "--num_merge_workers",
        "2",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"ds_to_universal failed on {checkpoints / tag} (exit {done.returncode}): "
            f"{(done.stderr or done.stdout).strip()[-1500:]}"
        )
    return out_root


def run_resumed_ranks(config_yaml: str, point_dir: Path, tag: str, universal: Path, world: int) -> None:
    """Start `world` ranks of `python -m pipeline.job.reshape` on this node and wait for them."""
    from pipeline.job.distributed import free_port, rank_vars

    spec = reshape_dir(point_dir) / "spec.json"
    shutil.rmtree(reshape_dir(point_dir), ignore_errors=True)  # nothing of a killed attempt is read
    spec.parent.mkdir(parents=True, exist_ok=True)
    write_json(
        spec,
        {
            "config_yaml": config_yaml,
            "point_dir": str(point_dir),
            "tag": tag,
            "universal": str(universal),
            "world_size": world,
        },
        indent=None,
    )
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pipeline.job.reshape", str(spec)],
            env={**os.environ, **rank_vars(rank, world, rank, "127.0.0.1", port)},
        )
        for rank in range(world)
    ]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"the resumed ranks exited with {codes}; their output is in the job's log")


def wait_for_result(point_dir: Path, poll_s: float = 0.5) -> ReshapeResult:
    """Block until the job's rank 0 has written the reshape result; no collective is pending
    meanwhile, so no process-group timeout can fire however long the resumed run takes."""
    path = reshape_dir(point_dir) / RESULT
    while not path.exists():
        time.sleep(poll_s)
    return read_result(path)


def read_result(path: Path) -> ReshapeResult:
    raw = json.loads(path.read_text())
    raw["losses"] = {int(k): v for k, v in raw["losses"].items()}
    return ReshapeResult(**raw)


def write_result(path: Path, result: ReshapeResult) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, dataclasses.asdict(result), indent=None)


def reshape_on_main_rank(config_yaml: str, cfg: Any, point_dir: Path) -> ReshapeResult:
    """The job's rank 0: convert the checkpoint saved at at_step, run the resumed ranks, and
    publish the result for the job's other ranks (a result from an earlier attempt whose
    reference run was cut short is reused)."""
    from pipeline.train.checkpoint import tag_for

    final = reshape_dir(point_dir) / RESULT
    if final.exists():
        return read_result(final)
    at, world = cfg.drill.reshape.at_step, cfg.drill.reshape.world_size
    tag = tag_for(at)
    try:
        t0 = time.perf_counter()
        universal = convert_to_universal(PointDir(point_dir).checkpoints, tag, PointDir(point_dir).universal)
        convert_s = time.perf_counter() - t0
        run_resumed_ranks(config_yaml, point_dir, tag, universal, world)
        result = read_result(reshape_dir(point_dir) / RESUMED)
        result.convert_s = convert_s
    except Exception as e:  # the drill fails with the reason; the job's ranks are not left waiting
        result = ReshapeResult(world_size=world, from_step=at, error=f"{type(e).__name__}: {e}")
    write_result(final, result)
    return result


def main(spec_path: str) -> None:
    """One resumed rank: load the universal checkpoint, train to the end, round trip."""
    from pipeline import logs
    from pipeline.config.resolved import config_from_yaml
    from pipeline.job.distributed import device_for, init_process_group, rank_env_from_environ

    logs.setup()  # the rank's `[rank]` and `[checkpoint]` lines, into the reshape's log
    spec = json.loads(Path(spec_path).read_text())
    cfg = config_from_yaml(spec["config_yaml"])
    renv = rank_env_from_environ()
    device = device_for(renv.local_rank)
    init_process_group(device, cfg.train.pg_timeout_s)
    trainer = _resumed_trainer(cfg, Path(spec["point_dir"]), spec["world_size"], renv.rank, device)
    res = trainer.setup_universal(Path(spec["universal"]), spec["tag"])
    from_step = res.start_step
    res = trainer.train()
    trip = trainer.roundtrip(res.end_step)
    if renv.rank == 0:
        write_result(
            reshape_dir(Path(spec["point_dir"])) / RESUMED,
            _resumed_result(spec["world_size"], from_step, res, trip),
        )


def _resumed_trainer(cfg: Any, point_dir: Path, world: int, rank: int, device: str) -> Any:
    """A trainer on `world` ranks of one node that sees the job's samples: each rank takes the
    micro-batches of old_world / world original ranks (grad_accum grows by that factor)."""
    from pipeline.train.trainer import DistComm, Trainer

    old_world = cfg.parallelism.world_size
    par = dataclasses.replace(
        cfg.parallelism,
        gpus_per_node=world,
        nodes=1,
        grad_accum=cfg.parallelism.grad_accum * old_world // world,
    )
    checkpoints = CheckpointManager(
        reshape_dir(point_dir) / "checkpoints",
        cfg.train.checkpoint_interval,
        1,
        rank,
        world,
        DistComm(),
        io=cfg.train.checkpoint_io,
    )
    return Trainer(
        cfg.model,
        cfg.precision,
        par,
        cfg.train,
        rank,
        world,
        device,
        checkpoints,
        data_world=old_world,
        data=cfg.data,
        method=cfg.method,
    )


def _resumed_result(world: int, from_step: int, res: Any, trip: Any) -> ReshapeResult:
    """What the resumed ranks measured (their rank 0's view): the steps after the resume, the
    start-up, the load, the first step and the final checkpoint's round trip."""
    from pipeline.job.distributed import process_start_time

    return ReshapeResult(
        world_size=world,
        from_step=from_step,
        losses={s: v for s, v in res.losses.items() if s > from_step},
        start_to_ready_s=res.timeline[Mark.ENGINE_READY] - process_start_time(),
        load_s=res.load.seconds if res.load else 0.0,
        first_step_s=res.step_times.get(from_step + 1, 0.0),
        first_step_done_at=res.timeline[Mark.FIRST_STEP_DONE],
        ckpt_save_s=trip.save.seconds,
        ckpt_load_s=trip.load.seconds,
        ckpt_bytes=trip.save.bytes,
        verified=trip.verified,
    )


if __name__ == "__main__":
    main(sys.argv[1])
