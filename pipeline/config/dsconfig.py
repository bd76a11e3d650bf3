"""The DeepSpeed config of a point, derived from its typed sections (never written by hand).
Torch-free, so that validation reads the same config the job builds (`train.trainer.build_ds_config`
adds whether host memory is pinned)."""

from __future__ import annotations

from typing import Any

from pipeline.config.schema import ParallelismConfig, PrecisionConfig, TrainConfig


def ds_config(
    par: ParallelismConfig, prec: PrecisionConfig, train: TrainConfig, pin_memory: bool
) -> dict[str, Any]:
    """The DeepSpeed config; `pin_memory`: offloaded states in pinned host memory (with a GPU)."""
    zero: dict[str, Any] = {"stage": par.zero_stage}
    if par.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": par.offload_optimizer, "pin_memory": pin_memory}
    if par.offload_param != "none":
        zero["offload_param"] = {"device": par.offload_param, "pin_memory": pin_memory}
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": par.micro_batch,
        "gradient_accumulation_steps": par.grad_accum,
        "train_batch_size": par.micro_batch * par.grad_accum * par.world_size,
        "gradient_clipping": train.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": prec.name == "bf16"},
        "fp16": {"enabled": prec.name == "fp16", "initial_scale_power": 16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if par.offload_optimizer != "none":
        # offload needs DeepSpeed's CPU Adam; resume is exact only within ~1e-7 with it
        cfg["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": train.lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": train.weight_decay},
        }
    return cfg
