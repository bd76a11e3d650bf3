"""partition.container: the image the job's ranks run in, as the site runs its jobs (Slurm's own
OCI support, Pyxis/Enroot, Apptainer), or none (the project's venv on the shared filesystem).

The values are checked here (pure: kinds, mount syntax, names); `image_problems` checks what
the login node can see (the image exists), before anything is submitted. How each kind is
launched (srun flags, the interpreter) is pipeline.slurm.container's.
"""

from __future__ import annotations

import os
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from pipeline.config.checks import require as _require

ContainerKind = Literal["none", "oci", "pyxis", "apptainer"]
CONTAINER_KINDS: tuple[str, ...] = get_args(ContainerKind)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# a path inside a mount or an image: no `,` (the separator of --container-mounts and --bind) and
# no `:` (the separator of source, destination and options)
MOUNT_PATH = re.compile(r"/[^,:\s]*")
MOUNT_OPTIONS = ("ro", "rw")
# a Pyxis/Enroot image that is not a file: a registry reference (`nvcr.io#nvidia/pytorch:24.01-py3`,
# `docker://...`); the login node cannot check it, the node pulls it
REGISTRY_REF = re.compile(r"(?:[a-z]+://)?[A-Za-z0-9][A-Za-z0-9._\-/:#@]*")


@dataclass
class ContainerConfig:
    """Where the ranks run: inside an image (docs/clusters.md, "Containers"), or on the host."""

    kind: str = "none"
    """none (the project's venv on the host) | oci (Slurm's own `srun --container <bundle>`, with
    oci.conf on the nodes) | pyxis (`srun --container-image`, Pyxis + Enroot) | apptainer
    (`apptainer exec --nv <image.sif> python` starts each rank)."""
    image: str | None = None
    """oci: the OCI bundle folder (config.json + rootfs); pyxis: an Enroot squashfs file or a
    registry reference (nvcr.io#nvidia/pytorch:24.01-py3); apptainer: the .sif file. A relative
    path is relative to the project home. Required unless kind is none (ignored then, like the
    fields below: kind=none,oci compares the same image with the host in one sweep)."""
    mounts: list[str] = field(default_factory=list)
    """Host folders bound into the image, `SRC:DST` or `SRC:DST:ro|rw`, absolute paths without
    `,` or `:`. The project and its runs folder (and the venv, when python is null) are bound by
    the tool itself at the same paths."""
    workdir: str | None = None
    """The ranks' working folder inside the image, absolute; null: the project home."""
    env: list[str] = field(default_factory=list)
    """Names of host environment variables passed into the image (NCCL_*, a proxy, ...), besides
    what the tool passes itself (SLURM_*, SQ_*, PYTHONPATH); names only, never values."""
    python: str | None = None
    """The image's own interpreter (an absolute path inside the image, with this project
    installed there); null: the project's venv, bound into the image at its host path (the
    image must then carry a compatible libc and CUDA user space)."""

    def __post_init__(self) -> None:
        key = "partition.container"
        _require(self.kind in CONTAINER_KINDS, f"{key}.kind", self.kind, " | ".join(CONTAINER_KINDS))
        if self.kind == "none":  # the other fields are kept but unused: kind=none,oci compares both
            return
        _require(
            bool(self.image and self.image.strip()),
            f"{key}.image",
            self.image,
            f"the image to run in: kind {self.kind} has no image ("
            + {
                "oci": "an OCI bundle folder",
                "pyxis": "a squashfs file or registry reference",
                "apptainer": "a .sif file",
            }[self.kind]
            + ")",
        )
        assert self.image is not None
        _require(
            not _control(self.image) and "," not in self.image,
            f"{key}.image",
            self.image,
            "one path or reference without control characters or commas",
        )
        if self.kind != "pyxis" or _is_path(self.image):
            _require(":" not in self.image, f"{key}.image", self.image, "a path without ':'")
        else:
            _require(
                REGISTRY_REF.fullmatch(self.image) is not None,
                f"{key}.image",
                self.image,
                "a registry reference such as nvcr.io#nvidia/pytorch:24.01-py3",
            )
        for i, mount in enumerate(self.mounts):
            _require(
                mount_parts(mount) is not None,
                f"{key}.mounts[{i}]",
                mount,
                "SRC:DST or SRC:DST:ro|rw, absolute paths without ',' ':' or blanks",
            )
        for name in self.env:
            _require(
                ENV_NAME.fullmatch(name) is not None,
                f"{key}.env",
                name,
                "environment variable names (letters, digits, _), not NAME=value",
            )
        if self.kind == "oci":  # Slurm 22.05 adds nothing to the bundle: its config.json states them
            _require(
                not self.mounts and self.workdir is None,
                f"{key}.mounts",
                self.mounts,
                "none with kind oci (and no workdir): the bundle's config.json states its mounts",
            )
        for k in ("workdir", "python"):
            value = getattr(self, k)
            _require(
                value is None or MOUNT_PATH.fullmatch(value) is not None,
                f"{key}.{k}",
                value,
                "an absolute path inside the image without ',' ':' or blanks, or null",
            )

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    def image_path(self, home: Path) -> Path | None:
        """The image as a file or folder on the login node (relative: under `home`); None for a
        Pyxis registry reference, which only the node can pull."""
        if not self.enabled or self.image is None or (self.kind == "pyxis" and not _is_path(self.image)):
            return None
        path = Path(os.path.expanduser(self.image))
        return path if path.is_absolute() else home / path

    def label(self, home: Path) -> str:
        """`<kind>:<image>` (the image as a path the login node resolves), or `none`."""
        if not self.enabled:
            return "none"
        path = self.image_path(home)
        return f"{self.kind}:{path if path is not None else self.image}"


def mount_parts(mount: str) -> tuple[str, str, str] | None:
    """(source, destination, options) of `SRC:DST[:ro|rw]`; None when malformed."""
    parts = mount.split(":")
    if len(parts) not in (2, 3) or _control(mount):
        return None
    src, dst, opts = parts[0], parts[1], parts[2] if len(parts) == 3 else "rw"
    ok = all(MOUNT_PATH.fullmatch(p) for p in (src, dst)) and opts in MOUNT_OPTIONS
    return (src, dst, opts) if ok else None


def image_problems(container: ContainerConfig, home: Path) -> list[str]:
    """What the login node can tell is wrong: an image (or a mount's source) that is not there.
    Empty for kind none and for a Pyxis registry reference."""
    problems: list[str] = []
    path = container.image_path(home)
    if path is not None:
        want = {
            "oci": "an OCI bundle folder with config.json",
            "apptainer": "a .sif file",
            "pyxis": "a squashfs file",
        }[container.kind]
        ok = (path / "config.json").is_file() if container.kind == "oci" else path.is_file()
        if not ok:
            problems.append(
                f"partition.container.image={container.image!r} ({path}) is not {want} this login "
                f"node can see; the nodes read the same shared path"
            )
    for i, mount in enumerate(container.mounts):
        parts = mount_parts(mount)
        if parts and not Path(parts[0]).exists():
            problems.append(
                f"partition.container.mounts[{i}]={mount!r}: its source {parts[0]} does not exist"
            )
    return problems


def _is_path(image: str) -> bool:
    return image.startswith(("/", "./", "../", "~")) or image.endswith((".sqsh", ".squashfs", ".sif"))


def _control(value: str) -> bool:
    return any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in value)
