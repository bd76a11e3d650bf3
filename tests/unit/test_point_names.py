"""The summary table's point names tell every point apart: repeats (same candidate, next seed)
and long model names that differ only at their end."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.config.compose import compose_sweep
from pipeline.config.resolved import candidate_name, drill_label
from pipeline.contract.sweepdir import PointEntry
from pipeline.submit.names import WIDTH, point_names
from pipeline.submit.status import PointState, PointStatus, summary_table


def entry(point_id: str, overrides: Sequence[str], index: int = 0) -> PointEntry:
    return PointEntry(point_id, index, list(overrides), "c", "local", "none", f"/tmp/{point_id}", "fits")


def entries_of(points) -> list[PointEntry]:  # type: ignore[no-untyped-def]
    return [entry(p.point_id, p.overrides, p.index) for p in points]


def without_index(name: str) -> str:
    return name.split("-", 1)[1]


def rows(names: list[str]) -> list[str]:
    states = [PointState(entry(n, []), PointStatus.PENDING, None) for n in names]
    return summary_table(states).splitlines()[2:-1]


def test_repeats_of_a_sweep_are_told_apart_by_their_seed() -> None:
    points = compose_sweep("default", ["precision=fp32", "parallelism=zero1", "sweep.repeats=3"])
    assert len({candidate_name(p.cfg) + drill_label(p.cfg) for p in points}) == 1  # ids differ by index only
    names = point_names(entries_of(points))
    assert len({without_index(n) for n in names}) == 3
    assert [n.rsplit(" ", 1)[-1] for n in names] == ["seed=1234", "seed=1235", "seed=1236"]
    assert all(len(n) <= WIDTH for n in names)
    assert all(n.startswith(f"p{i:04d}-") for i, n in enumerate(names))


def test_a_seed_list_is_shown_as_given() -> None:
    points = compose_sweep("default", ["precision=fp32", "parallelism=zero1", "train.seed=1,2,3"])
    names = point_names(entries_of(points))
    assert [n.rsplit(" ", 1)[-1] for n in names] == ["seed=1", "seed=2", "seed=3"]


def test_long_model_names_that_differ_at_their_end_keep_the_difference() -> None:
    model = "acme-research/an-extremely-long-instruction-tuned-model-name"
    ids = [
        f"p{i:04d}-local/{model}-{size}/lora-r8/bf16/zero2-1x2-mb1-ga1-none"
        for i, size in enumerate(["7b", "13b", "70b"])
    ]
    names = point_names([entry(i, [f"model={i[-40:]}"]) for i in ids])
    assert all(len(n) > 0 for n in names)
    assert len({without_index(n) for n in names}) == 3
    for n, size in zip(names, ["7b", "13b", "70b"], strict=True):
        assert f"-{size}/" in n, n
    # and in the printed table: the whole name, the columns aligned after it
    table = rows(ids)
    assert all(f"-{s}/" in line for line, s in zip(table, ["7b", "13b", "70b"], strict=True))
    assert len({line.index(" pending") for line in table}) == 1


def test_repeats_of_long_names_keep_index_and_seed() -> None:
    long_id = "local/acme-research/an-extremely-long-model-name-7b/lora-r8/bf16/zero2-1x2-mb1-ga1-none"
    es = [entry(f"p{i:04d}-{long_id}", ["model=x", f"train.seed={i + 1}"], i) for i in range(12)]
    names = point_names(es)
    assert len({without_index(n) for n in names}) == 12
    assert all(n.endswith(f"seed={i + 1}") and n.startswith(f"p{i:04d}-") for i, n in enumerate(names))


def test_short_names_are_left_whole() -> None:
    es = [entry("p0000-local/tiny/full/fp32/zero1-1x2-none", []), entry("p0001-x-none", [])]
    assert point_names(es) == [e.point_id for e in es]


def test_names_that_only_fit_cut_fall_back_to_the_whole_name() -> None:
    # two differences far apart: eliding the common start and cutting the end would lose one
    base = "local/" + "m" * 30
    ids = [f"p0000-{base}a/{'x' * 40}-one", f"p0001-{base}a/{'x' * 40}-two", f"p0002-{base}b/{'x' * 40}-one"]
    names = point_names([entry(i, []) for i in ids])
    assert len({without_index(n) for n in names}) == 3
