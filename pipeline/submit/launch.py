"""The production job's files, written from a candidate's evidence (docs/design.md, "Launch"):
runs/<sweep>/launch/<candidate>/ with job.sbatch, ds_config.json, train.yaml, spec.json,
launch.json and WHY.md. Everything is derived and checked first; a refusal writes nothing.

Nothing typed on a command line reaches job.sbatch as code: the project.* values are numbers,
the candidate is one of the sweep's names (and becomes a folder name of safe characters only),
and every other value written into the script comes from the sweep's resolved config and must
match SAFE (sbatch reads `#SBATCH` values itself; the commands quote them with shlex)."""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from pipeline.config.dsconfig import ds_config
from pipeline.config.resolved import config_from_yaml
from pipeline.config.schema import Config, ConfigError, DrillConfig
from pipeline.contract.pointdir import PointDir
from pipeline.contract.spec import JobSpec
from pipeline.contract.sweepdir import Manifest, SweepDir
from pipeline.files import write_atomic, write_json
from pipeline.home import RUNS_DIR, project_home
from pipeline.measure import launch as L
from pipeline.submit.launcher import USR2_TRAP, ResourceShape, container_launch

SMOKE_MAX_NODES = 2
SAFE = re.compile(r"[A-Za-z0-9_.,:+=@/-]+")
"""What a value written into an #SBATCH line or a path of job.sbatch may hold: no blank, quote,
`$`, backtick, `;`, `%` (Slurm's filename pattern) or line break."""


class LaunchRefused(Exception):
    """One paragraph: why the files cannot be written (exit code 2, nothing written)."""


@dataclass(frozen=True)
class Derived:
    """Every value of the job, derived from the evidence by pipeline.measure.launch."""

    nodes: int
    per_node: int
    batch: L.BatchShape
    steps: int
    step_s: float  # the projection's step time at this size
    ckpt_every: int
    ckpt_every_young: int  # Young/Daly's, before a smoke run's cap
    grace_s: int
    limit: L.TimeLimit
    restarts: int
    wall_s: float  # the projected wall time this job's --time rests on
    smoke: bool


