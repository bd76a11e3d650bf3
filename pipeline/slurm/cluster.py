"""What the Slurm cluster has, read from `scontrol show partition|node -o`; job states from
`squeue` and `sacct`. Parsing only: the commands themselves are in `pipeline.slurm.commands`.

Every client call is bounded (`sinfo` against a dead controller takes 9 s a call) and the
whole cluster is read with two calls, however many points the sweep has.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from pipeline.config.schema import ConfigError
from pipeline.slurm import commands
from pipeline.slurm.commands import CLIENT_TIMEOUT_S

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
    max_job_count: int | None = None  # MaxJobCount, when it was read (max_job_count())
    submit_limits: dict[tuple[str | None, str | None], SubmitLimit | None] | None = None
    """(account, qos) -> the MaxSubmitJobs limit there (submit_limit()), when they were read."""

    def nodes_of(self, partition: str) -> list[NodeInfo]:
        return [n for n in self.nodes.values() if partition in n.partitions]

    def gpu_types(self, partition: str) -> dict[str, int]:
        """GPU type -> the most GPUs of that type on one node of the partition."""
        out: dict[str, int] = {}
        for node in self.nodes_of(partition):
            for gpu_type, count in node.gpus.items():
                out[gpu_type] = max(out.get(gpu_type, 0), count)
        return out


def _scontrol(what: str, timeout_s: float, at: commands.Address | None = None) -> list[dict[str, str]]:
    try:
        return [parse_record(line) for line in commands.show(what, timeout_s, at)]
    except commands.SlurmCommandError as e:
        raise ConfigError(
            f"{e}; nothing was submitted. Is the controller up (sinfo)? Or run with launcher.kind=local."
        ) from e


def _int(text: str | None, default: int = 0) -> int:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return default


def read_cluster(timeout_s: float = CLIENT_TIMEOUT_S, at: commands.Address | None = None) -> ClusterInfo:
    """The partitions and nodes of this cluster: one `scontrol show partition -o` and one
    `scontrol show node -o` call."""
    cluster = ClusterInfo()
    for rec in _scontrol("node", timeout_s, at):
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
    for rec in _scontrol("partition", timeout_s, at):
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


SLURM_DEFAULT_MAX_ARRAY_SIZE = 1001  # slurm.conf's default MaxArraySize


SLURM_DEFAULT_MAX_JOB_COUNT = 10000  # slurm.conf's default MaxJobCount


def config_settings(lines: Iterable[str]) -> dict[str, str]:
    """`scontrol show config` lines ("Name = value") as name -> value (the first of a name wins)."""
    settings: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep:
            settings.setdefault(key.strip(), value.strip())
    return settings


def show_config(
    timeout_s: float = CLIENT_TIMEOUT_S, at: commands.Address | None = None
) -> dict[str, str] | None:
    """`scontrol show config` as name -> value; None when the controller does not answer."""
    try:
        return config_settings(commands.show_config(timeout_s, at))
    except commands.SlurmCommandError:
        return None


def _config_str(name: str, timeout_s: float, at: commands.Address | None = None) -> str | None:
    """A setting of `scontrol show config` as it is written; None when the controller does not say."""
    return (show_config(timeout_s, at) or {}).get(name)


def _config_int(name: str, default: int, timeout_s: float, at: commands.Address | None = None) -> int:
    """An integer setting of `scontrol show config`; `default` when the controller does not say."""
    value = _config_str(name, timeout_s, at)
    return max(1, int(value)) if value is not None and value.isdigit() else default


@dataclass(frozen=True)
class SubmitLimit:
    """The most jobs this user may have queued at once where a sweep's jobs go (every array
    task counts), and how many are queued there already."""

    limit: int
    source: str  # "QOS normal's MaxSubmitJobsPerUser", "association qualify/alice's MaxSubmitJobs"
    queued: int

    @property
    def room(self) -> int:
        return max(0, self.limit - self.queued)


def _limit(value: str) -> int | None:
    value = value.strip()
    return int(value) if value.isdigit() else None


def submit_limit(
    user: str,
    account: str | None,
    qos: str | None,
    settings: dict[str, str] | None = None,
    timeout_s: float = CLIENT_TIMEOUT_S,
    at: commands.Address | None = None,
) -> SubmitLimit | None:
    """The tightest MaxSubmitJobs limit Slurm applies to `user`'s jobs on `account` (default: the
    user's DefaultAccount) and `qos` (default: the association's DefaultQOS, else "normal"):
    the association's own MaxSubmitJobs or its account's, and the QOS's MaxSubmitJobsPerUser,
    read with sacctmgr; with the user's jobs already queued there (squeue). None where Slurm
    does not enforce limits (AccountingStorageEnforce without limits/safe/qos), sacctmgr does not
    answer, or no limit is set. `settings`: `scontrol show config` as read already (show_config)."""
    config = (settings if settings is not None else show_config(timeout_s, at)) or {}
    enforce = config.get("AccountingStorageEnforce", "").lower()
    if not any(word in enforce for word in ("limits", "safe", "qos")):
        return None
    on = [f"cluster={config['ClusterName']}"] if config.get("ClusterName") else []  # one accounting
    # database may serve several clusters: this one's associations
    if account is None:
        rows = commands.sacctmgr_show("user", [f"name={user}"], "DefaultAccount", timeout_s) or []
        account = next((r.strip() for r in rows if r.strip()), None)
    found: list[tuple[int, str]] = []
    default_qos = ""
    if account:
        rows = (
            commands.sacctmgr_show(
                "assoc", [*on, f"account={account}"], "User,MaxSubmit,DefaultQOS", timeout_s
            )
            or []
        )
        for row in rows:
            who, most, dqos = (row.split("|") + ["", "", ""])[:3]
            if who not in (user, ""):
                continue
            if (n := _limit(most)) is not None:
                found.append((n, f"association {account}/{who or '(account)'}'s MaxSubmitJobs"))
            if who == user and dqos.strip():
                default_qos = dqos.strip()
    qos_name = qos or default_qos or "normal"
    for row in commands.sacctmgr_show("qos", [f"name={qos_name}"], "MaxSubmitPU", timeout_s) or []:
        if (n := _limit(row)) is not None:
            found.append((n, f"QOS {qos_name}'s MaxSubmitJobsPerUser"))
    if not found:
        return None
    limit, source = min(found)
    queue = commands.queue_of_user(user, "%a|%q", timeout_s, at) or []
    col, want = (1, qos_name) if source.startswith("QOS") else (0, account or "")
    queued = sum(1 for line in queue if (line.split("|") + [""])[col].strip() == want)
    return SubmitLimit(limit, source, queued)


def max_array_size(timeout_s: float = CLIENT_TIMEOUT_S, at: commands.Address | None = None) -> int:
    """The most tasks one job array may have (MaxArraySize: task ids 0..MaxArraySize-1), read
    from `scontrol show config`; Slurm's default when the controller does not say."""
    return _config_int("MaxArraySize", SLURM_DEFAULT_MAX_ARRAY_SIZE, timeout_s, at)


