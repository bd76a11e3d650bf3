"""Executors: the embedded default (submitit local) and Slurm (submitit, one job array per
resource shape). Each point's Slurm resources come from its own composed config, which is
what hydra-submitit-launcher cannot do (it fixes one resource set per multirun)."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import drills
from pipeline.config.schema import Config, ConfigError, LauncherConfig
from pipeline.home import project_home
from pipeline.sched.slurm import ContainerLaunch, ContainerSpec, image_digest, launch


@dataclass(frozen=True)
class ResourceShape:
    """Points with the same shape go into one job array."""

    partition: str
    gres: str | None
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    mem_gb: float | None
    time_min: int
    account: str | None
    qos: str | None
    constraint: str | None
    setup: tuple[str, ...]
    signal_delay_s: int  # the warning (USR2) this long before the time limit
    container: ContainerSpec | None = None  # partition.container (pipeline.slurm.container)
    runs_dir: str = ""  # the sweep's runs folder: bound into an image at its own path

    @classmethod
    def of(cls, cfg: Config) -> ResourceShape:
        part, par = cfg.partition, cfg.parallelism
        time_min, delay = part.time_limit_min, cfg.launcher.signal_delay_s
        drill_limit = drills.time_limit(cfg.drill)  # the time-out drill: a limit shorter than the run
        if drill_limit is not None:
            time_min, delay = drill_limit
        gres = f"gpu:{part.gpu_type}:{par.gpus_per_node}" if part.is_gpu else None
        return cls(
            partition=part.slurm_partition or "",
            gres=gres,
            nodes=par.nodes,
            tasks_per_node=par.per_node,
            cpus_per_task=part.cpus_per_task,
            mem_gb=part.mem_gb_per_node,
            time_min=time_min,
            account=part.account,
            qos=part.qos,
            constraint=part.constraint,
            setup=tuple(part.setup),
            signal_delay_s=delay,
            **_container_fields(cfg),
        )

    def problems(self) -> list[str]:
        """Values that cannot be written into an sbatch script as they are: a line break (or
        any control character) would end an `#SBATCH` line and start a directive or a command
        of its own. Everything else is quoted (submitit shlex-quotes each directive's value,
        `setup_lines` quotes what it exports), so quotes, `$()`, backticks and `;` stay inert."""
        fields = {
            "partition.slurm_partition": self.partition,
            "partition.gpu_type (in --gres)": self.gres,
            "partition.account": self.account,
            "partition.qos": self.qos,
            "partition.constraint": self.constraint,
            **{f"partition.setup[{i}]": line for i, line in enumerate(self.setup)},
        }
        return [
            f"{key}={value!r} contains a control character or line break ({_first_control(value)})"
            for key, value in fields.items()
            if value is not None and _first_control(value)
        ]

    def check(self) -> None:
        """Raise ConfigError naming every value that cannot reach an sbatch script safely."""
        problems = self.problems()
        if problems:
            raise ConfigError(
                "Values that go into the sbatch script must be single lines without control "
                "characters (a line break would add #SBATCH directives or commands of its own); "
                "nothing was submitted: " + "; ".join(problems) + "."
            )

    def label(self) -> str:
        gres = self.gres or "cpu"
        return f"{self.partition}:{gres}:{self.nodes}n{self.tasks_per_node}t:{self.time_min}m"


# `scancel --signal=USR2 --full` also signals the batch shell; with submitit's srun launch an
# untrapped USR2 kills that shell and the job ends FAILED instead of requeued (cluster/README.md).
USR2_TRAP = "trap 'echo \"batch shell: got USR2, passed to the tasks\"' USR2"


def setup_lines(shape: ResourceShape) -> list[str]:
    """The batch shell's lines before srun: the USR2 trap, SQ_GRES (Slurm 22.05 sets no
    SLURM_JOB_GRES, and jobs record what they asked for), then the partition's own setup."""
    lines = [USR2_TRAP]
    if shape.gres:
        lines.append(f"export SQ_GRES={shlex.quote(shape.gres)}")
    return lines + list(shape.setup)


def clusters_folder(folder: Path, cluster: str) -> Path:
    """The submitit folder of a group's jobs: `folder` on the login node's own cluster,
    `folder/clusters/<cluster>` on another one. submitit names its files by job id, and ids are
    each cluster's own (both clusters may have a job 12): one folder per cluster keeps them apart."""
    return folder / "clusters" / cluster if cluster else folder