def slug(candidate: str) -> str:
    """The candidate's folder name: its parts joined by '_', safe characters only."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", candidate).strip("_") or "candidate"


def write_launch(ev: L.LaunchEvidence, runs_dir: Path | None = None) -> int:
    """`qualify launch`'s writer: 0 with the files written, 2 (one paragraph) when refused.
    `runs_dir`: the folder the sweep's folder is in (default: the project's runs/)."""
    try:
        folder = write_files(ev, runs_dir)
    except (LaunchRefused, ConfigError) as e:
        print(f"launch: {e} Nothing was written.", file=sys.stderr)
        return 2
    print(
        f"launch: wrote {folder}/ (job.sbatch, ds_config.json, train.yaml, WHY.md); run: sbatch {folder}/job.sbatch"
    )
    return 0


def write_files(ev: L.LaunchEvidence, runs_dir: Path | None = None) -> Path:
    sweep_dir = (runs_dir or project_home() / RUNS_DIR).resolve() / ev.sweep_id
    if not (sweep_dir / SweepDir.MANIFEST).is_file():
        raise LaunchRefused(
            f"sweep {ev.sweep_id} has no folder with a manifest under {sweep_dir.parent} (give --runs-dir)."
        )
    manifest = Manifest.read(sweep_dir)
    entry = next((p for p in manifest.points if p.point_id == ev.point_id), None)
    if entry is None:
        raise LaunchRefused(
            f"run {ev.run_id}'s point {ev.point_id!r} is not in sweep {ev.sweep_id}'s manifest."
        )
    cfg = config_from_yaml(PointDir(entry.point_dir).config.read_text())
    d = derive(ev, cfg)
    folder = SweepDir(sweep_dir).launch(slug(ev.candidate))
    prod = production_config(cfg, d)
    yaml_text = OmegaConf.to_yaml(OmegaConf.structured(prod))
    config_from_yaml(yaml_text)  # the job reads it back: it must validate here first
    run_dir = folder / ("smoke" if d.smoke else "run")
    spec = JobSpec(
        sweep_id=ev.sweep_id,
        point_id=f"{'smoke' if d.smoke else 'production'}-{slug(ev.candidate)}",
        config_yaml="",  # the job reads train.yaml
        point_dir=str(run_dir),
        parent_run_id=ev.parent_run_id,
        tracking_uri=manifest.tracking_uri,
        launcher="slurm",
        kind="production",
        cluster=dict(manifest.cluster),
    )
    script = sbatch_text(folder, prod, d, ev)  # checks every value first
    (folder / "logs").mkdir(parents=True, exist_ok=True)  # Slurm opens --output there; it makes no folder
    write_atomic(folder / "train.yaml", yaml_text)
    write_json(
        folder / "ds_config.json",
        ds_config(prod.parallelism, prod.precision, prod.train, prod.partition.is_gpu),
    )
    write_json(folder / "spec.json", asdict(spec))
    write_json(folder / "launch.json", {"evidence": asdict(ev), "derived": asdict(d)})
    write_atomic(folder / "WHY.md", why_text(ev, d, prod, folder))
    write_atomic(folder / "job.sbatch", script)
    (folder / "job.sbatch").chmod(0o755)
    return folder


def derive(ev: L.LaunchEvidence, cfg: Config) -> Derived:
    """The job's values from the evidence; LaunchRefused when the request cannot be met."""
    per_node = cfg.parallelism.per_node
    gpus = ev.gpus
    if ev.smoke_steps is not None:
        gpus = min(gpus, SMOKE_MAX_NODES * per_node)
    if gpus < per_node:
        per_node = gpus
    if gpus % per_node:
        raise LaunchRefused(
            f"project.gpus={ev.gpus} does not fill whole nodes of {per_node} ranks (as qualified: "
            f"parallelism.gpus_per_node={per_node}); ask for a multiple of {per_node}."
        )
    mb = int(ev.proven_micro_batch.value)
    per_gpu_batch = ev.qualified_global_batch // ev.qualified_gpus
    wanted = ev.global_batch if ev.global_batch is not None else per_gpu_batch * ev.gpus
    batch = L.batch_shape(wanted, mb, ev.gpus)
    if batch is None:
        raise LaunchRefused(
            f"project.global_batch={wanted} is not reachable on {ev.gpus} GPUs with micro-batch {mb} "
            f"({ev.proven_micro_batch.source}): a global batch must be micro-batch x accumulation x GPUs "
            f"with a micro-batch of at most {mb}, so a multiple of {ev.gpus} of at least {ev.gpus}."
        )
    if ev.smoke_steps is not None:  # fewer GPUs: the same per-GPU batch, so the same step time
        batch = L.BatchShape(batch.micro_batch, batch.grad_accum, gpus)
    seq = cfg.model.seq_len
    per_gpu = _input(ev, "tokens_per_s_per_gpu_at_target", "tokens_per_s_per_gpu")
    step_s = L.step_s_at(batch.global_batch, seq, per_gpu, batch.gpus)
    full_steps = ev.steps or L.steps_for_tokens(ev.tokens or 0.0, batch.global_batch, seq)
    steps = ev.smoke_steps or full_steps
    young = L.checkpoint_every_steps(ev.interval_s, step_s, steps)
    every = young if ev.smoke_steps is None else min(young, max(1, steps // 2))
    grace = L.signal_grace_s(step_s, ev.stop_save_s.value)
    restart = _input(ev, "restart_s")
    stall = _input(ev, "ckpt_stall_s")
    if ev.smoke_steps is None:
        wall = ev.wall_s[1]
    else:  # the smoke run: its first start, its steps and its saves, uninterrupted
        wall = _input(ev, "start_s", default=0.0) + steps * step_s + (steps // every + 1) * stall
    limit = L.time_limit(wall, restart, grace, cfg.partition.max_time_min)
    if limit is None:
        raise LaunchRefused(
            f"no allocation of partition {cfg.partition.name} (MaxTime {cfg.partition.max_time_min} min) can "
            f"restart ({restart:.0f} s) and save before its warning ({grace} s): the run cannot be chained."
        )
    lam = _input(ev, "interruptions_per_gpu_hour") * batch.gpus / 3600.0
    return Derived(
        nodes=gpus // per_node,
        per_node=per_node,
        batch=batch,
        steps=steps,
        step_s=step_s,
        ckpt_every=every,
        ckpt_every_young=young,
        grace_s=grace,
        limit=limit,
        restarts=L.restarts_allowed(limit.jobs, lam * wall),
        wall_s=wall,
        smoke=ev.smoke_steps is not None,
    )


def _input(ev: L.LaunchEvidence, *names: str, default: float | None = None) -> float:
    for name in names:
        if name in ev.inputs:
            return float(ev.inputs[name][0])
    if default is not None:
        return default
    raise LaunchRefused(f"the projection of {ev.candidate} has no {names[-1]}: it cannot size the job.")


def production_config(cfg: Config, d: Derived) -> Config:
    """The point's resolved config at production scale: the shape, the steps, the checkpoint
    interval, the limits; no drill, no search (the micro-batch is the proven one), no probes."""
    data: Any = OmegaConf.to_container(OmegaConf.structured(cfg))
    data["parallelism"].update(
        nodes=d.nodes,
        gpus_per_node=d.per_node,
        micro_batch=d.batch.micro_batch,
        grad_accum=d.batch.grad_accum,
    )
    data["train"].update(
        steps=d.steps,
        checkpoint_interval=d.ckpt_every if d.ckpt_every < d.steps else 0,
        measure_ceiling=False,
    )
    data["drill"] = OmegaConf.to_container(OmegaConf.structured(DrillConfig()))
    data["search"]["micro_batch"] = False
    data["partition"]["time_limit_min"] = d.limit.minutes
    data["launcher"].update(
        kind="slurm",
        signal_delay_s=d.grace_s,
        max_restarts=d.restarts,
        max_num_timeout=d.restarts,
        warm_ranks=False,
    )
    return config_from_yaml(OmegaConf.to_yaml(OmegaConf.create(data)))


def _safe(name: str, value: object) -> str:
    text = str(value)
    if not SAFE.fullmatch(text):
        raise LaunchRefused(
            f"{name}={text!r} cannot be written into job.sbatch: values there may hold only letters, digits "
            "and _ . , : + = @ / - (no blank, quote, $, backtick, ; or %)."
        )
    return text


def sbatch_text(folder: Path, cfg: Config, d: Derived, ev: L.LaunchEvidence) -> str:
    """job.sbatch: the directives (each value checked by SAFE), the setup, and srun of the
    project's trainer on every rank (its arguments quoted)."""
    shape = ResourceShape.of(cfg)
    shape.check()
    part = cfg.partition
    lines = ["#!/bin/bash", f"# slurm-qualify production job: {_safe('candidate', ev.candidate)}"]
    lines.append(
        f"# from sweep {_safe('sweep', ev.sweep_id)}; every value and its source: WHY.md beside this file"
    )
    directives = {
        "job-name": f"sq-{'smoke' if d.smoke else 'prod'}-{slug(ev.candidate)}"[:120],
        "partition": shape.partition or None,
        "account": part.account,
        "qos": part.qos,
        "constraint": part.constraint,
        "nodes": d.nodes,
        "ntasks-per-node": d.per_node,
        "gres": f"gpu:{part.gpu_type}:{d.per_node}" if part.is_gpu else None,
        "cpus-per-task": part.cpus_per_task,
        "mem": f"{int(part.mem_gb_per_node)}G" if part.mem_gb_per_node else None,
        "time": d.limit.minutes,
        "signal": f"USR2@{d.grace_s}",
        "output": f"{folder}/logs/%j.out",
        "open-mode": "append",
        "chdir": str(folder),
    }
    for key, value in directives.items():
        if value is not None:
            shown = str(value) if key == "output" else _safe(f"--{key}", value)
            if key == "output":
                _safe("the launch folder", folder)
            lines.append(f"#SBATCH --{key}={shown}")
    lines.append("#SBATCH --requeue")
    chain = (
        f"one allocation of {d.limit.minutes} min"
        if d.limit.jobs == 1
        else f"a chain of {d.limit.jobs} allocations of {d.limit.minutes} min (MaxTime): each saves at the "
        "warning and requeues itself, the next resumes from that checkpoint"
    )
    lines += [
        f"# --time: {chain}; margin {L.TIME_MARGIN:.0%} of the projected wall time + the warning's grace"
    ]
    lines += [
        "# resume by hand (after a cancel or a failure): sbatch this file again; it loads the newest",
        f"# committed checkpoint of {_safe('the run folder', folder)}/{'smoke' if d.smoke else 'run'}/checkpoints",
        USR2_TRAP,
    ]
    if shape.gres:
        lines.append(f"export SQ_GRES={shlex.quote(shape.gres)}")
    if part.setup:
        lines.append("# the partition's setup lines (partition.setup, as the sweep ran them)")
        lines += list(part.setup)
    image = container_launch(shape, folder)  # the ranks in the partition's image, as the sweep ran them
    if image is not None:
        lines.append(
            f"# the ranks run in the partition's image ({_safe('partition.container', image_label(cfg))})"
        )
        lines += list(image.setup)
    python = image.python if image is not None and image.python else shlex.quote(sys.executable)
    srun = " ".join(shlex.quote(a) for a in (image.srun_args if image is not None else ()))
    cmd = " ".join(shlex.quote(c) for c in ("-m", "pipeline.job.production", str(folder)))
    lines.append(f"srun --unbuffered {srun + ' ' if srun else ''}{python} {cmd}")
    return "\n".join(lines) + "\n"


def image_label(cfg: Config) -> str:
    """kind:image of the partition's container (pipeline.config.container's label)."""
    return cfg.partition.container.label(project_home())


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.3g} h" if seconds >= 3600 else f"{seconds:.4g} s"


def why_rows(ev: L.LaunchEvidence, d: Derived, cfg: Config) -> list[tuple[str, str, str]]:
    """(value, what it is, where it came from) for every value of the job."""
    rows: list[tuple[str, str, str]] = [
        ("candidate", ev.candidate, f"sweep {ev.sweep_id}; accepted runs: {', '.join(ev.accepted_runs)}"),
        (
            "resolved config",
            f"point {ev.point_id}",
            f"the config run {ev.run_id} ran, at production scale (train.yaml)",
        ),
        (
            "nodes x ranks",
            f"{d.nodes} x {d.per_node}",
            f"project.gpus={ev.gpus}" + (", capped for the smoke run" if d.smoke else ""),
        ),
        (
            "micro-batch",
            str(d.batch.micro_batch),
            f"at most {ev.proven_micro_batch.value:g}: {ev.proven_micro_batch.source}",
        ),
        (
            "gradient accumulation",
            str(d.batch.grad_accum),
            f"global batch {d.batch.global_batch} = micro-batch x accumulation x {d.batch.gpus} GPUs (project.global_batch, else the qualified per-GPU batch)",
        ),
        (
            "steps",
            str(d.steps),
            f"--smoke {ev.smoke_steps}"
            if d.smoke
            else (
                "project.steps"
                if ev.steps
                else f"ceil(project.tokens={ev.tokens:g} / ({d.batch.global_batch} x model.seq_len {cfg.model.seq_len}))"
            ),
        ),
        (
            "step time",
            f"{d.step_s:.4g} s",
            "projected: a step's tokens / (tokens/s per GPU x GPUs), the inputs below",
        ),
        (
            "checkpoint interval",
            f"every {d.ckpt_every} steps",
            f"Young/Daly: {_h(ev.interval_s) if ev.interval_s else 'none (nothing interrupts the job): at the end'} of work / the step time = {d.ckpt_every_young} steps"
            + ("; capped at half the smoke run so it saves mid-run" if d.smoke else ""),
        ),
        (
            "--signal USR2@",
            f"{d.grace_s} s",
            f"{L.GRACE_SAFETY:g} x (step {d.step_s:.3g} s + stop save {ev.stop_save_s.value:.3g} s), whole minutes up; the save: {ev.stop_save_s.source}",
        ),
        (
            "--time",
            f"{d.limit.minutes} min",
            f"projected wall {_h(d.wall_s)} x {1 + L.TIME_MARGIN:g} (margin, assumed) + grace {d.grace_s} s"
            + (
                ""
                if d.limit.jobs == 1
                else f"; past MaxTime {cfg.partition.max_time_min} min: {d.limit.jobs} chained allocations"
            ),
        ),
        (
            "allocations",
            str(d.limit.jobs),
            "1, or the chain past the partition's MaxTime (each requeues itself at the warning)",
        ),
        (
            "requeues allowed",
            str(d.restarts),
            "the chain's, 2 x the expected interruptions, and 3 (launcher.max_restarts)",
        ),
    ]
    for name, (value, source) in ev.inputs.items():
        rows.append((f"projection input: {name}", f"{value:.4g}", source))
    return rows


def why_text(ev: L.LaunchEvidence, d: Derived, cfg: Config, folder: Path) -> str:
    """WHY.md: each value with where it came from, the expected time and cost with their band,
    and what would invalidate them."""
    rows = why_rows(ev, d, cfg)
    out = [
        f"# Why this job: {ev.candidate}",
        "",
        f"Launch folder `{folder.name}` of sweep `{ev.sweep_id}`.",
        "",
    ]
    out += ["| value | is | from |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    low, mid, high = ev.wall_s
    out += ["", "## Expected time and cost", ""]
    out.append(
        f"- wall time: {_h(mid)} (band at half and twice the interruption rate: {_h(low)} - {_h(high)})"
    )
    if ev.cost_usd is not None:
        band = (
            f"; every input's range propagated: ${ev.cost_band[0]:,.0f} - ${ev.cost_band[1]:,.0f}"
            if ev.cost_band
            else ""
        )
        out.append(
            f"- cost: ${ev.cost_usd[1]:,.2f} at ${ev.price:g}/GPU-hour (rate band ${ev.cost_usd[0]:,.2f} - ${ev.cost_usd[2]:,.2f}{band})"
        )
    else:
        out.append("- cost: not defined (the partition has no price)")
    if d.smoke:
        out.append(
            f"- this is a smoke run of {d.steps} steps: its report (smoke.md, written when it ends) compares its step and checkpoint times with the projection's inputs"
        )
    out += [
        "",
        "## What would invalidate them",
        "",
        f"- a step slower than {d.step_s * (1 + L.SMOKE_TOLERANCE):.4g} s (the projection's {d.step_s:.4g} s + {L.SMOKE_TOLERANCE:.0%}): the time and cost scale with it; run `--smoke` first",
        f"- a checkpoint stall above {_input(ev, 'ckpt_stall_s'):.4g} s or a restart above {_input(ev, 'restart_s'):.4g} s as measured: the interval and the wall time move",
        "- more interruptions than the rate assumed (see its source above), a different data set or sequence length, another software stack or partition",
        "- scaling to the target GPUs worse than the source of tokens/s per GPU says",
    ]
    return "\n".join(out) + "\n"