def max_job_count(timeout_s: float = CLIENT_TIMEOUT_S, at: commands.Address | None = None) -> int:
    """The most jobs the controller keeps at once (MaxJobCount; every task of a held or
    pending array counts): past it sbatch sleeps and retries, then fails."""
    return _config_int("MaxJobCount", SLURM_DEFAULT_MAX_JOB_COUNT, timeout_s, at)


@dataclass(frozen=True)
class ClusterIdentity:
    """Which cluster ran a sweep: what its runs are tagged with (sq.cluster*), so that sweeps of
    several clusters can share one store and one report and each row names its cluster."""

    name: str
    """Slurm's ClusterName; for the local launcher "local-<hostname>"."""
    controller: str
    """The primary controller's host (SlurmctldHost[0], without its address); the local host."""
    slurm_version: str
    """SLURM_VERSION of the controller's configuration; "none" for the local launcher."""


def parse_identity(lines: Iterable[str]) -> ClusterIdentity:
    """`scontrol show config` lines ("Name = value") as the cluster's identity. Slurm before
    17.11 names the controller ControlMachine; SlurmctldHost[0] is "host(addr)" or "host".
    Raises ConfigError when the answer has no ClusterName (no controller configuration)."""
    conf = config_settings(lines)
    name = conf.get("ClusterName", "")
    if not name or name == "(null)":
        raise ConfigError(
            "`scontrol show config` names no ClusterName: the cluster cannot be recorded; nothing was submitted"
        )
    host = conf.get("SlurmctldHost[0]") or conf.get("ControlMachine") or "unknown"
    return ClusterIdentity(name, host.split("(", 1)[0].strip(), conf.get("SLURM_VERSION") or "unknown")


def read_identity(timeout_s: float = CLIENT_TIMEOUT_S, at: commands.Address | None = None) -> ClusterIdentity:
    """This cluster's identity from one `scontrol show config` call; raises ConfigError."""
    try:
        lines = commands.show_config(timeout_s, at)
    except commands.SlurmCommandError as e:
        raise ConfigError(
            f"{e}; the cluster's name cannot be recorded, nothing was submitted. Is the controller up (sinfo)?"
        ) from e
    return parse_identity(lines)


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