def slurm_executor(
    folder: Path,
    shape: ResourceShape,
    launcher: LauncherConfig,
    job_name: str,
    script_only: bool = False,
    cluster: str = "",
) -> Any:
    """A submitit executor whose sbatch flags are this shape's: partition, gres gpu:<type>:<n>,
    nodes, one task per GPU, CPUs per task, memory, time, account, qos, constraint, setup.
    script_only: for writing the script where Slurm is not installed (it cannot submit).
    cluster: another cluster of this login node's slurmdbd, as `#SBATCH --clusters=<name>`
    (sbatch then says "Submitted batch job N on cluster <name>", and submitit reads N)."""
    import submitit

    shape.check()  # plan() refused these already; a script is never written with them
    cls = _script_only_executor_class() if script_only else submitit.SlurmExecutor
    image = container_launch(shape, folder)
    # Apptainer (or an image's own python): the command that starts each rank; None: this interpreter
    python = image.python if image else None
    executor = cls(folder=str(folder), max_num_timeout=launcher.max_num_timeout, python=python)
    params: dict[str, Any] = {
        "job_name": job_name,
        "partition": shape.partition,
        "nodes": shape.nodes,
        "ntasks_per_node": shape.tasks_per_node,
        "cpus_per_task": shape.cpus_per_task,
        "time": shape.time_min,
        "signal_delay_s": shape.signal_delay_s,
        "array_parallelism": launcher.array_parallelism,
        "stderr_to_stdout": True,
        "setup": setup_lines(shape) + (list(image.setup) if image else []),
    }
    optional = {
        "gres": shape.gres,
        "mem": f"{int(shape.mem_gb)}G" if shape.mem_gb else None,
        "account": shape.account,
        "qos": shape.qos,
        "constraint": shape.constraint,
        "srun_args": list(image.srun_args) if image and image.srun_args else None,
        # held jobs wait for `scontrol release` (the submit benchmark cancels them instead);
        # another cluster's jobs go there with --clusters
        "additional_parameters": {
            **({"hold": True} if launcher.hold else {}),
            **({"clusters": cluster} if cluster else {}),
        }
        or None,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    executor.update_parameters(**params)
    return executor


def _container_fields(cfg: Config) -> dict[str, Any]:
    """A shape's container and runs folder; none asked of the file system without a container
    (group_by_shape runs for each of up to max_points points)."""
    if not cfg.partition.container.enabled:
        return {}
    home = project_home()
    return {
        "container": ContainerSpec.of(cfg.partition.container, home),
        "runs_dir": str(home / cfg.runs_dir),
    }


def container_launch(shape: ResourceShape, folder: Path) -> ContainerLaunch | None:
    """How this shape's ranks start inside its image (pipeline.slurm.container); None: on the
    host. Bound at their own paths: the project home and the runs folder, and with no image
    python this venv and the interpreter it was made from."""
    spec = shape.container
    if spec is None:
        return None
    binds = [str(project_home()), shape.runs_dir]
    if spec.python is None:
        binds += [os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)]
    binds = [b for b in binds if b and b not in ("/", "/usr")]
    digest = image_digest(spec)
    return launch(spec, folder, binds, sys.executable, bool(shape.gres), digest)


def _first_control(value: str) -> str:
    """The first control character or line/paragraph separator of `value` (as U+XXXX), or ''.
    A tab inside a setup line is allowed (the shell reads it as a blank)."""
    for ch in value:
        if ch != "\t" and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            return f"U+{ord(ch):04X}"
    return ""


def local_executor(folder: Path, cfg: Config, python: str | None = None) -> Any:
    """submitit's local executor for one point; `python`: the command that starts each rank
    (pipeline.sched.warm's client for warm ranks), else this interpreter."""
    shape = ResourceShape.of(cfg)
    executor = _local_executor_class()(folder=str(folder), python=python)
    executor.update_parameters(
        tasks_per_node=cfg.parallelism.gpus_per_node,
        timeout_min=shape.time_min,
        signal_delay_s=shape.signal_delay_s,
        stderr_to_stdout=True,  # as on Slurm: the job log (the run's artifact) holds the log records too
    )
    return executor


def sbatch_script(
    folder: Path, shape: ResourceShape, launcher: LauncherConfig, job_name: str, count: int
) -> str:
    """The sbatch script submitit writes for a group of `count` points (an array when > 1),
    built by submitit's own code path (for the golden-file test and for reading)."""
    executor = slurm_executor(folder, shape, launcher, job_name, script_only=True)
    if count > 1:
        executor.parameters["map_count"] = count
    return str(executor._make_submission_file_text(executor._submitit_command_str, "golden"))


CONTROLLER_LOG = "controller.err"


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """File descriptor 2 points at `path` (appended) inside the block: a process started there
    inherits it as its stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "a") as f:
            os.dup2(f.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _local_executor_class() -> Any:
    """submitit's LocalExecutor whose job controller (`submitit.local._local`, one process per
    point that starts the ranks and waits for them) writes its stderr to
    `<folder>/controller.err` instead of the terminal's: on Ctrl-C the terminal's SIGINT reaches
    it too, and it prints a KeyboardInterrupt traceback as it ends its ranks. The ranks write to
    their own log files, as before."""
    import submitit

    class LocalExecutor(submitit.LocalExecutor):  # type: ignore[misc]
        def _submit_command(self, command: str) -> Any:
            with _stderr_to(Path(self.folder) / CONTROLLER_LOG):
                return super()._submit_command(command)

    return LocalExecutor


def _script_only_executor_class() -> Any:
    """submitit's SlurmExecutor without its "is srun here?" check, to render scripts anywhere."""
    import submitit

    class ScriptOnlySlurmExecutor(submitit.SlurmExecutor):  # type: ignore[misc]
        @classmethod
        def affinity(cls) -> int:
            return 1

    return ScriptOnlySlurmExecutor


def group_by_shape(cfgs: Sequence[tuple[int, Config]]) -> dict[ResourceShape, list[int]]:
    groups: dict[ResourceShape, list[int]] = {}
    for i, cfg in cfgs:
        groups.setdefault(ResourceShape.of(cfg), []).append(i)
    return groups
