"""How a point's ranks are started inside an image (partition.container), as words of the sbatch
script submitit writes: the one owner of the container flags and of the host-side requeue.

- Pyxis (Enroot): its flags go on the `srun` line (submitit's `srun_args`): `--container-image`,
  `--container-mounts`, `--container-workdir`, `--container-env`. Never `#SBATCH
  --container-image`: that would put the batch script itself in the image, where `srun` and
  `scontrol` usually are not.
- Apptainer: it replaces the interpreter (submitit's `python`): `apptainer exec --nv --bind ...
  image.sif python`. Apptainer passes the host's environment in (submitit's and Slurm's
  variables with it); the names in partition.container.env are also exported as
  APPTAINERENV_<NAME>, so that they win over the image's own definitions.
- Slurm's own OCI support: `srun --container <bundle>`, run by the runtime of the nodes'
  oci.conf; the bundle's config.json states its mounts.

Requeue from outside the image: images usually lack `scontrol`, so a rank asks for it by
writing the file SQ_REQUEUE_REQUEST (`request_requeue`); the batch shell, on the host, runs
`scontrol requeue` of its own task when it finds it as it exits (its EXIT trap), once the
ranks have saved and left. The preemption warning itself reaches the ranks through srun and the
runtime (Pyxis and Apptainer run the rank as srun's task; oci.conf's RunTimeRun starts with
`exec`, so the runtime, not a shell, gets the signal and forwards it).
"""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pipeline.config.schema import ContainerConfig, mount_parts

REQUEUE_ENV = "SQ_REQUEUE_REQUEST"
"""The file a rank writes to ask the batch shell (on the host) for `scontrol requeue`."""
REQUEUE_FOLDER = "requeue"
"""Under the submitit folder: one request file per task, named by its id."""


@dataclass(frozen=True)
class ContainerSpec:
    """partition.container as a point's resource shape holds it: hashable, paths resolved."""

    kind: str
    image: str
    mounts: tuple[str, ...]
    workdir: str
    env: tuple[str, ...]
    python: str | None

    @classmethod
    def of(cls, container: ContainerConfig, home: Path) -> ContainerSpec | None:
        """None for kind none; relative paths are the project home's."""
        if not container.enabled:
            return None
        path = container.image_path(home)
        return cls(
            kind=container.kind,
            image=str(path) if path is not None else str(container.image),
            mounts=tuple(container.mounts),
            workdir=container.workdir or str(home),
            env=tuple(container.env),
            python=container.python,
        )

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.image}"


@dataclass(frozen=True)
class ContainerLaunch:
    """What the sbatch script gets: srun flags, the interpreter command, batch shell lines."""

    srun_args: tuple[str, ...]
    python: str | None
    """The command that replaces submitit's interpreter (shell words, quoted); None: keep it."""
    setup: tuple[str, ...]


def launch(
    spec: ContainerSpec,
    folder: Path,
    binds: Sequence[str],
    interpreter: str,
    gpu: bool,
    digest: str | None = None,
) -> ContainerLaunch:
    """The srun flags, interpreter and batch lines of `spec`. `folder`: the submitit folder (its
    requeue requests); `binds`: host folders bound at the same path (the project home, the runs
    folder, and with no image python the venv and its interpreter's prefix); `interpreter`:
    this venv's python; `gpu`: the partition has GPUs (Apptainer's --nv)."""
    python = spec.python or interpreter
    mounts = _mounts(spec, binds)
    srun: tuple[str, ...] = ()
    command: str | None = None
    if spec.kind == "pyxis":
        srun = (
            f"--container-image={spec.image}",
            f"--container-mounts={','.join(mounts)}",
            f"--container-workdir={spec.workdir}",
            *((f"--container-env={','.join(spec.env)}",) if spec.env else ()),
        )
        command = shlex.quote(python) if spec.python else None
    elif spec.kind == "apptainer":
        words = ["apptainer", "exec", *(["--nv"] if gpu else []), "--bind", ",".join(mounts)]
        words += ["--pwd", spec.workdir, spec.image, python]
        command = shlex.join(words)
    elif spec.kind == "oci":
        srun = (f"--container={spec.image}",)
        command = shlex.quote(python) if spec.python else None
    return ContainerLaunch(srun, command, tuple(setup_lines(spec, folder, digest)))


def _mounts(spec: ContainerSpec, binds: Sequence[str]) -> list[str]:
    """The user's mounts, then each bind at its own path (unless the user mounted it already)."""
    mounts = list(spec.mounts)
    taken = {parts[1] for m in mounts if (parts := mount_parts(m))}
    for path in dict.fromkeys(binds):
        if path not in taken:
            mounts.append(f"{path}:{path}")
    return mounts


def setup_lines(spec: ContainerSpec, folder: Path, digest: str | None) -> list[str]:
    """The batch shell's lines (on the host, before srun): the container's name and identity and
    the host's mount namespace for the run's tags, the requeue request file and the EXIT trap
    that acts on it, and Apptainer's passthrough of the named variables."""
    requests = Path(folder) / REQUEUE_FOLDER
    lines = [
        f"export SQ_CONTAINER={shlex.quote(spec.label)}",
        *([f"export SQ_CONTAINER_DIGEST={shlex.quote(digest)}"] if digest else []),
        'export SQ_HOST_MNTNS="$(readlink /proc/self/ns/mnt)"',
        'SQ_TASK="${SLURM_ARRAY_TASK_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}"',
        'SQ_TASK="${SQ_TASK:-$SLURM_JOB_ID}"',
        f"mkdir -p {shlex.quote(str(requests))}",
        f'export {REQUEUE_ENV}={shlex.quote(str(requests))}/"$SQ_TASK"',
        f'rm -f "${REQUEUE_ENV}"',
        # the ranks asked (they saved and left): requeue this task from the host, where scontrol is
        f'trap \'[ -e "${REQUEUE_ENV}" ] && rm -f "${REQUEUE_ENV}" && '
        f'echo "batch shell: requeue asked from inside the image" && scontrol requeue "$SQ_TASK"\' EXIT',
    ]
    if spec.kind == "apptainer":
        lines += [f'[ -n "${{{n}+x}}" ] && export APPTAINERENV_{n}="${n}"' for n in spec.env]
    return lines


def request_requeue(env: Mapping[str, str] | None = None) -> bool:
    """Inside an image: ask the batch shell for the requeue (write its request file); False
    when this job has no such shell (not in a container), and the caller runs scontrol."""
    env = os.environ if env is None else env
    path = env.get(REQUEUE_ENV)
    if not path:
        return False
    Path(path).touch()  # an empty marker: its existence is the request
    return True


def image_digest(spec: ContainerSpec) -> str | None:
    """The image's identity: sha256 of the .sif or squashfs file, of an OCI bundle's
    config.json (its rootfs is not hashed), or the digest a registry reference names; None
    where none can be stated (a reference by tag only)."""
    if spec.kind == "pyxis" and not spec.image.startswith("/"):
        return spec.image.split("@", 1)[1] if "@sha256:" in spec.image else None
    path = Path(spec.image) / "config.json" if spec.kind == "oci" else Path(spec.image)
    try:
        st = path.stat()
    except OSError:
        return None
    return _sha256(str(path), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=32)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file, once per (path, size, mtime) in this process (an image is GBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return "sha256:" + h.hexdigest()
