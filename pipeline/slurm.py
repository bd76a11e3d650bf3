"""What the Slurm cluster has, read from `scontrol show partition|node -o`, and the checks of a
sweep against it before anything is submitted; job states from `squeue` and `sacct`.

Every client call is bounded (`sinfo` against a dead controller takes 9 s a call) and the
whole cluster is read with two calls, however many points the sweep has.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from pipeline.config import Config, ConfigError
from pipeline.launcher import CLIENT_TIMEOUT_S, ResourceShape

# "Key=value Key=value ..." where a value may hold spaces (OS=Linux 6.1 #1 SMP ...): a key
# starts at the beginning or after whitespace and is a word followed by "=".
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/.]*)=")


def parse_record(line: str) -> dict[str, str]:
    """One `scontrol show ... -o` line as a dict."""
    keys = list(_KEY.finditer(line))
    out: dict[str, str] = {}
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


def parse_gres(text: str) -> dict[str, int]:
    """GPU counts per type from a node's Gres ("gpu:a100:4(S:0),gpu:h100:2" -> {a100: 4,
    h100: 2}); an untyped "gpu:4" counts under the type ""."""
    counts: dict[str, int] = {}
    if not text or text == "(null)":
        return counts
    for item in re.split(r",(?![^()]*\))", text):
        item = re.sub(r"\(.*\)$", "", item.strip())
        parts = item.split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        gpu_type, count = ("", parts[1]) if len(parts) == 2 else (parts[1], parts[2])
        if count.isdigit():
            counts[gpu_type] = counts.get(gpu_type, 0) + int(count)
    return counts


def parse_minutes(text: str) -> int | None:
    """Slurm's time limits ([D-]HH:MM:SS, MM:SS, MM) as whole minutes; None for UNLIMITED."""
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A"):
        return None
    days, _, rest = text.rpartition("-")
    fields = [int(x) for x in rest.split(":")]
    if len(fields) == 3:
        h, m, s = fields
    elif len(fields) == 2:
        h, (m, s) = 0, fields
    else:
        h, m, s = 0, fields[0], 0
    return (int(days or 0) * 24 + h) * 60 + m + (1 if s else 0)


@dataclass(frozen=True)
class NodeInfo:
    name: str
    cpus: int
    memory_mb: int
    gpus: dict[str, int]  # GPU type -> count on this node
    partitions: tuple[str, ...]
    addr: str
    state: str
    features: tuple[str, ...] = ()


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    max_time_min: int | None  # None: unlimited
    max_nodes: int | None  # None: unlimited
    preempt_mode: str
    default: bool
    state: str
    nodes: tuple[str, ...] = ()


@dataclass
class ClusterInfo:
    partitions: dict[str, PartitionInfo] = field(default_factory=dict)
    nodes: dict[str, NodeInfo] = field(default_factory=dict)

    def nodes_of(self, partition: str) -> list[NodeInfo]:
        return [n for n in self.nodes.values() if partition in n.partitions]

    def gpu_types(self, partition: str) -> dict[str, int]:
        """GPU type -> the most GPUs of that type on one node of the partition."""
        out: dict[str, int] = {}
        for node in self.nodes_of(partition):
            for gpu_type, count in node.gpus.items():
                out[gpu_type] = max(out.get(gpu_type, 0), count)
        return out


