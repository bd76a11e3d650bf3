"""Checks of every point before anything is submitted: the memory model's verdict (a result,
not an error) and the rules that make a point impossible to run (errors, all reported at once)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

import psutil

from pipeline.config.container import image_problems
from pipeline.config.dsconfig import ds_config
from pipeline.config.pretrained import PretrainedError, described
from pipeline.config.pretrained import describe as _describe
from pipeline.config.schema import Config, ConfigError, is_system_path
from pipeline.data.chatset import ChatData, chat_problems, load_chat
from pipeline.data.tokenfile import DataError, data_problems
from pipeline.home import project_home
from pipeline.measure import describe as desc
from pipeline.measure.flops import ModelShape
from pipeline.measure.memory import MemoryEstimate, MemoryQuery, Verdict, advice, estimate
from pipeline.measure.scaling import Collective, bucket_messages, comm_elem_bytes

GIB = 2**30
MAX_RANKS_PER_CORE = 2
"""CPU partitions: more ranks per node than this many per core is refused (64 ranks on 2 cores
would only thrash; 2 per core still trains, slowly, as the multi-rank tests do)."""


def capacity_bytes(cfg: Config) -> int:
    """Memory per device: partition.gpu_mem_gib when set (on a CPU partition: the memory one rank
    may use, a real limit under search.micro_batch), else on CPU the host's share per rank."""
    if cfg.partition.gpu_mem_gib > 0:
        return int(cfg.partition.gpu_mem_gib * GIB)
    return int(psutil.virtual_memory().total // max(1, cfg.parallelism.per_node))


def host_capacity_bytes(cfg: Config) -> int | None:
    """Memory of one node for the job: partition.mem_gb_per_node (GB, what Slurm grants), else
    the node's own (partition.node_mem_gb), or on the local machine its physical memory; None
    where Slurm's default applies and the node is not known here."""
    known = cfg.partition.mem_gb_per_node or cfg.partition.node_mem_gb
    if known:
        return int(known * 1e9)
    if not cfg.partition.slurm_partition:
        return int(psutil.virtual_memory().total)
    return None


def describe(model: object, targets: Sequence[str] = ()) -> desc.ModelDescription:
    """The model's description (pipeline/config/pretrained.py); a model transformers cannot
    build is a ConfigError."""
    try:
        return _describe(model, targets)
    except PretrainedError as e:
        raise ConfigError(str(e)) from e


def _method(cfg: Config) -> dict[str, object]:
    """The method's part of the memory query: for LoRA and QLoRA the adapters' trainable
    parameters at the configured rank and targets and the weights stored in 4-bit, counted on
    the model's description (any model, presets included)."""
    method = cfg.method
    if not method.adapters:
        return {"method": "full"}
    d = describe(cfg.model, method.target_modules)
    return {
        "method": method.name,
        "trainable_params": desc.adapter_params(d, method.lora_rank, method.target_modules),
        "quantized_params": desc.quantized_params(d),
    }


def memory_query(cfg: Config, on_gpu: bool | None = None) -> MemoryQuery:
    p = cfg.parallelism
    rest = {
        "micro_batch": p.micro_batch,
        "zero_stage": p.zero_stage,
        "dp_ranks": p.world_size,
        "capacity_bytes": capacity_bytes(cfg),
        "precision": cfg.precision.name,
        "offload_optimizer": p.offload_optimizer != "none",
        "offload_param": p.offload_param != "none",
        "activation_checkpointing": p.activation_checkpointing,
        "on_gpu": cfg.partition.is_gpu if on_gpu is None else on_gpu,
        "ranks_per_node": p.gpus_per_node,
        "host_capacity_bytes": host_capacity_bytes(cfg),
        "zero_init": p.zero_stage == 3,
        **_method(cfg),
    }
    if described(cfg.model):
        q = MemoryQuery.from_description(
            describe(cfg.model, cfg.method.target_modules), cfg.model.seq_len, **rest
        )
    else:
        q = MemoryQuery.from_shape(ModelShape.of(cfg.model), **rest)
    row = data_row_len(cfg)
    return q if row == q.seq_len else replace(q, seq_len=row)


def chat_data(cfg: Config) -> ChatData | None:
    """The point's chat set fitted to its seq_len (tokenized once, cached); None for other
    data, or a set that cannot be read (data_problems reports why)."""
    if cfg.data.kind != "chat":
        return None
    try:
        return load_chat(cfg.data, cfg.model.seq_len)
    except DataError:
        return None


def data_row_len(cfg: Config) -> int:
    """The longest row a micro-batch of the point's data computes: model.seq_len, but for a
    padded chat set the longest sample (a micro-batch pads to its longest, and one may hold it)."""
    cd = chat_data(cfg) if cfg.data.packing == "pad" else None
    if cd is None or not cd.longest[0]:
        return cfg.model.seq_len
    return cd.longest[0]


def tail_problem(cfg: Config, fit: MemoryFit) -> str | None:
    """A padded chat set whose median sample fits but whose longest does not: refused, naming
    the sample (on any partition: the data's tail, not the partition, is what breaks)."""
    cd = chat_data(cfg) if cfg.data.packing == "pad" else None
    if cd is None or fit.estimate.verdict != Verdict.DOES_NOT_FIT:
        return None
    pos = [*cd.train.positions, *cd.eval.positions]
    median = max(1, int(sorted(pos)[len(pos) // 2]))
    at_median = estimate(replace(fit.query, seq_len=median))
    if at_median.verdict == Verdict.DOES_NOT_FIT:
        return None
    e, (longest, where) = fit.estimate, cd.longest
    return (
        f"data.path: {where}, the longest sample ({longest} positions), does not fit partition "
        f"'{cfg.partition.name}': a padded micro-batch of {cfg.parallelism.micro_batch} holding it needs about "
        f"{e.total_bytes / GIB:.1f} GiB per rank of {e.capacity_bytes / GIB:.1f} GiB (headroom {e.headroom_frac:.0%}, "
        f"at least 15% needed), while the median sample ({median} positions) fits ({at_median.total_bytes / GIB:.1f} "
        "GiB). Drop or truncate the tail (data.overlong=drop or a shorter model.seq_len), pack "
        "(data.packing=pack), or a smaller parallelism.micro_batch"
    )


def memory_estimate(cfg: Config, on_gpu: bool | None = None) -> MemoryEstimate:
    return estimate(memory_query(cfg, on_gpu))


@dataclass(frozen=True)
class MemoryFit:
    """A point's memory model on the login node: the query and its estimate, computed once
    (memory_fit) when the sweep is planned and carried to every check and to the manifest's
    verdict, instead of each of them rebuilding the query (a model description, for presets
    and LoRA) and the estimate again."""

    query: MemoryQuery
    estimate: MemoryEstimate

    @property
    def verdict(self) -> Verdict:
        return self.estimate.verdict


def memory_fit(cfg: Config) -> MemoryFit:
    """The point's MemoryFit, as the login node sees the partition (its GPUs or its CPU share)."""
    q = memory_query(cfg)
    return MemoryFit(q, estimate(q))


def search_capacity_bytes(cfg: Config) -> int:
    """The device memory the micro-batch search works against (a real per-rank limit on CPU)."""
    return capacity_bytes(cfg)


def bucket_plan(cfg: Config, q: MemoryQuery | None = None) -> tuple[Collective, ...]:
    """The messages of one step of the point's ZeRO stage at their real sizes (bucket_messages):
    the DeepSpeed config the job builds, the parameters as the memory estimate counts them
    (trainable: the adapters' for LoRA), the precision's element sizes. `q`: the point's memory
    query when the caller has it."""
    ds = ds_config(cfg.parallelism, cfg.precision, cfg.train, pin_memory=False)
    q = q or memory_query(cfg)
    trainable = q.params if q.trainable_params is None else q.trainable_params
    param_b, grad_b = comm_elem_bytes(ds)
    stage = cfg.parallelism.zero_stage
    return bucket_messages(stage, ds["zero_optimization"], int(trainable), param_b, grad_b, int(q.params))


def comm_problems(cfg: Config, fit: MemoryFit | None = None) -> list[str]:
    """Collective buffers the bandwidth probe allocates on each rank (input and output of the
    largest message: of train.comm_sizes_mb, or the ZeRO stage's message at its real size
    (bucket_plan); torch.zeros + torch.empty in measure_collectives, at most twice the size):
    refused when they cannot fit in the rank's memory. The probe runs before the model is built
    and frees its buffers (runner.Attempt: probe, then build), so they need the rank's memory,
    not room beside the model. `fit`: the point's memory fit when the caller has it."""
    t, par = cfg.train, cfg.parallelism
    if not (t.measure_comm and par.world_size > 1 and t.comm_sizes_mb):
        return []
    fit = fit or memory_fit(cfg)
    largest = max(t.comm_sizes_mb) * 1e6
    msg = max(bucket_plan(cfg, fit.query), key=lambda c: c.size_bytes, default=None)
    buffers = 2 * max(largest, msg.size_bytes if msg else 0.0)
    e = fit.estimate
    if buffers <= e.capacity_bytes:
        return []
    beside = f"over the {e.capacity_bytes / GIB:.1f} GiB of a rank on partition '{cfg.partition.name}'"
    if msg is not None and msg.size_bytes > largest:
        return [
            f"train.measure_comm=true: the bandwidth probe times ZeRO-{par.zero_stage}'s {msg.op} at its real "
            f"message size, {msg.size_bytes / 1e6:.0f} MB, and allocates {buffers / GIB:.1f} GiB per rank for it "
            f"{beside}; allowed: train.measure_comm=false, or a partition with "
            f"{buffers / GIB:.1f} GiB per rank"
        ]
    return [
        f"train.comm_sizes_mb={list(t.comm_sizes_mb)}: the bandwidth probe allocates {buffers / GIB:.1f} GiB per rank "
        f"(input and output of the largest size) {beside}; allowed: sizes whose double fits in a rank's memory, "
        "e.g. [1, 4, 16]"
    ]


def search_problems(cfg: Config, fit: MemoryFit | None = None) -> list[str]:
    """search.micro_batch=true that cannot find anything: a cap below the start, or a memory
    limit that does not hold the model states (micro-batch 1 cannot fit). `fit`: the point's
    memory fit when the caller has it."""
    s = cfg.search
    if not s.micro_batch:
        return []
    out = []
    if s.start and s.cap < s.start:
        out.append(f"search.cap={s.cap} is below search.start={s.start}; allowed: search.cap >= search.start")
    fit = fit or memory_fit(cfg)
    q, e = fit.query, fit.estimate
    states = e.model_states.device_bytes + (0 if q.on_gpu else e.model_states.cpu_bytes)
    limit = search_capacity_bytes(cfg)
    if states >= limit:
        out.append(
            f"search.micro_batch=true with {limit / GIB:.2f} GiB per rank (partition.gpu_mem_gib, the limit the "
            f"search works under) is below the model states alone ({states / GIB:.2f} GiB): no micro-batch can "
            "fit; allowed: a device memory above the model states (`qualify fit` shows them)"
        )
    return out


def memory_problems(cfg: Config, fit: MemoryFit | None = None) -> list[str]:
    """Memory that cannot hold the point, refused before submission: on a CPU partition (the
    local machine) the per-rank share of the host, on any partition the node's host memory when
    it is known. A GPU point whose device verdict is does_not_fit stays a result (recorded
    unrun by the job), as a GPU is not this machine. `fit`: the point's memory fit when the
    caller has it; the advice is worked out only for a problem that quotes it."""
    fit = fit or memory_fit(cfg)
    if (tail := tail_problem(cfg, fit)) is not None:
        return [tail]
    e = fit.estimate
    out: list[str] = []
    part = cfg.partition
    device_short = not part.is_gpu and e.verdict == Verdict.DOES_NOT_FIT
    host_short = e.host_verdict == Verdict.DOES_NOT_FIT and bool(e.host_capacity_bytes)
    tips = advice(fit.query, now=e) if device_short or host_short else []
    hint = f" Advice: {'; '.join(tips)}." if tips else ""
    if device_short:
        out.append(
            f"model={cfg.model.name} needs about {e.total_bytes / GIB:.1f} GiB per rank on partition "
            f"'{part.name}', which has {e.capacity_bytes / GIB:.1f} GiB per rank (headroom "
            f"{e.headroom_frac:.0%}, at least 15% needed; `qualify fit` shows every term).{hint}"
        )
    if host_short and e.host_capacity_bytes:  # (the second test narrows the type for mypy)
        out.append(
            f"host memory: {part.name} nodes would need about {e.host_bytes_per_node / 1e9:.0f} GB per node "
            f"({cfg.parallelism.gpus_per_node} ranks x their offloaded states, start-up copy and runtime) "
            f"of {e.host_capacity_bytes / 1e9:.0f} GB (partition.mem_gb_per_node, else partition.node_mem_gb, or this machine's memory on the "
            f"local partition; 15% headroom needed).{hint}"
        )
    return out


def point_problems(cfg: Config, fit: MemoryFit | None = None) -> list[str]:
    """What makes this point impossible to run as configured (empty: fine). `fit`: the point's
    memory fit, computed once by the planner (else here, once for all the memory checks)."""
    problems: list[str] = []
    par, part, train = cfg.parallelism, cfg.partition, cfg.train
    if part.is_gpu and par.per_node > part.gpus_per_node:
        problems.append(
            f"parallelism.gpus_per_node={par.gpus_per_node} is more than partition '{part.name}' has per node "
            f"(partition.gpus_per_node={part.gpus_per_node})"
        )
    cores = os.cpu_count() or 1
    if not part.is_gpu and par.per_node > MAX_RANKS_PER_CORE * cores:
        problems.append(
            f"parallelism.gpus_per_node={par.gpus_per_node} plans {par.gpus_per_node} CPU ranks on a node of "
            f"{cores} core(s) on partition '{part.name}'; allowed: 1 to {MAX_RANKS_PER_CORE * cores} "
            f"({MAX_RANKS_PER_CORE} per core)"
        )
    if part.max_time_min is not None and part.time_limit_min > part.max_time_min:
        problems.append(
            f"partition.time_limit_min={part.time_limit_min} is over partition '{part.name}' MaxTime "
            f"({part.max_time_min} min)"
        )
    drill = cfg.drill
    for name, sub in drill.sections().items():
        if sub.enabled and hasattr(sub, "at_step") and not 1 <= sub.at_step < train.steps:
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
    fit = fit or memory_fit(cfg)
    problems += comm_problems(cfg, fit)
    return (
        problems
        + (
            chat_problems(cfg.data, cfg.model.vocab_size, cfg.model.seq_len)
            if cfg.data.kind == "chat"
            else data_problems(cfg.data, cfg.model.vocab_size, cfg.model.seq_len)
        )
        + memory_problems(cfg, fit)
        + search_problems(cfg, fit)
        + method_problems(cfg)
        + image_problems(cfg.partition.container, project_home())
    )


def target_problem(cfg: Config) -> str | None:
    """LoRA targets that match no linear layer of the model (peft's rule), naming those it has."""
    method = cfg.method
    if not (method.adapters and method.target_modules):
        return None
    d = describe(cfg.model, ())
    outside = desc.outside_blocks(d, method.target_modules)
    if outside:
        return (
            f"method.target_modules={list(method.target_modules)}: {', '.join(outside)} is outside the transformer "
            "blocks (the embedding or the output layer), which this project's LoRA does not adapt; allowed: the "
            f"linear layers of its blocks, {', '.join(n for n in desc.linear_names(d) if n not in outside)}"
        )
    routers = desc.routers_named(d, method.target_modules)
    if routers:
        return (
            f"method.target_modules={list(method.target_modules)}: {', '.join(routers)} names the MoE router "
            f"of the {d.family} model, which picks the experts and is not an adapter target; allowed: the other "
            f"linear layers of its blocks, {', '.join(n for n in desc.linear_names(d) if n not in routers)}"
        )
    lacking = desc.unmatched_targets(d, method.target_modules)
    if not lacking:
        return None
    return (
        f"method.target_modules={list(method.target_modules)}: the {d.family} model has no linear layer "
        f"named {', '.join(lacking)}; its linear layers are {', '.join(desc.linear_names(d))} (empty: every "
        "linear layer but the output head, peft's all-linear)"
    )


def method_problems(cfg: Config) -> list[str]:
    """LoRA targets the model lacks, and adapters with the reshape drill. QLoRA at a ZeRO layout
    it cannot run with is not here: in a grid it is a recorded result (method_grid_problems)."""
    method = cfg.method
    problems: list[str] = []
    lacking = target_problem(cfg)
    if lacking:
        problems.append(lacking)
    if method.adapters and cfg.drill.reshape.enabled:
        problems.append(
            f"drill.reshape needs method=full (is {method.name}): the universal checkpoint conversion is not "
            "verified for checkpoints that hold only the adapters"
        )
    return problems


def method_grid_problems(labelled: Sequence[tuple[str, Config]]) -> list[str]:
    """A method that no point of the sweep can run is bad input (refused, exit 2). Where a grid
    crosses a method with some layouts it cannot run with and others it can (method=qlora over
    ZeRO 1-3), those points stay: each ends as an unsupported_method result, with the reason."""
    by_method: dict[str, list[tuple[str, str | None]]] = {}
    for label, cfg in labelled:
        why = cfg.method.cannot_run_with(cfg.parallelism.zero_stage, cfg.parallelism.offload_param)
        by_method.setdefault(cfg.method.name, []).append((label, why))
    lines = []
    for points in by_method.values():
        if all(why is not None for _, why in points):
            lines += [f"  {label}: {why}" for label, why in points]
    return lines


def _reshape_problems(cfg: Config) -> list[str]:
    drill, par = cfg.drill, cfg.parallelism
    new = drill.reshape.world_size
    problems = []
    if not (1 <= new < par.world_size and par.world_size % new == 0 and new <= par.per_node):
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


def check_points(labelled: Sequence[tuple[str, Config]], fits: Sequence[MemoryFit] | None = None) -> None:
    """Raise one ConfigError listing every impossible point, so nothing is submitted. `fits`:
    each point's memory fit, in the order of `labelled` (the planner's; else computed here)."""
    carried = fits if fits is not None else [None] * len(labelled)
    lines = [
        f"  {label}: {problem}"
        for (label, cfg), fit in zip(labelled, carried, strict=True)
        for problem in point_problems(cfg, fit)
    ]
    lines += method_grid_problems(labelled)
    if lines:
        raise ConfigError(
            f"{len(lines)} problem(s) in the sweep; nothing was submitted. Fix the config or the overrides:\n"
            + "\n".join(lines)
        )


def check_runs_dir(runs_dir: str) -> Path:
    """The folder a sweep will write into, resolved as the sweep resolves it (relative to the
    project home); refused unless it is, or can be created as, a writable folder outside the
    system's folders. Nothing is created here."""
    from pipeline.home import project_home

    given = Path(runs_dir)
    path = (given if given.is_absolute() else project_home() / given).resolve()

    def refuse(why: str) -> NoReturn:
        raise ConfigError(
            f"Invalid value for 'runs_dir': {runs_dir!r} ({path}) {why}. Allowed: a folder you can write, "
            "or one that can be created in a folder you can write, outside the system's folders "
            "(/, /etc, /usr, /proc ...). Nothing was submitted."
        )

    if is_system_path(str(path)):
        refuse("is a system path")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        refuse(f"cannot be a folder: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        refuse(f"is not writable: {existing} does not let this user write")
    return path
