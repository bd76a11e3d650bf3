"""The checks of a sweep against where it runs, before anything is submitted: on Slurm the
partitions, GPU types and counts, CPUs, memory, nodes and time limits, from one read of the
cluster (the Slurm scheduler's `read_cluster`), merged with the config's own rules in one message; on the
local launcher what this machine cannot run as configured (`local_launcher_problems`)."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.config.schema import Config, ConfigError
from pipeline.config.validate import MemoryFit, method_grid_problems, point_problems
from pipeline.drills.preempt import SLURM_TRIGGERS
from pipeline.sched import SLURM, ClusterInfo, NodeInfo, SubmitLimit
from pipeline.submit.launcher import ResourceShape


def _fmt_types(types: dict[str, int]) -> str:
    if not types:
        return "no GPUs"
    return ", ".join(f"{t or '(untyped)'} ({n} per node)" for t, n in sorted(types.items()))


def cluster_problems(cfg: Config, cluster: ClusterInfo) -> list[str]:
    """Why Slurm would refuse this point, or leave it pending forever (empty: fine). Each
    problem starts with the config key to change."""
    part = cfg.partition
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
    problems, nodes = _gpu_problems(cfg, cluster, name)
    problems += _node_problems(cfg, cluster, name, nodes, placed=not problems)
    return problems + _partition_problems(cfg, cluster, name)


def _gpu_problems(cfg: Config, cluster: ClusterInfo, name: str) -> tuple[list[str], list[NodeInfo]]:
    """The GPU type and count a point asks of partition `name`, and the nodes that have them."""
    part, par = cfg.partition, cfg.parallelism
    nodes = cluster.nodes_of(name)
    if not part.is_gpu:
        return [], nodes
    types = cluster.gpu_types(name)
    if part.gpu_type not in types:
        return [
            f"partition.gpu_type={part.gpu_type}: partition '{name}' has no GPU of type "
            f"'{part.gpu_type}'. Its nodes have: {_fmt_types(types)}"
        ], nodes
    if par.per_node > types[part.gpu_type]:
        return [
            f"parallelism.gpus_per_node={par.gpus_per_node} is more GPUs per node than partition "
            f"'{name}' has: its nodes have at most {types[part.gpu_type]} x {part.gpu_type}"
        ], nodes
    return [], [n for n in nodes if n.gpus.get(part.gpu_type, 0) >= par.per_node]


def _node_problems(
    cfg: Config, cluster: ClusterInfo, name: str, nodes: list[NodeInfo], placed: bool
) -> list[str]:
    """CPUs, node count and memory of the nodes that can hold the point (`placed`: its GPUs fit)."""
    part, par = cfg.partition, cfg.parallelism
    info = cluster.partitions[name]
    problems = []
    tasks_cpus = par.per_node * part.cpus_per_task
    if nodes and tasks_cpus > max(n.cpus for n in nodes):
        problems.append(
            f"partition.cpus_per_task={part.cpus_per_task} x {par.gpus_per_node} ranks per node = {tasks_cpus} "
            f"CPUs is more than a node of partition '{name}' has ({max(n.cpus for n in nodes)})"
        )
    limit = min(len(nodes), info.max_nodes) if info.max_nodes is not None else len(nodes)
    if par.nodes > limit and placed and not problems:
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
    return problems


def _partition_problems(cfg: Config, cluster: ClusterInfo, name: str) -> list[str]:
    """The partition's own limits: MaxTime and its state."""
    info = cluster.partitions[name]
    problems = []
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


def check_clusters_reachable(names: Sequence[str]) -> None:
    """Raise one ConfigError (nothing is submitted) naming each cluster a partition lives on
    (partition.slurm_cluster) that this login node cannot address with `-M`: one its slurmdbd
    does not know (`sacctmgr show cluster`), or whose controller does not answer `sinfo -M`."""
    if not names:
        return
    known = SLURM.known_clusters()
    problems = []
    for name in names:
        if known is None:
            problems.append(
                f"{name}: this login node's accounting database (sacctmgr show cluster) did not answer"
            )
        elif name not in known:
            problems.append(
                f"{name}: not a cluster of this login node's slurmdbd (sacctmgr show cluster lists "
                f"{', '.join(known) or 'none'}); run a sweep on that cluster's own login node instead"
            )
        elif not SLURM.on(name).answers():
            problems.append(f"{name}: its controller does not answer `sinfo -M {name}` from this login node")
    if problems:
        raise ConfigError(
            "partition.slurm_cluster names a cluster this login node cannot reach by multi-cluster "
            "operation (--clusters/-M); nothing was submitted: " + "; ".join(problems) + "."
        )