RUNNING_STATES = ("RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT", "SUSPENDED", "STOPPED")
"""Slurm states of a job that holds (or is getting) its allocation."""
REQUEUE_STATES = ("REQUEUED", "PENDING", "RESIZING", "REQUEUE_HOLD", "REQUEUE_FED", "REQUEUED_HOLD")
"""The latest record of a job that will run (again)."""


@dataclass(frozen=True)
class JobState:
    state: str  # RUNNING, PENDING, COMPLETED, CANCELLED, ... (the first word of Slurm's)
    ended_s_ago: float | None = None  # seconds since the job ended (sacct End), None if not ended
    live: bool = False  # squeue still lists it
    queue_wait_s: float | None = None
    """Eligible -> Start of its latest allocation (sacct); None while it waits, or unread."""
    held: bool = False
    """squeue's reason says the job is held (JobHeldUser, JobHeldAdmin): it waits for a release."""

    @property
    def in_slurm(self) -> bool:
        """The job has not left Slurm for good: squeue lists it, or its latest accounting
        record is running or waiting to run (again)."""
        return self.live or self.state in RUNNING_STATES or self.state in REQUEUE_STATES


def _ended_s_ago(end: str) -> float | None:
    try:
        return max(0.0, time.time() - datetime.fromisoformat(end.strip()).timestamp())
    except ValueError:  # "Unknown", "None": not ended
        return None


def job_states(
    job_ids: Iterable[str],
    job_name: str | None = None,
    timeout_s: float = CLIENT_TIMEOUT_S,
    at: commands.Address | None = None,
) -> dict[str, JobState]:
    """The Slurm state of each job id ("12", or an array task "12_3"): squeue is the live
    truth, sacct covers the jobs squeue has forgotten (MinJobAge). Ids Slurm does not know
    (yet) are absent; so is everything when Slurm does not answer. With `job_name`, rows of
    other jobs are ignored: job ids restart at 1 when a cluster starts from fresh state."""
    return read_job_states(job_ids, job_name, timeout_s, at) or {}


def read_job_states(
    job_ids: Iterable[str],
    job_name: str | None = None,
    timeout_s: float = CLIENT_TIMEOUT_S,
    at: commands.Address | None = None,
) -> dict[str, JobState] | None:
    """`job_states`, or None when neither sacct nor squeue answered."""
    wanted = {j for j in job_ids if j}
    if not wanted:
        return {}
    bases = ",".join(sorted({j.split("_", 1)[0] for j in wanted}))
    states: dict[str, JobState] = {}
    sacct = commands.accounting(bases, "JobID,JobName%200,State,End,Eligible,Start", timeout_s, at)
    for line in sacct or []:
        fields = line.split("|")
        if len(fields) not in (4, 6) or (job_name and fields[1] != job_name):
            continue
        state = (fields[2].split() or [""])[0]
        wait = _wait_s(fields[4], fields[5]) if len(fields) == 6 else None
        for j in _expand_array(fields[0].strip()):
            states[j] = JobState(state, _ended_s_ago(fields[3]), queue_wait_s=wait)
    squeue = commands.queue(bases, "%i|%j|%T", timeout_s, at)
    if sacct is None and squeue is None:
        return None
    for line in squeue or []:
        fields = line.split("|")
        if len(fields) != 3 or (job_name and fields[1] != job_name):
            continue
        for j in _expand_array(fields[0].strip()):
            old = states.get(j)
            states[j] = JobState(
                fields[2].strip(), old.ended_s_ago if old else None, True, old.queue_wait_s if old else None
            )
    return {j: s for j, s in states.items() if j in wanted}


def jobs_named(
    name: str, timeout_s: float = CLIENT_TIMEOUT_S, at: commands.Address | None = None
) -> dict[str, JobState] | None:
    """Every job squeue lists with this name (array tasks one by one, a pending array's tasks
    expanded), with its state; None when squeue does not answer."""
    lines = commands.queue_named(name, "%i|%j|%T|%r", timeout_s, at)
    if lines is None:
        return None
    out: dict[str, JobState] = {}
    for line in lines:
        fields = line.split("|")
        if len(fields) != 4 or fields[1] != name:
            continue
        for j in _expand_array(fields[0].strip()):
            out[j] = JobState(fields[2].strip(), live=True, held="held" in fields[3].lower())
    return out


