"""The software stack per partition (tags `sq.stack.*` and `sq.container*`, pipeline/job/stack.py)
and the differences between partitions that can explain a difference in their numbers.

A partition's cell holds every value its runs reported ("-": no run could read it, e.g. no
driver on a CPU node; never a guessed value). Two partitions are flagged when a component that
changes performance or behaviour differs at the level where it does (`SIGNIFICANT`): NCCL's
minor release (NCCL has been 2.x for years; its algorithms and protocol tuning change between
2.x releases), the CUDA, cuDNN and driver majors, torch's and DeepSpeed's minor releases, the
container image; a partition whose own runs disagree is flagged too.
"""

from __future__ import annotations

from collections.abc import Sequence

from analysis import plots
from analysis.runs import RunRecord
from pipeline.tracking import keys as K

COLUMNS = (  # (heading, tag)
    ("driver", K.stack_tag("driver")),
    ("CUDA", K.stack_tag("cuda")),
    ("cuDNN", K.stack_tag("cudnn")),
    ("NCCL", K.stack_tag("nccl")),
    ("torch", K.stack_tag("torch")),
    ("DeepSpeed", K.stack_tag("deepspeed")),
    ("transformers", K.stack_tag("transformers")),
    ("peft", K.stack_tag("peft")),
    ("bitsandbytes", K.stack_tag("bitsandbytes")),
    ("python", K.stack_tag("python")),
    ("container", K.TAG_CONTAINER),
    ("image digest", K.TAG_CONTAINER_DIGEST),
)
SIGNIFICANT = {  # tag -> (how many version parts matter, why it can explain a difference)
    K.stack_tag("nccl"): (2, "NCCL's collective algorithms and protocols change between 2.x releases"),
    K.stack_tag("cuda"): (1, "a CUDA major changes kernels and the libraries built for it"),
    K.stack_tag("cudnn"): (1, "a cuDNN major changes the kernels it picks"),
    K.stack_tag("driver"): (1, "a driver major changes what CUDA and NCCL can use"),
    K.stack_tag("torch"): (2, "a torch release changes kernels, SDPA and the distributed stack"),
    K.stack_tag("deepspeed"): (2, "a DeepSpeed release changes ZeRO's partitioning and overlap"),
    K.TAG_CONTAINER_DIGEST: (0, "a different image is a different user space"),
}


def level(value: str, parts: int) -> str:
    """The version cut to its first `parts` dot-separated parts (0: the whole value); a local
    suffix (2.13.0+cpu) counts as part of the last part it is attached to."""
    return value if parts == 0 else ".".join(value.split(".")[:parts])


def partition_stacks(runs: Sequence[RunRecord]) -> dict[str, dict[str, set[str]]]:
    """partition -> tag -> the values its runs recorded (absent tags: no entry)."""
    out: dict[str, dict[str, set[str]]] = {}
    for run in runs:
        stack = out.setdefault(run.partition, {})
        for _, tag in COLUMNS:
            if value := run.tag(tag):
                stack.setdefault(tag, set()).add(value)
    return out


def stack_table(runs: Sequence[RunRecord]) -> plots.Table:
    stacks = partition_stacks(runs)
    rows = [
        [partition, *(" / ".join(sorted(stack.get(tag, ()))) or "-" for _, tag in COLUMNS)]
        for partition, stack in sorted(stacks.items())
    ]
    return plots.Table(["partition", *(name for name, _ in COLUMNS)], rows)


def stack_differences(runs: Sequence[RunRecord]) -> list[str]:
    """One line per difference that can explain a difference in the numbers: between two
    partitions, or among one partition's own runs."""
    stacks = partition_stacks(runs)
    lines: list[str] = []
    names = dict((tag, name) for name, tag in COLUMNS)
    for tag, (parts, why) in SIGNIFICANT.items():
        cut = {p: {level(v, parts) for v in s.get(tag, ())} for p, s in stacks.items()}
        for partition, values in sorted(cut.items()):
            if len(values) > 1:
                lines.append(
                    f"{partition}: its runs ran on {names[tag]} {' and '.join(sorted(values))} ({why})"
                )
        seen = {p: next(iter(v)) for p, v in cut.items() if len(v) == 1}
        groups: dict[str, list[str]] = {}
        for partition, value in sorted(seen.items()):
            groups.setdefault(value, []).append(partition)
        if len(groups) > 1:
            sides = "; ".join(f"{value} on {', '.join(ps)}" for value, ps in sorted(groups.items()))
            lines.append(f"{names[tag]} differs between partitions: {sides} ({why})")
    return lines


def stack_blocks(runs: Sequence[RunRecord]) -> list[plots.Block]:
    """The report's section: the table, then the differences (or that there are none)."""
    diffs = stack_differences(runs)
    return [
        stack_table(runs),
        diffs
        or ["No difference between the partitions' stacks that could explain a difference in their numbers."],
    ]
