"""A bare DeepSpeed loop on one rank (started like the pipeline's ranks): the same model, the
same derived ds_config and the same data as a pipeline job, nothing else. Prints JSON with its
median step time on rank 0. Used by bench_overhead.py."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from pipeline.config.resolved import config_from_yaml
from pipeline.contract.spec import JobSpec
from pipeline.job.distributed import init_process_group, rank_env_from_environ
from pipeline.train.data import SyntheticTask
from pipeline.train.trainer import build_ds_config, build_engine


def main() -> None:
    spec = JobSpec(**json.loads(Path(sys.argv[1]).read_text()))
    cfg = config_from_yaml(spec.config_yaml)
    renv = rank_env_from_environ()
    torch.set_num_threads(max(1, cfg.partition.cpus_per_task))
    init_process_group("cpu", 120)
    ds = build_ds_config(cfg.parallelism, cfg.precision, cfg.train)
    engine = build_engine(cfg.model, cfg.parallelism, cfg.train, ds)
    task = SyntheticTask(cfg.model.vocab_size, cfg.model.seq_len, cfg.train.seed, cfg.data.alphabet)
    times = []
    for step in range(1, cfg.train.steps + 1):
        t0 = time.perf_counter()
        for micro in range(cfg.parallelism.grad_accum):
            x, y = task.batch(step, micro, renv.rank, cfg.parallelism.micro_batch)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
        loss.item()
        times.append(time.perf_counter() - t0)
    p50 = statistics.median(times[cfg.train.warmup_steps :])
    tokens = cfg.parallelism.micro_batch * cfg.parallelism.grad_accum * renv.world_size * cfg.model.seq_len
    if renv.rank == 0:
        print("BARE " + json.dumps({"p50_s": p50, "tokens_per_s": tokens / p50}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
