"""Checks of every point before anything is submitted: the memory model's verdict (a result,
not an error) and the rules that make a point impossible to run (errors, all reported at once)."""

from __future__ import annotations

from collections.abc import Sequence

import psutil

from pipeline.config.schema import Config, ConfigError
from pipeline.measure.flops import ModelShape
from pipeline.measure.memory import MemoryEstimate, MemoryQuery, estimate

GIB = 2**30


def capacity_bytes(cfg: Config) -> int:
    """Memory per device: the GPU's, or on CPU the host's share per rank."""
    if cfg.partition.is_gpu and cfg.partition.gpu_mem_gib > 0:
        return int(cfg.partition.gpu_mem_gib * GIB)
    return int(psutil.virtual_memory().total // max(1, cfg.parallelism.gpus_per_node))


def memory_estimate(cfg: Config, on_gpu: bool | None = None) -> MemoryEstimate:
    p = cfg.parallelism
    query = MemoryQuery.from_shape(
        ModelShape.of(cfg.model),
        micro_batch=p.micro_batch,
        zero_stage=p.zero_stage,
        dp_ranks=p.world_size,
        capacity_bytes=capacity_bytes(cfg),
        precision=cfg.precision.name,
        offload_optimizer=p.offload_optimizer != "none",
        offload_param=p.offload_param != "none",
        activation_checkpointing=p.activation_checkpointing,
        on_gpu=cfg.partition.is_gpu if on_gpu is None else on_gpu,
    )
    return estimate(query)


def point_problems(cfg: Config) -> list[str]:
    """What makes this point impossible to run as configured (empty: fine)."""
    problems: list[str] = []
    par, part, train = cfg.parallelism, cfg.partition, cfg.train
    if part.is_gpu and par.gpus_per_node > part.gpus_per_node:
        problems.append(
            f"parallelism.gpus_per_node={par.gpus_per_node} is more than partition '{part.name}' has per node "
            f"(partition.gpus_per_node={part.gpus_per_node})"
        )
    if part.max_time_min is not None and part.time_limit_min > part.max_time_min:
        problems.append(
            f"partition.time_limit_min={part.time_limit_min} is over partition '{part.name}' MaxTime "
            f"({part.max_time_min} min)"
        )
    if not part.slurm_partition and par.nodes > 1:
        problems.append(f"parallelism.nodes={par.nodes} needs a Slurm partition; '{part.name}' runs locally")
    drill = cfg.drill
    if drill.checkpoint.enabled and not 1 <= drill.checkpoint.at_step < train.steps:
        problems.append(
            f"drill.checkpoint.at_step={drill.checkpoint.at_step} must be in [1, train.steps={train.steps})"
        )
    for name in ("preempt", "kill_worker", "reshape"):
        sub = getattr(drill, name)
        if sub.enabled and not 1 <= sub.at_step < train.steps:
            problems.append(f"drill.{name}.at_step={sub.at_step} must be in [1, train.steps={train.steps})")
    if drill.kill_worker.enabled and not 0 <= drill.kill_worker.rank < par.world_size:
        problems.append(
            f"drill.kill_worker.rank={drill.kill_worker.rank} is not a rank of a {par.world_size}-rank run"
        )
    if drill.straggler.enabled and not (par.world_size >= 2 and 0 <= drill.straggler.rank < par.world_size):
        problems.append(
            f"drill.straggler.rank={drill.straggler.rank} must be a rank of a run of 2 or more ranks "
            f"(this run has {par.world_size}): a straggler is slow against the others"
        )
    if drill.reshape.enabled:
        problems += _reshape_problems(cfg)
    return problems


def _reshape_problems(cfg: Config) -> list[str]:
    drill, par = cfg.drill, cfg.parallelism
    new = drill.reshape.world_size
    problems = []
    if not (1 <= new < par.world_size and par.world_size % new == 0 and new <= par.gpus_per_node):
        problems.append(
            f"drill.reshape.world_size={new} must be fewer ranks than the run's {par.world_size}, divide it "
            f"(the global batch is kept by more gradient accumulation) and fit on its first node "
            f"(parallelism.gpus_per_node={par.gpus_per_node})"
        )
    if par.zero_stage not in (1, 2):
        problems.append(
            f"drill.reshape needs parallelism.zero_stage 1 or 2 (is {par.zero_stage}): the universal "
            "checkpoint is converted from ZeRO-1/2 optimizer shards here"
        )
    if drill.interrupting():
        problems.append(
            f"drill.reshape does not combine with {'+'.join(drill.interrupting())}: run them as separate points"
        )
    return problems


def check_points(labelled: Sequence[tuple[str, Config]]) -> None:
    """Raise one ConfigError listing every impossible point, so nothing is submitted."""
    lines = [f"  {label}: {problem}" for label, cfg in labelled for problem in point_problems(cfg)]
    if lines:
        raise ConfigError(
            f"{len(lines)} problem(s) in the sweep; nothing was submitted. Fix the config or the overrides:\n"
            + "\n".join(lines)
        )
