"""sweep.repeats=N: every point N times with consecutive seeds; a seed list is its own axis."""

from __future__ import annotations

import pytest

from pipeline.config.compose import compose_sweep
from pipeline.config.schema import ConfigError


def seeds(points) -> list[int]:  # type: ignore[no-untyped-def]
    return [p.cfg.train.seed for p in points]


def test_repeats_run_every_point_with_consecutive_seeds() -> None:
    one = compose_sweep("default", ["precision=fp32"])
    three = compose_sweep("default", ["precision=fp32", "sweep.repeats=3"])
    assert len(three) == 3 * len(one)
    assert seeds(three)[:3] == [1234, 1235, 1236]
    # the repeats of a point are the same candidate (the report aggregates them)
    from pipeline.config.resolved import candidate_name

    assert len({candidate_name(p.cfg) for p in three[:3]}) == 1
    assert seeds(
        compose_sweep("default", ["precision=fp32", "parallelism=zero1", "sweep.repeats=2", "train.seed=7"])
    ) == [7, 8]


def test_a_seed_list_is_the_axis_and_repeats_leave_it_alone() -> None:
    pts = compose_sweep(
        "default", ["precision=fp32", "parallelism=zero1", "train.seed=1,2,3", "sweep.repeats=5"]
    )
    assert seeds(pts) == [1, 2, 3]


@pytest.mark.parametrize(
    "bad", ["sweep.repeats=0", "sweep.repeats=-2", "sweep.repeats=x", "sweep.repeats=1001"]
)
def test_bad_repeats_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="sweep.repeats"):
        compose_sweep("default", [bad])
