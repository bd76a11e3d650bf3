"""The candidate is defined once (`Candidate` in pipeline/config/resolved.py) and the docs point
at that definition; the rule that more than one node needs Slurm is checked in one place."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config.resolved import Candidate, candidate_name
from pipeline.config.schema import ConfigError
from tests.support.helpers import compose

REPO = Path(__file__).resolve().parents[2]


def test_a_candidate_names_where_what_how_and_how_much() -> None:
    cfg = compose(
        [
            "partition=h100",
            "model=llama-7b",
            "method=lora",
            "method.lora_rank=16",
            "precision=bf16",
            "parallelism=zero3",
            "parallelism.gpus_per_node=8",
            "parallelism.micro_batch=1",
            "parallelism.activation_checkpointing=true",
            "data=tokens",
            "data.path=train.bin",
            "drill=checkpoint",
            "train.seed=7",
        ]  # fmt: skip
    )
    c = Candidate.of(cfg)
    assert c == Candidate("h100", "llama-7b", "lora-r16", "bf16", "zero3-1x8-mb1-ga1-ac-tokens")
    assert candidate_name(cfg) == "h100/llama-7b/lora-r16/bf16/zero3-1x8-mb1-ga1-ac-tokens"
    # the drill and the seed are runs of the same candidate; the synthetic task is not named
    assert candidate_name(compose([])) == candidate_name(compose(["drill=preempt", "train.seed=9"]))
    assert candidate_name(compose([])) == "local/tiny/full/fp32/zero2-1x2-mb4-ga1"


def test_the_docs_point_at_the_one_definition() -> None:
    design = (REPO / "docs" / "design.md").read_text()
    assert "A *candidate* is" in design and "`Candidate` in `pipeline/config/resolved.py`" in design
    keys = (REPO / "pipeline" / "tracking" / "keys.py").read_text()
    line = next(x for x in keys.splitlines() if x.startswith("TAG_CANDIDATE"))
    assert "pipeline/config/resolved.py Candidate" in line


def test_more_than_one_node_needs_slurm_is_said_once(tmp_path: Path) -> None:
    """partition=local with two nodes: one problem on either launcher, not one per checker (the
    config's check and the cluster's both said it on Slurm)."""
    from pipeline.slurm.cluster import ClusterInfo, NodeInfo, PartitionInfo
    from pipeline.submit.checks import check_against_cluster
    from pipeline.submit.sweep import plan

    with pytest.raises(ConfigError) as err:
        plan("smoke", ["parallelism.nodes=2", f"runs_dir={tmp_path / 'runs'}"], launcher_kind="local")
    assert str(err.value).count("parallelism.nodes=2") == 1, str(err.value)
    assert "needs Slurm" in str(err.value) and "parallelism.nodes=1" in str(err.value)
    assert not (tmp_path / "runs").exists()

    node = NodeInfo("g1", 8, 64000, {"h100": 4}, ("h100",), "10.0.0.1", "IDLE")
    cluster = ClusterInfo({"h100": PartitionInfo("h100", 60, None, "REQUEUE", True, "UP")}, {"g1": node})
    with pytest.raises(ConfigError) as err:
        check_against_cluster([("p0", compose(["parallelism.nodes=2"]))], cluster)
    assert "1 problem(s)" in str(err.value) and "slurm_partition is null" in str(err.value), str(err.value)
