"""A resolved config as the job receives it (YAML) back into the typed dataclasses, and the
names derived from it. OmegaConf only: no Hydra, so the job side never loads Hydra's
composition machinery (that is `pipeline.config.compose`, on the login node)."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from pipeline.config.schema import Config


def config_from_yaml(text: str) -> Config:
    """Rebuild a typed Config from its resolved YAML (validated at composition already)."""
    merged = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.create(text))
    assert isinstance(merged, DictConfig)
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, Config)
    return cfg


@dataclass(frozen=True)
class Candidate:
    """The one definition of a *candidate*: what one row of the report compares and the runs it
    groups (tag sq.candidate). It is where (the partition), what (the model), how (the method
    with its LoRA rank, the precision) and how much (the parallelism preset, nodes x GPUs per
    node, micro-batch, gradient accumulation, activation checkpointing) on which data: real
    data is a candidate of its own (its speed and target differ), the synthetic task is not
    named. Drills, seeds and step counts are not part of it: the runs of one candidate are its
    repetitions and its drills, the evidence the report judges it on."""

    partition: str
    model: str
    method: str  # MethodConfig.label: full, or lora-r8
    precision: str
    shape: str  # zero2-1x8-mb1-ga1[-ac][-<data>[-pad|-pack]]

    @classmethod
    def of(cls, cfg: Config) -> Candidate:
        p = cfg.parallelism
        shape = f"{p.name}-{p.nodes}x{p.gpus_per_node}-mb{p.micro_batch}-ga{p.grad_accum}"
        if p.activation_checkpointing:
            shape += "-ac"
        if cfg.data.kind != "synthetic":
            shape += f"-{cfg.data.name}"
        if cfg.data.kind == "chat":  # padded and packed runs of one set are two candidates
            shape += f"-{cfg.data.packing}"
        return cls(cfg.partition.name, cfg.model.name, cfg.method.label, cfg.precision.name, shape)

    @property
    def name(self) -> str:
        """partition/model/method/precision/shape, e.g. h100/llama-7b/full/bf16/zero3-1x8-mb1-ga1."""
        return "/".join((self.partition, self.model, self.method, self.precision, self.shape))


def candidate_name(cfg: Config) -> str:
    """The candidate's name (`Candidate`), as tagged and shown."""
    return Candidate.of(cfg).name


def series_name(cfg: Config) -> str:
    """The candidate without its size (nodes x GPUs per node): its points at several sizes, e.g.
    `parallelism.nodes=1,2`, are one scaling series (tag sq.series)."""
    p = cfg.parallelism
    return candidate_name(cfg).replace(f"-{p.nodes}x{p.gpus_per_node}-", "-", 1)


def drill_label(cfg: Config) -> str:
    names = cfg.drill.enabled_names()
    return "+".join(names) if names else "none"