def check_against_cluster(
    labelled_cfgs: Sequence[tuple[str, Config]],
    cluster: ClusterInfo | None = None,
    fits: Sequence[MemoryFit] | None = None,
    on: str = "",
) -> None:
    """Raise one ConfigError listing every point the cluster cannot run (nothing is submitted).
    Also re-runs the config's own checks, so all problems of a sweep come in one message.
    `fits`: each point's memory fit, in the order of `labelled_cfgs` (the planner's). A cluster
    read here also has its MaxSubmitJobs limits read (sacctmgr) for the sweep's accounts and QOS.
    `on`: another cluster of this login node's slurmdbd (its reads go there with -M); "" for
    the login node's own."""
    sched = SLURM.on(on)
    if cluster is None:
        cluster = sched.read_cluster()
        where = {(cfg.partition.account, cfg.partition.qos) for _, cfg in labelled_cfgs}
        settings = sched.settings()  # one `scontrol show config` for every account and QOS
        cluster.submit_limits = {key: sched.submit_limit(*key, settings) for key in sorted(where, key=str)}
    lines = []
    carried = fits if fits is not None else [None] * len(labelled_cfgs)
    for (label, cfg), fit in zip(labelled_cfgs, carried, strict=True):
        known = cfg.partition.slurm_partition in cluster.partitions
        for problem in merge_problems(point_problems(cfg, fit), cluster_problems(cfg, cluster), known):
            lines.append(f"  {label}: {problem}")
    lines += method_grid_problems(labelled_cfgs)
    # a sweep of a thousand points or fewer is below any MaxJobCount a site sets (1000 is well
    # under Slurm's default of 10000): the scontrol call is spared for it
    limit = cluster.max_job_count or (sched.max_job_count() if len(labelled_cfgs) > 1000 else None)
    if limit is not None and len(labelled_cfgs) > limit:
        lines.append(
            f"  the sweep: {len(labelled_cfgs)} points are {len(labelled_cfgs)} Slurm jobs, and this "
            f"cluster's controller holds at most MaxJobCount={limit} (scontrol show "
            "config), queued jobs of every user included: split the sweep (a narrower grid or fewer "
            "values per axis) or ask the site to raise MaxJobCount"
        )
    lines += submit_limit_problems(labelled_cfgs, cluster.submit_limits or {})
    if lines:
        raise ConfigError(
            f"{len(lines)} problem(s) against {f'Slurm cluster {sched.cluster}' if sched.cluster else 'this Slurm cluster'}"
            "; nothing was submitted. "
            "Fix the config or the overrides:\n" + "\n".join(lines)
        )


def submit_limit_problems(
    labelled_cfgs: Sequence[tuple[str, Config]],
    limits: dict[tuple[str | None, str | None], SubmitLimit | None],
) -> list[str]:
    """A sweep whose jobs (one per point, every array task counts) would pass the MaxSubmitJobs
    limit of their account and QOS, counting what the user has queued there already: sbatch
    would refuse an array part way (`sbatch: error: AssocMaxSubmitJobLimit`), so it is refused
    whole before anything is submitted."""
    count: dict[tuple[str | None, str | None], int] = {}
    for _, cfg in labelled_cfgs:
        key = (cfg.partition.account, cfg.partition.qos)
        count[key] = count.get(key, 0) + 1
    out = []
    for key, n in count.items():
        lim = limits.get(key)
        if lim is not None and n > lim.room:
            where = (
                ", ".join(f"{k}={v}" for k, v in zip(("account", "qos"), key, strict=True) if v)
                or "the defaults"
            )
            out.append(
                f"  the sweep: {n} point(s) on {where} are {n} Slurm jobs; {lim.source} is {lim.limit} "
                f"and {lim.queued} of your jobs are queued there already (sacctmgr, squeue): room for "
                f"{lim.room}. Narrow the grid, wait for your queued jobs, or use another account or QOS"
            )
    return out


# --------------------------------------------------------------------------------------------
# the local launcher


def local_launcher_problems(labelled: Sequence[tuple[str, Config]]) -> list[str]:
    """What the local launcher cannot run as configured: more than one node, and a GPU partition
    on a machine without a GPU of its type (the run would train on the CPU and stand in the
    record as that GPU, at its price). NVML is asked once, only when a GPU partition is named."""
    problems = [  # the one check of "more than one node needs Slurm" (on Slurm, a partition without
        # slurm_partition is refused by cluster_problems whatever its nodes)
        f"  {label}: parallelism.nodes={cfg.parallelism.nodes} needs Slurm: the local launcher runs one "
        f"node (partition={cfg.partition.name}); allowed here: parallelism.nodes=1, or a Slurm partition "
        "with launcher.kind=slurm"
        for label, cfg in labelled
        if cfg.parallelism.nodes > 1
    ]
    problems += [
        f"  {label}: drill.preempt.trigger={cfg.drill.preempt.trigger} needs Slurm (scontrol requeue, or a job on "
        "the urgent partition); allowed on the local launcher: drill.preempt.trigger=local or signal (both a "
        "USR2 to the local tasks)"
        for label, cfg in labelled
        if cfg.drill.preempt.enabled and cfg.drill.preempt.trigger in SLURM_TRIGGERS
    ]
    problems += [
        f"  {label}: partition.container.kind={cfg.partition.container.kind} needs Slurm (srun starts the "
        "ranks in the image); the local launcher runs them on this machine's venv: use a Slurm partition, "
        "or partition.container.kind=none here"
        for label, cfg in labelled
        if cfg.partition.container.enabled
    ]
    gpu_points = [(label, cfg) for label, cfg in labelled if cfg.partition.is_gpu]
    if not gpu_points:
        return problems
    from pipeline.contract.gpu import inventory

    gpus, note = inventory()
    for label, cfg in gpu_points:
        part = cfg.partition
        if not any(g.matches(part.gpu_type) for g in gpus):
            here = ", ".join(sorted({g.name for g in gpus})) or f"no GPU ({note})"
            problems.append(
                f"  {label}: partition={part.name} (partition.gpu_type={part.gpu_type}) on the local launcher, "
                f"and this machine has {here}: the run would train on the CPU and be recorded as {part.gpu_type}. "
                "Use partition=local for a CPU run here, or launcher.kind=slurm to run on that partition"
            )
    return problems
