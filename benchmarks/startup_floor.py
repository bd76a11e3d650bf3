"""The floor of a rank's start-up: a bare interpreter doing only what a job cannot skip, with
none of slurm-qualify's code. On every rank: import torch, transformers' causal-LM class and
DeepSpeed; the process group (`deepspeed.init_distributed`, gloo on a CPU); the model built
from its `config.json` (`AutoModelForCausalLM.from_config`, the dtype the DeepSpeed config
trains in); `deepspeed.initialize` with torch's AdamW (what a job without offload passes) and the
job's own DeepSpeed config. Rank 0 prints one JSON line: the seconds from its process start (the
kernel's start time, as the job measures it: pipeline.job.distributed.process_start_time) to the
engine ready, and each part.

Run through `benchmarks.bench_startup` (it starts the ranks with the job's DeepSpeed config and
model), or by hand: RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29600 \\
  python -m benchmarks.startup_floor MODEL_DIR DS_CONFIG.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _process_start() -> float:
    with open(f"/proc/{os.getpid()}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.time() - (since_boot - int(fields[19]) / os.sysconf("SC_CLK_TCK"))


def main(model_dir: str, ds_config_path: str) -> int:
    start = _process_start()
    parts: dict[str, float] = {}
    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    parts["import_s"] = time.time() - start  # from process start, as the job's startup/import_s
    ds_config = json.loads(Path(ds_config_path).read_text())
    torch.set_num_threads(1)
    t = time.perf_counter()
    deepspeed.init_distributed(dist_backend="gloo")
    parts["process_group_s"] = time.perf_counter() - t
    t = time.perf_counter()
    dtype = torch.bfloat16 if ds_config.get("bf16", {}).get("enabled") else torch.float32
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=dtype)
    parts["model_build_s"] = time.perf_counter() - t
    t = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4) if "optimizer" not in ds_config else None
    deepspeed.initialize(model=model, optimizer=optimizer, model_parameters=params, config=ds_config)
    parts["engine_init_s"] = time.perf_counter() - t
    ready = time.time() - start
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"start_to_ready_s": ready, **parts}), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
