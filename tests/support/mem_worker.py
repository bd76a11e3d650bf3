"""One rank: for ZeRO 1-3, build the real engine, run one step, and at the inner optimizer step
(the model states' peak) print the tensor bytes this rank holds and the model's prediction."""

from __future__ import annotations

import json
import os
import sys

import torch

from pipeline.config.schema import MethodConfig, ModelConfig, ParallelismConfig, PrecisionConfig, TrainConfig
from pipeline.job.distributed import init_process_group
from pipeline.measure.flops import ModelShape, param_count
from pipeline.measure.memory import MemoryQuery, estimate, model_states_bytes_per_device
from pipeline.train.memstate import state_bytes
from pipeline.train.trainer import build_ds_config, build_engine

MODELS = {
    "tiny": ModelConfig(),
    # GPT-2 small's width, heads and vocabulary (its tied embedding: 38.6M of its 124M
    # parameters) at 2 of its 12 layers: a layer's terms are the tiny model's, at 7M each; all 12
    # cost the CPU run 2.4x the parameters for nothing more to measure
    "gpt2-125m-2l": ModelConfig("gpt2-125m-2l", "gpt2", 2, 768, 12, 12, 3072, 50257, 32),
}


RUNS = [(1, "full"), (2, "full"), (3, "full")]
LORA_RUNS = {"tiny": [(2, "lora")]}
"""(ZeRO stage, method) per model: LoRA at ZeRO-2, the layout of a sweep's LoRA points (issue
#46: the adapters are weights too); the tiny model only (its adapters are 15% of its weights)."""


def _predicted(mc: ModelConfig, stage: int, method: MethodConfig, world: int) -> dict[str, int]:
    """The memory model's states as the fit computes them: for LoRA from the model's description
    (the adapters peft builds) through the MemoryQuery the sweep's fit uses."""
    if not method.adapters:
        return model_states_bytes_per_device(param_count(ModelShape.of(mc)), stage, world, "fp32").__dict__
    from pipeline.config.pretrained import describe
    from pipeline.measure.describe import adapter_params

    d = describe(mc, None)
    q = MemoryQuery.from_description(
        d,
        mc.seq_len,
        micro_batch=1,
        zero_stage=stage,
        dp_ranks=world,
        capacity_bytes=2**40,
        precision="fp32",
        on_gpu=False,
        method=method.name,
        trainable_params=adapter_params(d, method.lora_rank),
    )
    return estimate(q).model_states.__dict__


def main() -> None:
    mc = MODELS[sys.argv[1]]
    init_process_group("cpu", 60)
    world = int(os.environ["WORLD_SIZE"])
    for stage, name in RUNS + LORA_RUNS.get(sys.argv[1], []):
        method = MethodConfig(name=name)
        par = ParallelismConfig(zero_stage=stage, micro_batch=1, gpus_per_node=world)
        train = TrainConfig(steps=5)
        ds_config = build_ds_config(par, PrecisionConfig(), train)
        engine = build_engine(mc, par, train, ds_config, method=method)
        inner = engine.optimizer.optimizer
        snap: dict[str, int] = {}
        step = inner.step

        def wrapped(*a: object, _step=step, _snap=snap, _engine=engine, **k: object) -> object:  # type: ignore[no-untyped-def]
            out = _step(*a, **k)
            _snap.update(_snap or state_bytes(_engine))
            return out

        inner.step = wrapped
        x = torch.randint(0, mc.vocab_size, (1, mc.seq_len))
        engine.backward(engine(x, x))
        engine.step()
        ours = _predicted(mc, stage, method, world)
        if int(os.environ["RANK"]) == 0:
            row = {"stage": stage, "method": name, "measured": snap, "predicted": ours}
            print("MEM " + json.dumps(row), flush=True)
        del engine, inner
    torch.distributed.barrier()  # both ranks are done with every collective
    # the interpreter's teardown of DeepSpeed's and gloo's threads once ended a rank with
    # "terminate called without an active exception" after every figure was out: leave as the
    # job's entry does, with everything flushed
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
