"""The distributed environment of one rank, the way srun (or submitit's local executor) starts it.

DeepSpeed needs RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT all set, else it
reaches for mpi4py; we set them from submitit's JobEnvironment (which reads SLURM_* or
SUBMITIT_LOCAL_*). The `deepspeed` launcher is not used: on one node it does not forward
SIGTERM and its workers live on as orphans.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import zlib
from dataclasses import dataclass
from datetime import timedelta

rank_log = logging.getLogger("pipeline.rank")  # the job log's `[rank] ...` line


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    job_id: str
    hostname: str
    nodes: list[str]

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def process_start_time(pid: int | None = None) -> float:
    """Wall-clock start of a process, to 10 ms. psutil's create_time adds /proc/stat's btime,
    whole seconds, and can be off by up to 1 s: too coarse for restart-time parts."""
    pid = pid or os.getpid()
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    start_ticks = int(fields[19])  # field 22 of proc(5), counted after the command name
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.time() - (since_boot - start_ticks / os.sysconf("SC_CLK_TCK"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PORT_BASE, PORT_SPAN = 20000, 12000
"""Master ports are 20000-31999: below Linux's ephemeral range (32768-60999 by default), the
ports the kernel hands to outgoing connections (gloo's between ranks among them), where a
master port could be taken already."""


def port_for_job(allocation_id: str, cluster: str = "") -> int:
    """A port every rank of a job derives alike (no communication needed), distinct for jobs
    that run at the same time on one host. `allocation_id` is one number per allocation:
    Slurm's SLURM_JOB_ID (an array task's own id, not "55_2", whose digits "552" are job 552's
    too), the local executor's process id; jobs on one node at once are fewer than PORT_SPAN
    ids apart. Another id (a label) is reduced to its digits.

    `cluster`: the job's SLURM_CLUSTER_NAME. Job ids are each cluster's own, so two clusters
    whose jobs share a node (the local test clusters do; so may clusters of one site) both have
    a job 1: each cluster's ids are shifted by an offset of its name (CRC-32), and the two jobs'
    ranks do not meet at one master port. Seen without it: one sweep over two clusters, each
    cluster's task 1 bound 20001, one failed EADDRINUSE and its peer joined the other job."""
    digits = "".join(c for c in allocation_id if c.isdigit()) or "0"
    offset = zlib.crc32(cluster.encode()) % PORT_SPAN if cluster else 0
    return PORT_BASE + (int(digits[-9:]) + offset) % PORT_SPAN


def rank_env_from_submitit(master_port: int | None = None) -> RankEnv:
    """Read this rank's place from submitit (Slurm or local executor) and export it."""
    import submitit

    env = submitit.JobEnvironment()
    nodes = list(env.hostnames) if env.num_nodes > 1 else [socket.gethostname()]
    master_addr = node_address(nodes[0]) if env.num_nodes > 1 else "127.0.0.1"
    port = (
        master_port
        or int(os.environ.get("SQ_MASTER_PORT", 0))
        or port_for_job(str(env.raw_job_id), os.environ.get("SLURM_CLUSTER_NAME", ""))
    )
    renv = export(
        RankEnv(
            rank=env.global_rank,
            world_size=env.num_tasks,
            local_rank=env.local_rank,
            master_addr=master_addr,
            master_port=port,
            job_id=str(env.job_id),
            hostname=socket.gethostname(),
            nodes=nodes,
        )
    )
    log_placement(renv)
    return renv


def log_placement(renv: RankEnv) -> None:
    """One line per rank in its job log: where it runs (the Slurm node, which on a cluster of
    fake nodes is not the host name) and whom it rendezvous with."""
    node = os.environ.get("SLURMD_NODENAME", renv.hostname)
    rank_log.info(
        "rank=%d/%d local_rank=%d node=%s host=%s master=%s:%s job=%s",
        renv.rank,
        renv.world_size,
        renv.local_rank,
        node,
        renv.hostname,
        renv.master_addr,
        renv.master_port,
        renv.job_id,
    )


def node_address(node: str, timeout_s: float = 10) -> str:
    """An address other nodes can reach `node` at: its name when that resolves, else the
    NodeAddr Slurm knows it by (node names need not be host names: NodeName=h100-1
    NodeAddr=10.0.0.7, or fake nodes sharing one host)."""
    try:
        socket.gethostbyname(node)
        return node
    except OSError:
        pass
    from pipeline.sched import SLURM

    for field in (SLURM.node_line(node, timeout_s) or "").split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1] or node
    return node


def rank_vars(
    rank: int, world_size: int, local_rank: int, master_addr: str, master_port: int
) -> dict[str, str]:
    """The environment torch.distributed and DeepSpeed read to join a process group."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def export(renv: RankEnv) -> RankEnv:
    os.environ.update(
        rank_vars(renv.rank, renv.world_size, renv.local_rank, renv.master_addr, renv.master_port)
    )
    return renv


def rank_env_from_environ() -> RankEnv:
    """For ranks started by hand, by torchrun or by a bare `srun python -m pipeline.job.entry`:
    RANK/WORLD_SIZE/LOCAL_RANK, else SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID."""
    env = os.environ
    job_id = env.get("SLURM_JOB_ID", "manual")
    first_node = (
        first_slurm_node() if "SLURM_JOB_NODELIST" in env and "MASTER_ADDR" not in env else "127.0.0.1"
    )
    renv = export(
        RankEnv(
            rank=int(env.get("RANK", env.get("SLURM_PROCID", 0))),
            world_size=int(env.get("WORLD_SIZE", env.get("SLURM_NTASKS", 1))),
            local_rank=int(env.get("LOCAL_RANK", env.get("SLURM_LOCALID", 0))),
            master_addr=env.get("MASTER_ADDR", first_node),
            master_port=int(env.get("MASTER_PORT", 0)) or port_for_job(job_id),
            job_id=job_id,
            hostname=socket.gethostname(),
            nodes=[socket.gethostname()],
        )
    )
    log_placement(renv)
    return renv


def first_slurm_node() -> str:
    """The first host of SLURM_JOB_NODELIST ("a100-[1-2]" -> "a100-1"), expanded by scontrol."""
    from pipeline.sched import SLURM

    hosts = SLURM.hostnames(os.environ["SLURM_JOB_NODELIST"])
    return node_address(hosts[0]) if hosts else "127.0.0.1"


def init_process_group(device_type: str, timeout_s: int) -> None:
    """Initialise torch.distributed through DeepSpeed, with a bounded timeout everywhere.

    ZeRO creates new process groups with torch's *default* timeout, ignoring the one given to
    init_distributed, so a hung peer would block the others for 30 minutes: set the default
    before anything creates a group.
    """
    import deepspeed
    import torch.distributed.distributed_c10d as c10d

    timeout = timedelta(seconds=timeout_s)
    c10d.default_pg_timeout = timeout
    try:  # torch keeps a second copy of the default in some versions
        import torch.distributed.constants as constants

        constants.default_pg_timeout = timeout
    except (ImportError, AttributeError):
        pass
    backend = "nccl" if device_type == "cuda" else "gloo"
    deepspeed.init_distributed(dist_backend=backend, timeout=timeout, verbose=False)


def device_for(local_rank: int) -> str:
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return "cuda"
    return "cpu"
