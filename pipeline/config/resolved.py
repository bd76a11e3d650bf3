"""A resolved config as the job receives it (YAML) back into the typed dataclasses, and the
names derived from it. OmegaConf only: no Hydra, so the job side never loads Hydra's
composition machinery (that is `pipeline.config.compose`, on the login node)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from pipeline.config.schema import Config


def config_from_yaml(text: str) -> Config:
    """Rebuild a typed Config from its resolved YAML (validated at composition already)."""
    merged = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(text))
    assert isinstance(merged, DictConfig)
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, Config)
    return cfg


def candidate_name(cfg: Config) -> str:
    """partition/model/method/precision/parallelism: what one report row compares."""
    p = cfg.parallelism
    shape = f"{p.name}-{p.nodes}x{p.gpus_per_node}-mb{p.micro_batch}-ga{p.grad_accum}"
    if p.activation_checkpointing:
        shape += "-ac"
    if cfg.data.kind != "synthetic":  # real data is its own candidate (its speed and target differ)
        shape += f"-{cfg.data.name}"
    return f"{cfg.partition.name}/{cfg.model.name}/{cfg.method.label}/{cfg.precision.name}/{shape}"


def series_name(cfg: Config) -> str:
    """The candidate without its size (nodes x GPUs per node): its points at several sizes, e.g.
    `parallelism.nodes=1,2`, are one scaling series (tag sq.series)."""
    p = cfg.parallelism
    return candidate_name(cfg).replace(f"-{p.nodes}x{p.gpus_per_node}-", "-", 1)


def drill_label(cfg: Config) -> str:
    names = cfg.drill.enabled_names()
    return "+".join(names) if names else "none"
