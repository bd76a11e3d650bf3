"""`sbatch --test-only` against the real local Slurm: a shape the partition holds gets a dated
start on its nodes; a shape it cannot hold (more nodes than it has, past MaxTime, a partition
that does not exist) gets Slurm's reason; nothing is submitted either way."""

from __future__ import annotations

from datetime import datetime

import pytest

from pipeline.slurm import commands
from pipeline.slurm.cluster import parse_test_only
from tests.support.slurm_fixtures import slurm_cluster  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


def _queued() -> list[str]:
    return commands.run_lines(["squeue", "-h", "-o", "%i"]) or []


def test_the_local_cluster_answers_a_start_for_a_shape_it_holds() -> None:
    before = _queued()
    asked = datetime.now()
    est = parse_test_only(commands.test_only(["-p", "h100", "-N", "2", "--gres=gpu:4", "-t", "30"]), asked)
    assert est.refused == "" and est.start is not None, est
    assert est.partition == "h100" and est.nodes.startswith("h100-"), est
    assert est.wait_s is not None and est.wait_s < 24 * 3600
    # no new job (a job of the test before may leave the queue meanwhile)
    assert not set(_queued()) - set(before), "--test-only submits nothing"


@pytest.mark.parametrize(
    ("options", "why"),
    [
        (["-p", "h100", "-N", "9"], "Node count specification invalid"),
        (["-p", "h200", "-t", "600"], "time limit"),
        (["-p", "no-such-partition"], "nvalid partition"),
    ],
)
def test_a_shape_the_cluster_cannot_hold_gets_slurms_reason(options: list[str], why: str) -> None:
    est = parse_test_only(commands.test_only(options), datetime.now())
    assert est.start is None and why in est.refused, est
