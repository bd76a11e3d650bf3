"""The engine's start-up (docs/design.md, "Start-up"): deepspeed.initialize on the project's
optimizer never imports DeepSpeed's Muon optimizer, whose import compiles kernels through
torch._inductor (0.94 s of a 1.06 s engine init for the tiny model, idle, measured with
cProfile); DeepSpeed's own ZeRO check does import it, which shows the test can fail."""

from __future__ import annotations

import json
import subprocess
import sys

from pipeline.job.distributed import free_port
from pipeline.train.trainer import MUON

ENGINE = """
import json, os, sys, time
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import torch.distributed as dist
from pipeline.job.startup import import_deepspeed
import_deepspeed(logs=False)
dist.init_process_group("gloo")
from pipeline.config.compose import compose_point, hydra_context
from pipeline.train.trainer import build_ds_config, build_engine
with hydra_context():
    cfg = compose_point(0, ["parallelism.gpus_per_node=1"]).cfg
ds = build_ds_config(cfg.parallelism, cfg.precision, cfg.train)
timings = {}
engine = build_engine(cfg.model, cfg.parallelism, cfg.train, ds, cfg.method, timings)
ours = {"stage": engine.zero_optimization_stage(), "muon": MUON in sys.modules, **timings}
from deepspeed.runtime.zero.utils import is_zero_supported_optimizer
supported = is_zero_supported_optimizer(engine.optimizer.optimizer)  # DeepSpeed's check, bare
print(json.dumps({**ours, "muon_after_deepspeeds_check": MUON in sys.modules, "supported": supported}))
""".replace("MUON", repr(MUON))


def test_the_engine_is_built_without_importing_muon() -> None:
    out = subprocess.run(
        [sys.executable, "-c", ENGINE, str(free_port())], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["stage"] == 2 and got["engine_init_s"] > 0, got  # a real ZeRO-2 engine was built
    assert got["muon"] is False, got
    assert got["muon_after_deepspeeds_check"] is True and got["supported"] is True, got
