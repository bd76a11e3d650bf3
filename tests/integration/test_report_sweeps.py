"""Issue 36: `qualify report --sweeps A,B`, one decision over sweeps of two clusters in one store.
The sweeps are the report's fake sweep (tests/support/analysis_helpers.py) tagged with two
clusters, the second at half the first's prices and a later price date. The references: each
sweep's own single-sweep report (the same measures, row for row), and hand-made expectations of
which rows exist and which cluster wins."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from analysis.report import report_main
from pipeline import cli
from pipeline.tracking import keys as K
from tests.support.analysis_helpers import (
    A100_1B,
    FAKE_REFERENCES,
    H100_A,
    FakeSweep,
    fake_specs,
    make_fake_sweep,
)

EAST = {"name": "east", "controller": "ctl-east", "slurm_version": "22.05.8"}
WEST = {"name": "west", "controller": "ctl-west", "slurm_version": "24.05.1"}
A, B = "20261201-100000-east", "20261201-110000-west"


@pytest.fixture
def two(sqlite_uri: str) -> tuple[FakeSweep, FakeSweep]:
    cheap = {n: replace(s, price_scale=0.5, price_date="2026-12-01") for n, s in fake_specs().items()}
    return (
        make_fake_sweep(sqlite_uri, A, cluster=EAST),
        make_fake_sweep(sqlite_uri, B, cluster=WEST, specs=cheap),
    )


@pytest.fixture
def refs(tmp_path: Path) -> Path:
    path = tmp_path / "refs.yaml"
    path.write_text(FAKE_REFERENCES)
    return path


def _report(uri: str, out: Path, refs: Path, *which: str) -> int:
    argv = ["--tracking-uri", uri, "--out", str(out), "--references", str(refs), "--no-attach", *which]
    return report_main(argv)


def _candidate_rows(md: str) -> dict[str, str]:
    """The Candidates table's rows, by candidate."""
    table = md.split("## Candidates\n", 1)[1].split("\n## ", 1)[0]
    rows = [
        line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| candidate")
    ]
    return {cells.split(" | ", 1)[0].removeprefix("| "): cells for cells in rows if "---" not in cells}


def test_one_decision_ranks_the_candidates_of_both_clusters(
    two: tuple[FakeSweep, FakeSweep], refs: Path, tmp_path: Path
) -> None:
    east, west = two
    uri = east.uri
    tags_before = {
        r.info.run_id: dict(r.data.tags) for r in MlflowClient(uri).search_runs([east.experiment_id])
    }
    assert _report(uri, tmp_path / "both", refs, "--sweeps", f"{A},{B}", "--no-tag-runs") == 0
    md = (tmp_path / "both" / f"sweeps-{A}+{B}.md").read_text()
    rows = _candidate_rows(md)
    single = {c: fake for c in {s.candidate for s in fake_specs().values()} for fake in [c]}
    assert set(rows) == {f"{c}/{k}" for c in ("east", "west") for k in single}, sorted(rows)

    # each row holds the figures of its own sweep's single-sweep report, named by its cluster
    for cluster, sid in (("east", A), ("west", B)):
        assert _report(uri, tmp_path / sid, refs, "--sweep", sid, "--no-tag-runs") == 0
        alone = _candidate_rows((tmp_path / sid / "report.md").read_text())
        for cand, line in alone.items():
            assert rows[f"{cluster}/{cand}"] == line.replace(f"| {cand} |", f"| {cluster}/{cand} |", 1)

    # the cheaper cluster wins every model it can, and the decision names it
    decision = md.split("## Decision\n", 1)[1].split("\n## ", 1)[0]
    assert f"llama-1b x full: west/{A100_1B} wins" in decision and f"runner-up east/{A100_1B}" in decision
    assert f"llama-7b x full: west/{H100_A} wins" in decision, decision
    recommendation = md.split("## Recommendation", 1)[1].split("\n## ", 1)[0]
    for line in recommendation.splitlines():
        if line.startswith("- llama-"):
            assert ": west/" in line, line

    # each cluster is named with its controller, Slurm and the date of its prices
    clusters = md.split("## Clusters (one decision over several sweeps)\n", 1)[1].split("\n## ", 1)[0]
    assert re.search(rf"\| east \| ctl-east \| 22\.05\.8 \| {A} \| 13 \|", clusters), clusters
    assert re.search(rf"\| west \| ctl-west \| 24\.05\.1 \| {B} \| 13 \|", clusters), clusters
    assert "east: prices dated 2026-11-01" in clusters and "west: prices dated 2026-12-01" in clusters
    (east_row,) = [line for line in clusters.splitlines() if line.startswith("| east |")]
    (west_row,) = [line for line in clusters.splitlines() if line.startswith("| west |")]
    assert (
        "h200 no price" in east_row
        and "h100 $3.00/GPU-h dated 2026-11-01" in east_row
        and "h100 $1.50/GPU-h dated 2026-12-01" in west_row
    )

    # it wrote nothing into the store (each run keeps its own sweep's figures)
    after = {r.info.run_id: dict(r.data.tags) for r in MlflowClient(uri).search_runs([east.experiment_id])}
    assert after == tags_before


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(["report", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("report: "), err
    return err


def test_sweeps_of_different_workloads_are_refused_naming_the_difference(
    two: tuple[FakeSweep, FakeSweep], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = two[0].uri
    llama_1b = {n: s for n, s in fake_specs().items() if s.model == "llama-1b"}
    make_fake_sweep(uri, "20261201-120000-onlyb", cluster=WEST, specs=llama_1b)
    longer = {n: replace(s, seq_len=2048) for n, s in fake_specs().items()}
    make_fake_sweep(uri, "20261201-130000-short", cluster=WEST, specs=longer)
    out = ["--tracking-uri", uri, "--out", str(tmp_path / "r")]

    err = _refused(capsys, *out, "--sweeps", f"{A},20261201-120000-onlyb")
    assert "did not measure the same workload" in err and "model config:" in err, err
    assert f"{A} has llama-1b" in err and "and llama-7b" in err, err
    assert "seq_len:" not in err and "tokens per step:" not in err, "only the part that differs"
    err = _refused(capsys, *out, "--sweeps", f"{A},20261201-130000-short")
    assert "seq_len: " + f"{A} has 4096, 20261201-130000-short has 2048" in err, err
    assert not (tmp_path / "r").exists(), "nothing written"

    assert "no parent run" in _refused(capsys, *out, "--sweeps", f"{A},20261299-nope")
    assert "two or more different" in _refused(capsys, *out, "--sweeps", A)
    assert "two or more different" in _refused(capsys, *out, "--sweeps", f"{A},{A}")
    assert "without --sweep" in _refused(capsys, *out, "--sweeps", f"{A},{B}", "--sweep", A)
    missing = ["--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}", "--sweeps", f"{A},{B}"]
    assert "no MLflow store" in _refused(capsys, *missing)


def test_runs_recorded_before_clusters_are_named_by_their_sweep(
    sqlite_uri: str, refs: Path, tmp_path: Path
) -> None:
    make_fake_sweep(sqlite_uri, A)
    make_fake_sweep(sqlite_uri, B, cluster=WEST)
    assert _report(sqlite_uri, tmp_path / "r", refs, "--sweeps", f"{A},{B}", "--no-tag-runs") == 0
    md = (tmp_path / "r" / f"sweeps-{A}+{B}.md").read_text()
    assert f"sweep-{A}/{H100_A}" in _candidate_rows(md) and f"west/{H100_A}" in _candidate_rows(md)
    assert f"run(s) name no cluster ({K.TAG_CLUSTER}" in md
