"""The software stack a rank runs on, and the container it runs in, as the run's tags.

Procurement checklists ask per partition for the driver, CUDA, NCCL, the container runtime and
the framework versions: each is a tag `sq.stack.<name>` (pipeline.tracking.keys.STACK_TAGS),
read from the library itself (NVML, torch's own build facts, the installed distributions). A
value that cannot be read here is absent, never "unknown" or 0: a CPU node has no driver, a
CPU build of torch has no CUDA, cuDNN or NCCL.

The container: `sq.container` is `<kind>:<image>` (or `none`), `sq.container.digest` the image's
identity the login node computed (SQ_CONTAINER_DIGEST, pipeline.slurm.container), and
`sq.container.mntns` every rank's mount and pid namespace next to the host's
(`sq.container.host_mntns`, SQ_HOST_MNTNS: the batch shell's, read on the host): a rank that
ran inside an image has a mount namespace the host does not. Torch is imported lazily.
"""

from __future__ import annotations

import os
import platform
import socket
from importlib import metadata
from typing import Any

from pipeline.contract.gpu import nvml
from pipeline.tracking import keys as K

DISTRIBUTIONS = {  # tag name -> the distribution whose version it is
    "torch": "torch",
    "deepspeed": "deepspeed",
    "transformers": "transformers",
    "peft": "peft",
    "bitsandbytes": "bitsandbytes",
}
CONTAINER_ENV = "SQ_CONTAINER"  # "<kind>:<image>", exported by the batch script
DIGEST_ENV = "SQ_CONTAINER_DIGEST"  # the image's identity, computed on the login node
HOST_MNTNS_ENV = "SQ_HOST_MNTNS"  # the batch shell's (the host's) mount namespace


def distribution_versions() -> dict[str, str]:
    """Installed versions of the framework libraries; a library not installed is absent."""
    out: dict[str, str] = {}
    for name, dist in DISTRIBUTIONS.items():
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def torch_build() -> dict[str, str]:
    """CUDA, cuDNN and NCCL as this torch was built with and loads them; absent on a CPU build."""
    import torch

    out: dict[str, str] = {}
    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except RuntimeError:  # a CUDA build on a node whose cuDNN does not load
        cudnn = None
    if cudnn:
        out["cudnn"] = (
            f"{cudnn // 10000}.{(cudnn % 10000) // 100}.{cudnn % 100}" if cudnn >= 10000 else str(cudnn)
        )
    if torch.cuda.is_available() and torch.distributed.is_nccl_available():
        nccl = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    return out


def driver_version() -> str | None:
    """The NVIDIA driver NVML reports; None where there is no driver (a CPU node)."""
    try:
        pynvml = nvml()
        pynvml.nvmlInit()
    except Exception:  # ImportError, NVMLError_LibraryNotFound: no driver here
        return None
    try:
        value = pynvml.nvmlSystemGetDriverVersion()
        return value.decode() if isinstance(value, bytes) else str(value)
    finally:
        pynvml.nvmlShutdown()


def stack_tags() -> dict[str, str]:
    """Every `sq.stack.*` tag this rank can read (absent: not computable here)."""
    facts: dict[str, str] = {"python": platform.python_version(), **distribution_versions(), **torch_build()}
    driver = driver_version()
    if driver:
        facts["driver"] = driver
    return {K.stack_tag(name): value for name, value in facts.items()}


def namespaces() -> dict[str, Any]:
    """This process's mount and pid namespaces, its pid and host: one rank's entry."""

    def ns(kind: str) -> str:
        try:
            return os.readlink(f"/proc/self/ns/{kind}")
        except OSError:
            return ""

    return {"host": socket.gethostname(), "mnt": ns("mnt"), "pid": ns("pid"), "pid_no": os.getpid()}


def container_tags(
    label: str, ranks: list[dict[str, Any]], env: dict[str, str] | None = None
) -> dict[str, str]:
    """The container tags from the point's label (`<kind>:<image>` or `none`), every rank's
    `namespaces()` (rank order) and the environment the batch script exported."""
    env = dict(os.environ) if env is None else env
    tags = {K.TAG_CONTAINER: label}
    if env.get(DIGEST_ENV):
        tags[K.TAG_CONTAINER_DIGEST] = env[DIGEST_ENV]
    if env.get(HOST_MNTNS_ENV):
        tags[K.TAG_CONTAINER_HOST_MNTNS] = env[HOST_MNTNS_ENV]
    tags[K.TAG_CONTAINER_MNTNS] = " ".join(
        f"{i}:{r['host']}:{r['mnt']}:{r['pid']}:pid{r['pid_no']}" for i, r in enumerate(ranks)
    )
    inside = inside_image(ranks, env.get(HOST_MNTNS_ENV, ""))
    if inside is not None:
        tags[K.TAG_CONTAINER_INSIDE] = "yes" if inside else "no"
    return tags


def inside_image(ranks: list[dict[str, Any]], host_mntns: str) -> bool | None:
    """Every rank ran in a mount namespace other than the host's; None when the host's is not
    known (no batch script said it: the local launcher)."""
    if not host_mntns or not ranks:
        return None
    return all(r["mnt"] and r["mnt"] != host_mntns for r in ranks)
