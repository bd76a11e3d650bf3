"""One gloo rank of the emulated-link calibration (tests/support/link.py), run inside its network
namespace: for each rank count in --groups (the first n ranks), all-reduces of fp32 buffers at
each of --sizes bytes, 1 untimed call, then --reps calls each after a barrier and timed alone;
each rank's median call, averaged over the group's ranks (nccl-tests averages over ranks too; the
median, not the mean of back-to-back calls, keeps a rank descheduled by a busy CPU from reading as
the link). Rank 0 prints one JSON line per (ranks, size)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--port", type=int, default=29548)
    ap.add_argument("--sizes", required=True)
    ap.add_argument("--groups", required=True)
    ap.add_argument("--reps", type=int, default=4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{a.master}:{a.port}",
        rank=a.rank,
        world_size=a.world,
        timeout=timedelta(seconds=120),
    )
    sizes = [int(s) for s in a.sizes.split(",")]
    for n in (int(g) for g in a.groups.split(",")):
        group = dist.new_group(list(range(n)))  # every rank takes part in making it
        if a.rank >= n:
            continue
        for size in sizes:
            buf = torch.ones(size // 4, dtype=torch.float32)
            dist.all_reduce(buf, group=group)
            times = []
            for _ in range(a.reps):
                dist.barrier(group=group)
                t0 = time.perf_counter()
                dist.all_reduce(buf, group=group)
                times.append(time.perf_counter() - t0)
            # the median call: a rank descheduled by a busy CPU slows one call, not the link
            per_call = torch.tensor([statistics.median(times)], dtype=torch.float64)
            dist.all_reduce(per_call, group=group)
            if a.rank == 0:
                row = {"ranks": n, "size": buf.numel() * 4, "seconds": per_call.item() / n}
                print(json.dumps(row), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
