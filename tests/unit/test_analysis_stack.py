"""The report's software stack per partition: the values each partition's runs recorded, absent
as "-", and the differences that can explain a difference in the numbers (NCCL 2.18 vs 2.21,
a CUDA major, another image), not the ones that cannot (a patch release)."""

from __future__ import annotations

from analysis.runs import RunRecord
from analysis.stack import stack_blocks, stack_differences, stack_table
from pipeline.tracking import keys as K


def _run(partition: str, i: int = 0, **stack: str) -> RunRecord:
    tags = {K.TAG_PARTITION: partition, **{K.stack_tag(k): v for k, v in stack.items() if k != "image"}}
    if "image" in stack:
        tags[K.TAG_CONTAINER], tags[K.TAG_CONTAINER_DIGEST] = (
            f"pyxis:{stack['image']}",
            f"sha256:{stack['image']}",
        )
    return RunRecord(f"{partition}-{i}", "p", "FINISHED", 0, tags, {}, {})


def test_the_table_shows_each_partitions_values_and_dashes_for_absent_ones() -> None:
    runs = [_run("h100", nccl="2.21.5", cuda="12.4", torch="2.5.1"), _run("cpu", torch="2.5.1")]
    table = stack_table(runs)
    col = {name: i for i, name in enumerate(table.header)}
    cpu, h100 = table.rows  # sorted by partition
    assert cpu[0] == "cpu" and cpu[col["NCCL"]] == "-" and cpu[col["driver"]] == "-"  # absent, never 0
    assert h100[col["NCCL"]] == "2.21.5" and h100[col["torch"]] == "2.5.1"


def test_an_nccl_release_between_partitions_is_flagged_a_patch_is_not() -> None:
    same_minor = [_run("a", nccl="2.21.5"), _run("b", nccl="2.21.3")]
    assert stack_differences(same_minor) == []
    other_minor = [_run("a", nccl="2.18.1"), _run("b", nccl="2.21.5")]
    (line,) = stack_differences(other_minor)
    assert line.startswith("NCCL differs between partitions: 2.18 on a; 2.21 on b")


def test_cuda_major_image_and_a_partitions_own_runs_are_flagged() -> None:
    runs = [
        _run("a", 0, cuda="12.4", image="img1"),
        _run("a", 1, cuda="12.4", image="img2"),  # one partition, two images
        _run("b", 0, cuda="11.8", image="img1"),
    ]
    lines = stack_differences(runs)
    assert any(line.startswith("CUDA differs between partitions: 11 on b; 12 on a") for line in lines), lines
    assert any(
        line.startswith("a: its runs ran on image digest sha256:img1 and sha256:img2") for line in lines
    ), lines
    blocks = stack_blocks([_run("a", torch="2.5.1"), _run("b", torch="2.5.0")])
    assert blocks[1] == [
        "No difference between the partitions' stacks that could explain a difference in their numbers."
    ]
