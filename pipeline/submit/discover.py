"""`qualify discover`: write conf/partition/<name>.yaml stubs from what this Slurm cluster says
about itself (`scontrol show partition|node -o`): partition names, GPU types and counts,
CPUs and memory per node, MaxTime, PreemptMode. Prices are left null for the user to fill
in; peaks are left empty (an unknown device gets no MFU, never a guessed one).

A partition whose nodes carry several GPU types gets one stub per type
(`<partition>-<type>`), since a point asks for one type. Existing files are kept unless
`--force`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pipeline.config.schema import ConfigError
from pipeline.home import conf_dir
from pipeline.sched import SLURM, ClusterInfo, NodeInfo, PartitionInfo

# GPU memory is not something Slurm knows. Types whose memory is unambiguous by name; the
# rest get 0 and a request to fill it in (A100 exists with 40 and 80 GB: say so).
GPU_MEM_GIB = {"h100": 80.0, "h200": 141.0, "b200": 180.0, "l40s": 48.0, "l40": 48.0, "a100": 80.0}
GPU_MEM_AMBIGUOUS = {"a100": "A100 comes with 40 GB or 80 GB"}
DEFAULT_TIME_LIMIT_MIN = 20


@dataclass
class Stub:
    name: str
    slurm_partition: str
    gpu_type: str
    gpus_per_node: int
    nodes: list[NodeInfo]
    info: PartitionInfo

    @property
    def path_name(self) -> str:
        return f"{self.name}.yaml"


def stubs_for(cluster: ClusterInfo, only: list[str] | None = None) -> list[Stub]:
    stubs = []
    for part in sorted(cluster.partitions.values(), key=lambda p: p.name):
        if only and part.name not in only:
            continue
        nodes = cluster.nodes_of(part.name)
        if not nodes:
            continue
        types = sorted({t for n in nodes for t in n.gpus})
        if not types:
            stubs.append(Stub(part.name, part.name, "cpu", 0, nodes, part))
            continue
        for gpu_type in types:
            with_type = [n for n in nodes if n.gpus.get(gpu_type, 0) > 0]
            name = part.name if len(types) == 1 else f"{part.name}-{gpu_type or 'gpu'}"
            # the fewest a node has, so that any node of the partition can run a full-node point
            count = min(n.gpus[gpu_type] for n in with_type)
            stubs.append(Stub(name, part.name, gpu_type or "gpu", count, with_type, part))
    return stubs


def _q(value: object) -> str:
    """A YAML scalar (JSON is valid YAML for strings, numbers, null)."""
    return json.dumps(value)


def _line(key: str, value: object, comment: str) -> str:
    return f"{key}: {value}".ljust(34) + f"# {comment}"


def _gpu_memory(gpu_type: str) -> tuple[float, str]:
    """(GiB per GPU, the comment that says where it comes from or what to fill in)."""
    mem_gib = GPU_MEM_GIB.get(gpu_type.lower(), 0.0)
    if gpu_type == "cpu":
        return mem_gib, "CPU partition: the host's memory is used"
    if mem_gib and gpu_type.lower() in GPU_MEM_AMBIGUOUS:
        return mem_gib, f"CHECK: {GPU_MEM_AMBIGUOUS[gpu_type.lower()]}; Slurm does not know GPU memory"
    if mem_gib:
        return mem_gib, "from the GPU type's datasheet; Slurm does not know GPU memory"
    return mem_gib, "FILL IN: memory per GPU, GiB (Slurm does not know it; 0 = unknown)"


def _header(stub: Stub, source: str) -> list[str]:
    node_names = ", ".join(n.name for n in stub.nodes)
    return [
        f"# Partition '{stub.slurm_partition}'"
        + (f", {stub.gpu_type} GPUs" if stub.gpu_type != "cpu" else ", CPU only")
        + f": {len(stub.nodes)} node(s) ({node_names}).",
        f"# Written by `qualify discover` from {source}.",
        "# FILL IN the price fields (null = unknown: no cost figures) and the peak TFLOP/s from the",
        "# datasheet (empty = no MFU, never a guessed one); check the lines marked CHECK.",
    ]


def _hardware(stub: Stub) -> list[str]:
    """What the nodes are: the GPU type and count, GPU memory, CPUs and host memory."""
    nodes, gpu_type = stub.nodes, stub.gpu_type
    cpus, real_mb = min(n.cpus for n in nodes), min(n.memory_mb for n in nodes)
    ranks = max(1, stub.gpus_per_node)
    mem_gib, mem_note = _gpu_memory(gpu_type)
    return [
        _line("name", _q(stub.name), "option name: partition=<name>"),
        _line("slurm_partition", _q(stub.slurm_partition), "sbatch --partition"),
        _line("gpu_type", _q(gpu_type), f"GRES type (--gres=gpu:{gpu_type}:N); cpu: no GPUs"),
        _line("gpus_per_node", stub.gpus_per_node, "GPUs of this type per node (the fewest any node has)"),
        _line("gpu_mem_gib", f"{mem_gib:g}", mem_note),
        _line(
            "cpus_per_task",
            max(1, cpus // ranks),
            f"CPU cores per rank: {cpus} CPUs per node / {ranks} ranks",
        ),
        _line(
            "mem_gb_per_node",
            real_mb // 1024,  # sbatch --mem=<n>G means n x 1024 MB
            f"host memory per node, GB (of RealMemory={real_mb} MB); less or null shares nodes",
        ),
    ]


def _limits(stub: Stub) -> list[str]:
    """What the partition allows: time, account, QoS, features, setup, preemption."""
    info = stub.info
    time_limit = DEFAULT_TIME_LIMIT_MIN
    if info.max_time_min is not None:
        time_limit = min(time_limit, info.max_time_min)
    preempt = "cancel" if info.preempt_mode.upper().startswith("CANCEL") else "requeue"
    features = sorted({f for n in stub.nodes for f in n.features})
    return [
        _line("time_limit_min", time_limit, "wall-time limit per attempt, minutes (at most max_time_min)"),
        _line("max_time_min", _q(info.max_time_min), "the partition's MaxTime, minutes (null: unlimited)"),
        _line("account", "null", "sbatch --account (FILL IN if your site requires one)"),
        _line("qos", "null", "sbatch --qos"),
        _line(
            "constraint",
            "null",
            "sbatch --constraint" + (f"; node features: {', '.join(features)}" if features else ""),
        ),
        _line("setup", "[]", 'shell lines before the job, e.g. ["module load cuda/12.4"]'),
        _line("preempt_mode", preempt, f"requeue | cancel (Slurm: PreemptMode={info.preempt_mode})"),
    ]


# what Slurm cannot know: the datasheet peaks and the price, left for the user
TO_FILL_IN = [
    _line("peak_tflops", "{}", "FILL IN dense peak per GPU, TFLOP/s, by precision: {bf16: ..., fp32: ...}"),
    _line("peak_source", '""', "FILL IN the datasheet the peaks come from"),
    _line("price_usd_per_gpu_hour", "null", "FILL IN USD per GPU-hour (null: no cost figures)"),
    _line("price_date", '""', "FILL IN the date of the price, YYYY-MM-DD"),
    _line("price_source", '""', "FILL IN where the price comes from (contract, list price, internal rate)"),
]


def render(stub: Stub, source: str, cluster: str = "") -> str:
    """The stub's YAML: every key, with where its value comes from or what to fill in.
    `cluster`: the partition lives on this other cluster of the login node's slurmdbd."""
    where = (
        [_line("slurm_cluster", _q(cluster), "sbatch --clusters: another cluster of this slurmdbd")]
        if cluster
        else []
    )
    return "\n".join([*_header(stub, source), *_hardware(stub), *where, *_limits(stub), *TO_FILL_IN, ""])