@dataclass(frozen=True)
class Allocation:
    """One allocation of a job as Slurm's accounting bills it (a requeued job has several)."""

    elapsed_s: float
    """sacct ElapsedRaw: whole seconds from the allocation's start to its end (or to now)."""
    gpus: int | None
    """gres/gpu of AllocTRES; None when the allocation holds no GPU."""
    start: str
    state: str
    eligible: str = ""
    """sacct Eligible: when this allocation's job could first start (its dependencies met, its
    begin time reached; for a requeued job, when it became eligible again); "" when not read."""

    @property
    def queue_wait_s(self) -> float | None:
        """Eligible -> Start: how long the job waited in the queue for this allocation, None
        when either is unknown (a job still pending has no start; sacct says "Unknown")."""
        return _wait_s(self.eligible, self.start)


def _wait_s(eligible: str, start: str) -> float | None:
    """Eligible -> Start in seconds; None when either is not a time ("Unknown": still waiting)."""
    e, s = _when(eligible), _when(start)
    return None if e is None or s is None else max(0.0, (s - e).total_seconds())


def _when(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:  # "Unknown", "None", ""
        return None


def parse_allocations(lines: Iterable[str], job_name: str | None = None) -> list[Allocation]:
    """`commands.allocations` lines, oldest first; lines that are not allocations (or, with
    `job_name`, not of that job: ids restart at 1 on a fresh cluster) are skipped."""
    out = []
    for line in lines:
        fields = line.split("|")
        if len(fields) not in (5, 6, 7) or not fields[1].strip().isdigit():
            continue
        if job_name and len(fields) >= 6 and fields[-1] != job_name:
            continue
        tres = dict(kv.split("=", 1) for kv in fields[2].split(",") if "=" in kv)
        gpus = tres.get("gres/gpu")
        out.append(
            Allocation(
                float(fields[1]),
                int(gpus) if gpus and gpus.isdigit() else None,
                fields[3].strip(),
                (fields[4].split() or [""])[0],
                fields[5].strip() if len(fields) == 7 else "",
            )
        )
    return sorted(out, key=lambda a: a.start)


def read_allocations(
    job_id: str,
    job_name: str | None = None,
    timeout_s: float = CLIENT_TIMEOUT_S,
    at: commands.Address | None = None,
) -> list[Allocation] | None:
    """Every allocation of `job_id` (an array task "55_2" too); None when Slurm does not answer
    or has no record of it."""
    lines = commands.allocations(job_id, timeout_s, at)
    return parse_allocations(lines, job_name) or None if lines is not None else None


# `sbatch --test-only`: "sbatch: Job 1 to start at 2026-12-02T15:58:08 using 2 processors on
# nodes h100-[1-2] in partition h100" (the same words from Slurm 17.11 to 24.11; older releases
# leave out the partition, a federation names no nodes while it has not picked a cluster)
_WILL_START = re.compile(
    r"Job (?P<job>\d+) to start at (?P<start>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)"
    r"(?: using (?P<cpus>\d+) processors)?(?: on nodes (?P<nodes>\S+))?(?: in partition (?P<partition>\S+))?"
)
_REFUSED = re.compile(r"(?:sbatch: error: |allocation failure: |error: )(?P<why>.+)")


@dataclass(frozen=True)
class StartEstimate:
    """The backfill scheduler's answer to "when would a job of this shape start" (`sbatch
    --test-only`), as it stood when asked: a queue is a snapshot, so the answer keeps its date."""

    asked_at: datetime
    start: datetime | None = None
    """When the job would start; None when Slurm refused the shape or did not answer."""
    nodes: str = ""
    partition: str = ""
    refused: str = ""
    """Why Slurm would not take the job ("Requested node configuration is not available", an
    invalid partition, a time limit over MaxTime); "" when it answered with a start."""

    @property
    def wait_s(self) -> float | None:
        """Seconds from the question to the estimated start (0 when it would start at once)."""
        return None if self.start is None else max(0.0, (self.start - self.asked_at).total_seconds())


def parse_test_only(text: str | None, asked_at: datetime) -> StartEstimate:
    """`commands.test_only`'s answer: the start it names, or why the job would not be taken.
    Slurm prints its times in the cluster's local time without a zone: read as the asking
    machine's local time (a login node shares its cluster's zone), compared in `asked_at`'s."""
    if text is None:
        return StartEstimate(asked_at, refused="Slurm did not answer sbatch --test-only")
    if m := _WILL_START.search(text):
        start = (
            datetime.fromisoformat(m["start"]).astimezone(asked_at.tzinfo)
            if asked_at.tzinfo
            else datetime.fromisoformat(m["start"])
        )
        return StartEstimate(asked_at, start, m["nodes"] or "", m["partition"] or "")
    reasons = [r["why"].strip() for line in text.splitlines() if (r := _REFUSED.search(line))]
    return StartEstimate(
        asked_at, refused="; ".join(dict.fromkeys(reasons)) or text.strip()[:300] or "no answer"
    )
