"""A real DeepSpeed rank (gloo) that trains and checkpoints through the pipeline's
CheckpointManager, for the checkpoint-robustness tests and the pace of the time-out drill
tests. Prints JSON lines (the last: the end step, the state's fingerprint, the wall seconds per
step and when the trainer was ready). World size 1 unless it is started as one of several
ranks (RANK, WORLD_SIZE, MASTER_ADDR/PORT already set).

usage: ckpt_worker.py DIR train STEPS [--interval K] [--keep-last K] [--io IO] [--fsize-limit BYTES]
                                       [--hidden H]
       ckpt_worker.py DIR load [--io IO] [--hidden H]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
from pathlib import Path

from pipeline.config.schema import ModelConfig, ParallelismConfig, PrecisionConfig, TrainConfig
from pipeline.job.distributed import free_port, init_process_group, rank_vars
from pipeline.train.checkpoint import CheckpointSaveError
from pipeline.train.probes import state_fingerprint
from pipeline.train.trainer import Trainer, run_dir_checkpoints


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("mode", choices=("train", "load"))
    ap.add_argument("steps", type=int, nargs="?", default=4)
    ap.add_argument("--interval", type=int, default=1)
    ap.add_argument("--fsize-limit", type=int, default=0)
    ap.add_argument("--fsize-limit-rank", type=int, default=None, help="only this rank hits the limit")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--keep-last", type=int, default=3)
    ap.add_argument("--io", default="direct")
    args = ap.parse_args()
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(rank_vars(0, 1, 0, "127.0.0.1", free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_process_group("cpu", 60)
    model = ModelConfig(hidden=args.hidden, ffn_hidden=2 * args.hidden)
    train = TrainConfig(
        steps=args.steps,
        checkpoint_interval=args.interval,
        keep_last=args.keep_last,
        warmup_steps=0,
        checkpoint_io=args.io,
    )
    par = ParallelismConfig(zero_stage=2, gpus_per_node=world)
    checkpoints = run_dir_checkpoints(Path(args.dir), train, rank, world)
    trainer = Trainer(model, PrecisionConfig(), par, train, rank, world, "cpu", checkpoints)
    res = trainer.setup()
    if args.mode == "load":
        print(
            json.dumps(
                {
                    "loaded": res.load.step if res.load else None,
                    "fallbacks": res.load.fallbacks if res.load else 0,
                    "fingerprint": state_fingerprint(trainer.engine),
                }
            ),
            flush=True,
        )
        return
    if args.fsize_limit and args.fsize_limit_rank in (None, rank):
        # a full disk, as far as this process can tell: writes past the limit fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize_limit, args.fsize_limit))
    try:
        res = trainer.train()
    except CheckpointSaveError as e:
        print(
            json.dumps({"save_failed": f"{type(e).__name__}: {e}", "end_step": trainer.result.end_step}),
            flush=True,
        )
        # the report is out: skip the interpreter's teardown, where a rank whose torch.save
        # failed in a writer thread sometimes aborts ("terminate called without an active
        # exception", about 1 exit in 10) after everything it had to do is done
        os._exit(17)
    print(
        json.dumps(
            {
                "end_step": res.end_step,
                "fingerprint": state_fingerprint(trainer.engine),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