def discover_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="qualify discover",
        description="Write conf/partition stubs from this cluster's scontrol show partition|node.",
    )
    parser.add_argument(
        "--out", default=str(conf_dir() / "partition"), help="folder (default conf/partition)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite existing files")
    parser.add_argument(
        "--cluster",
        default="",
        help="describe this other cluster of this login node's slurmdbd (read with -M; "
        "its stubs get slurm_cluster: <name>, docs/clusters.md section 10)",
    )
    parser.add_argument(
        "--partition", action="append", default=None, help="only this Slurm partition (repeat)"
    )
    args = parser.parse_args(argv[1:] if argv[:1] == ["--"] else argv)  # `qualify discover -- --force`
    try:
        if args.cluster:
            from pipeline.submit.checks import check_clusters_reachable

            check_clusters_reachable([args.cluster])
        cluster = SLURM.on(args.cluster).read_cluster()  # Slurm's partitions, by nature of the command
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stubs = stubs_for(cluster, args.partition)
    if not stubs:
        have = ", ".join(sorted(cluster.partitions)) or "none"
        print(f"error: no partition with nodes to describe (the cluster has: {have})", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    source = f"`scontrol{f' -M {args.cluster}' if args.cluster else ''} show partition|node -o` on {when}"
    written = kept = 0
    for stub in stubs:
        path = out / stub.path_name
        if path.exists() and not args.force:
            print(f"kept     {path} (exists; --force overwrites)")
            kept += 1
            continue
        path.write_text(render(stub, source, args.cluster))
        print(f"wrote    {path}: {stub.slurm_partition}, {stub.gpus_per_node} x {stub.gpu_type} per node")
        written += 1
    print(f"{written} written, {kept} kept. Fill in the price fields; then use partition=<name> in a sweep.")
    return 0


if __name__ == "__main__":
    sys.exit(discover_main(sys.argv[1:]))
