"""The job's collective probe, before training, on every rank: all-reduce, reduce-scatter and
all-gather at `train.comm_sizes_mb` (their plateau bus bandwidth), and each collective the ZeRO
stage issues at its real message size (its bucket: `pipeline.measure.scaling.bucket_messages`).
Every rank returns the same metrics (measure_collectives averages the times over the ranks)."""

from __future__ import annotations

import logging

from pipeline.config.schema import Config
from pipeline.config.validate import bucket_plan
from pipeline.tracking import keys as K
from pipeline.train.probes import free_device_memory, measure_collectives

log = logging.getLogger(__name__)

PLATEAU_KEYS = {
    "all_reduce": K.COMM_ALLREDUCE_BUSBW,
    "reduce_scatter": K.COMM_REDUCESCATTER_BUSBW,
    "all_gather": K.COMM_ALLGATHER_BUSBW,
}
LARGE_BYTES = 64e6
"""Messages above 64 MB are timed with 1 warm-up and 2 calls (5 and 2 below): a 1 GB bucket
costs seconds per call over gloo, milliseconds over NCCL."""


def probe_collectives(cfg: Config, device: str) -> dict[str, float]:
    """The plateau busbw per collective at the configured sizes, then each bucket message's size
    and busbw (GB/s); a figure that was not measured is absent."""
    sizes = [int(mb * 1e6) for mb in cfg.train.comm_sizes_mb]
    out: dict[str, float] = {}
    comm = measure_collectives(sizes, iters=5, warmup=2, ops=tuple(PLATEAU_KEYS), device=device)
    for op, key in PLATEAU_KEYS.items():
        gbps = comm[op].plateau_busbw_gbps
        if gbps is not None:
            out[key] = gbps
    for msg in bucket_plan(cfg):
        size = int(msg.size_bytes)
        iters, warmup = (2, 1) if size > LARGE_BYTES else (5, 2)
        (sample,) = measure_collectives([size], iters, warmup, ops=(msg.op,), device=device)[msg.op].samples
        out[K.comm_bucket_op_bytes(msg.op)] = float(sample.size_bytes)
        out[K.comm_bucket_op_busbw(msg.op)] = sample.busbw / 1e9
        log.info("%s at its bucket size %d bytes: %.3f GB/s bus bandwidth", msg.op, size, sample.busbw / 1e9)
    free_device_memory(device)  # a bucket's buffers are GBs: back to the device before the model
    return out