def _scontrol(what: str, timeout_s: float) -> list[dict[str, str]]:
    cmd = ["scontrol", "show", what, "-o"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise ConfigError(
            f"Slurm did not answer `{' '.join(cmd)}` within {timeout_s:.0f} s; nothing was submitted. "
            "Is the controller up (sinfo)? Or run with launcher.kind=local."
        ) from e
    except OSError as e:
        raise ConfigError(f"cannot run `{' '.join(cmd)}` ({e}); nothing was submitted.") from e
    if out.returncode != 0:
        raise ConfigError(f"`{' '.join(cmd)}` failed: {out.stderr.strip()[:300]}; nothing was submitted.")
    return [parse_record(line) for line in out.stdout.splitlines() if line.strip()]


def _int(text: str | None, default: int = 0) -> int:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return default


def read_cluster(timeout_s: float = CLIENT_TIMEOUT_S) -> ClusterInfo:
    """The partitions and nodes of this cluster: one `scontrol show partition -o` and one
    `scontrol show node -o` call."""
    cluster = ClusterInfo()
    for rec in _scontrol("node", timeout_s):
        name = rec.get("NodeName", "")
        if not name:
            continue
        features = rec.get("AvailableFeatures", "")
        cluster.nodes[name] = NodeInfo(
            name=name,
            cpus=_int(rec.get("CPUTot")),
            memory_mb=_int(rec.get("RealMemory")),
            gpus=parse_gres(rec.get("Gres", "")),
            partitions=tuple(p for p in rec.get("Partitions", "").split(",") if p),
            addr=rec.get("NodeAddr", name),
            state=rec.get("State", ""),
            features=tuple(f for f in features.split(",") if f and f != "(null)"),
        )
    for rec in _scontrol("partition", timeout_s):
        name = rec.get("PartitionName", "")
        if not name:
            continue
        max_nodes = rec.get("MaxNodes", "UNLIMITED")
        cluster.partitions[name] = PartitionInfo(
            name=name,
            max_time_min=parse_minutes(rec.get("MaxTime", "UNLIMITED")),
            max_nodes=None if max_nodes.upper() == "UNLIMITED" else _int(max_nodes),
            preempt_mode=rec.get("PreemptMode", "OFF"),
            default=rec.get("Default", "NO") == "YES",
            state=rec.get("State", "UP"),
            nodes=tuple(n.name for n in cluster.nodes.values() if name in n.partitions),
        )
    return cluster


def _fmt_types(types: dict[str, int]) -> str:
    if not types:
        return "no GPUs"
    return ", ".join(f"{t or '(untyped)'} ({n} per node)" for t, n in sorted(types.items()))


def cluster_problems(cfg: Config, cluster: ClusterInfo) -> list[str]:
    """Why Slurm would refuse this point, or leave it pending forever (empty: fine). Each
    problem starts with the config key to change."""
    part, par = cfg.partition, cfg.parallelism
    name = part.slurm_partition
    have = ", ".join(sorted(cluster.partitions)) or "none"
    if not name:
        return [
            f"partition.slurm_partition is null (partition={part.name} runs locally), "
            f"but the launcher is Slurm: pick a partition of this cluster: {have}"
        ]
    if name not in cluster.partitions:
        return [
            f"partition.slurm_partition={name}: this cluster has no partition '{name}' "
            f"(partition={part.name}). Its partitions: {have} (`qualify discover` writes conf stubs for them)"
        ]
    info = cluster.partitions[name]
    problems: list[str] = []
    nodes = cluster.nodes_of(name)
    if part.is_gpu:
        types = cluster.gpu_types(name)
        if part.gpu_type not in types:
            problems.append(
                f"partition.gpu_type={part.gpu_type}: partition '{name}' has no GPU of type "
                f"'{part.gpu_type}'. Its nodes have: {_fmt_types(types)}"
            )
        elif par.gpus_per_node > types[part.gpu_type]:
            problems.append(
                f"parallelism.gpus_per_node={par.gpus_per_node} is more GPUs per node than partition "
                f"'{name}' has: its nodes have at most {types[part.gpu_type]} x {part.gpu_type}"
            )
        else:  # enough nodes with that many GPUs of that type?
            nodes = [n for n in nodes if n.gpus.get(part.gpu_type, 0) >= par.gpus_per_node]
    tasks_cpus = par.gpus_per_node * part.cpus_per_task
    if nodes and tasks_cpus > max(n.cpus for n in nodes):
        problems.append(
            f"partition.cpus_per_task={part.cpus_per_task} x {par.gpus_per_node} ranks per node = {tasks_cpus} "
            f"CPUs is more than a node of partition '{name}' has ({max(n.cpus for n in nodes)})"
        )
    limit = min(len(nodes), info.max_nodes) if info.max_nodes is not None else len(nodes)
    if par.nodes > limit and not problems:
        problems.append(
            f"parallelism.nodes={par.nodes} is more nodes than partition '{name}' can give this point: "
            f"{limit} node(s) ({', '.join(n.name for n in nodes) or 'none'})"
            + (f", MaxNodes={info.max_nodes}" if info.max_nodes is not None else "")
        )
    if part.mem_gb_per_node and nodes:
        biggest_mb = max(n.memory_mb for n in nodes)
        if int(part.mem_gb_per_node) * 1024 > biggest_mb:  # the launcher asks --mem=<int>G
            problems.append(
                f"partition.mem_gb_per_node={part.mem_gb_per_node:g} is more memory than a node of "
                f"partition '{name}' has (RealMemory={biggest_mb} MB, i.e. {biggest_mb // 1024} GB for --mem)"
            )
    time_min = ResourceShape.of(cfg).time_min
    if info.max_time_min is not None and time_min > info.max_time_min:
        key = "drill.timeout.time_limit_min" if cfg.drill.timeout.enabled else "partition.time_limit_min"
        problems.append(
            f"{key}={time_min} min is over partition '{name}' MaxTime of {info.max_time_min} min "
            "(scontrol show partition); Slurm would refuse it"
        )
    if info.state.upper() != "UP":
        problems.append(f"partition.slurm_partition={name}: the partition is {info.state}, not UP")
    return problems


def _key_of(problem: str) -> str:
    return problem.split("=", 1)[0].split(" ", 1)[0]


# keys whose config check compares with a copy of a cluster fact (partition.gpus_per_node,
# max_time_min in the YAML): where the cluster knows the partition, its own check decides
CLUSTER_FACT_KEYS = frozenset({"parallelism.gpus_per_node", "partition.time_limit_min"})


def merge_problems(
    config_problems: Sequence[str], slurm_problems: Sequence[str], partition_known: bool = True
) -> list[str]:
    """The cluster is the authority: drop a config problem about a key the cluster check also
    reports, and, for a partition the cluster has, the checks against the YAML's copies of
    its facts (a stale max_time_min neither hides nor invents a problem)."""
    drop = {_key_of(p) for p in slurm_problems} | (CLUSTER_FACT_KEYS if partition_known else set())
    return [p for p in config_problems if _key_of(p) not in drop] + list(slurm_problems)


def check_against_cluster(
    labelled_cfgs: Sequence[tuple[str, Config]], cluster: ClusterInfo | None = None
) -> None:
    """Raise one ConfigError listing every point the cluster cannot run (nothing is submitted).
    Also re-runs the config's own checks, so all problems of a sweep come in one message."""
    from pipeline.validate import point_problems

    cluster = cluster or read_cluster()
    lines = []
    for label, cfg in labelled_cfgs:
        known = cfg.partition.slurm_partition in cluster.partitions
        for problem in merge_problems(point_problems(cfg), cluster_problems(cfg, cluster), known):
            lines.append(f"  {label}: {problem}")
    if lines:
        raise ConfigError(
            f"{len(lines)} problem(s) against this Slurm cluster; nothing was submitted. "
            "Fix the config or the overrides:\n" + "\n".join(lines)
        )


# --------------------------------------------------------------------------------------------
# job states


def _expand_array(job_id: str) -> list[str]:
    """'12_[0-2,5%4]' -> ['12_0', '12_1', '12_2', '12_5']; other ids as they are."""
    m = re.fullmatch(r"(\d+)_\[([^\]]+)\]", job_id)
    if not m:
        return [job_id]
    base, spec = m.group(1), m.group(2).split("%", 1)[0]
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += [f"{base}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def _run_lines(cmd: list[str], timeout_s: float) -> list[str] | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (subprocess.TimeoutExpired, OSError):
        return None
    return out.stdout.splitlines() if out.returncode == 0 else None


@dataclass(frozen=True)
class JobState:
    state: str  # RUNNING, PENDING, COMPLETED, CANCELLED, ... (the first word of Slurm's)
    ended_s_ago: float | None = None  # seconds since the job ended (sacct End), None if not ended
    live: bool = False  # squeue still lists it


def _ended_s_ago(end: str) -> float | None:
    try:
        return max(0.0, time.time() - datetime.fromisoformat(end.strip()).timestamp())
    except ValueError:  # "Unknown", "None": not ended
        return None


def job_states(
    job_ids: Iterable[str], job_name: str | None = None, timeout_s: float = CLIENT_TIMEOUT_S
) -> dict[str, JobState]:
    """The Slurm state of each job id ("12", or an array task "12_3"): squeue is the live
    truth, sacct covers the jobs squeue has forgotten (MinJobAge). Ids Slurm does not know
    (yet) are absent; so is everything when Slurm does not answer. With `job_name`, rows of
    other jobs are ignored: job ids restart at 1 when a cluster starts from fresh state."""
    wanted = {j for j in job_ids if j}
    if not wanted:
        return {}
    bases = ",".join(sorted({j.split("_", 1)[0] for j in wanted}))
    states: dict[str, JobState] = {}
    sacct = _run_lines(
        ["sacct", "-X", "-n", "-P", "-o", "JobID,JobName%200,State,End", "-j", bases], timeout_s
    )
    for line in sacct or []:
        fields = line.split("|")
        if len(fields) != 4 or (job_name and fields[1] != job_name):
            continue
        state = (fields[2].split() or [""])[0]
        for j in _expand_array(fields[0].strip()):
            states[j] = JobState(state, _ended_s_ago(fields[3]))
    squeue = _run_lines(["squeue", "-h", "-r", "-o", "%i|%j|%T", "-j", bases], timeout_s)
    for line in squeue or []:
        fields = line.split("|")
        if len(fields) != 3 or (job_name and fields[1] != job_name):
            continue
        for j in _expand_array(fields[0].strip()):
            old = states.get(j)
            states[j] = JobState(fields[2].strip(), old.ended_s_ago if old else None, live=True)
    return {j: s for j, s in states.items() if j in wanted}


def cancel(job_ids: Iterable[str], timeout_s: float = CLIENT_TIMEOUT_S) -> None:
    """scancel these jobs (array tasks or whole arrays); bounded, errors ignored."""
    ids = sorted({j for j in job_ids if j})
    if ids:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            subprocess.run(["scancel", *ids], capture_output=True, timeout=timeout_s)
