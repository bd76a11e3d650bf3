"""analysis/: runs read through the MLflow API, references, costs per candidate, the
recommendation, the report's pages and attachments, the baseline. A real SQLite store per test,
filled through the MLflow API by tests/support/analysis_helpers.py."""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from analysis import runs as runs_mod
from analysis.baseline import baseline_main
from analysis.references import Reference, judge_run, load_references, parse_references
from analysis.report import report_main
from analysis.runs import SweepNotFound, load_sweep, to_frame
from analysis.table import Row, build_rows, recommend
from pipeline.submit.manifest import MANIFEST, Manifest
from pipeline.tracking import keys as K
from tests.support.analysis_helpers import (
    A100_1B,
    A100_7B,
    FAKE_REFERENCES,
    H100_A,
    H100_B,
    H200_7B,
    L40S_7B,
    FakeSweep,
    RunSpec,
    bulk_insert_runs,
    fake_specs,
    log_run,
    make_fake_sweep,
    make_many_runs,
    many_specs,
    run_content,
    start_sweep,
)


@pytest.fixture
def uri(sqlite_uri: str) -> str:
    return sqlite_uri


@pytest.fixture
def sweep(uri: str) -> FakeSweep:
    return make_fake_sweep(uri)


@pytest.fixture
def refs_path(tmp_path: Path) -> Path:
    path = tmp_path / "refs.yaml"
    path.write_text(FAKE_REFERENCES)
    return path


def rows_of(uri: str, refs_path: Path) -> dict[str, Row]:
    s = load_sweep(MlflowClient(tracking_uri=uri), "slurm-qualify")
    return {r.candidate: r for r in build_rows(s, load_references(refs_path))}


def run_report(uri: str, out: Path, *extra: str) -> int:
    return report_main(["--tracking-uri", uri, "--out", str(out), "--histories", "20", *extra])


# --- reading runs --------------------------------------------------------------------------


def test_load_sweep_reads_every_child_and_names_the_problems(uri: str, sweep: FakeSweep) -> None:
    s = load_sweep(MlflowClient(tracking_uri=uri), "slurm-qualify")
    assert s.sweep_id == sweep.sweep_id and s.parent.run_id == sweep.parent_id
    assert len(s.runs) == len(sweep.run_ids) == 13
    text = "\n".join(s.problems)
    assert "run 'l40s-7b-2'" in text and "logged no metrics" in text
    assert "partition 'h200' has no usable price" in text and "'None'" in text
    assert "1 run(s) are still running" in text
    frame = to_frame(s.runs)
    assert len(frame) == 13 and f"metrics.{K.PERF_TOKENS_PER_S}" in frame.columns


def test_latest_sweep_and_unknown_sweep(uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    now = int(time.time() * 1000)
    make_fake_sweep(uri, "20261129-100000-aaaa", start_ms=now - 3_600_000)
    make_fake_sweep(uri, "20261129-110000-bbbb", start_ms=now)
    client = MlflowClient(tracking_uri=uri)
    monkeypatch.setattr(runs_mod, "PAGE_SIZE", 4)  # several pages per query
    latest = load_sweep(client, "slurm-qualify")
    assert latest.sweep_id == "20261129-110000-bbbb" and len(latest.runs) == 13
    assert len(load_sweep(client, "slurm-qualify", "20261129-100000-aaaa").runs) == 13
    with pytest.raises(SweepNotFound, match="no-such-sweep"):
        load_sweep(client, "slurm-qualify", "no-such-sweep")
    with pytest.raises(SweepNotFound, match="no MLflow experiment"):
        load_sweep(client, "other-experiment")


# --- references ----------------------------------------------------------------------------


def test_reference_bounds_are_fractions_of_the_value() -> None:
    tps = Reference(K.PERF_TOKENS_PER_S, 10000, -0.1, None, "tokens/s", "h100")
    assert tps.check(9000).ok and tps.check(1e9).ok
    low = tps.check(8999)
    assert not low.ok and "8999 tokens/s < 9000, the lower bound" in low.reason
    assert low.tag_value.startswith("fail: ")
    save = Reference(K.CKPT_SAVE_S, 20, None, 0.5, "s", "*")
    assert save.check(30).ok and not save.check(30.5).ok and "upper bound" in save.check(30.5).reason
    missing = tps.check(None, "not reported by this run")
    assert not missing.ok and missing.reason == "not reported by this run"


def test_most_specific_scope_wins() -> None:
    refs = parse_references(
        {
            "references": {
                "*": {"perf/step_time_cv": [0.1, None, 0.0, "cv"], "ckpt/verified": [1, 0, None, "bool"]},
                "h100": {"perf/step_time_cv": [0.05, None, 0.0, "cv"]},
                "h100/llama-7b/bf16": {"perf/step_time_cv": [0.02, None, 0.0, "cv"]},
                "*/llama-7b": {"perf/mfu": [0.4, -0.1, None, "fraction"]},
                "h100/llama-7b/bf16/zero3": {"perf/tokens_per_s": [1.0, -0.5, None, "t/s"]},
            }
        },
        "test",
    )
    assert not refs.problems
    got = refs.for_run("h100", "llama-7b", "bf16", "zero2")
    assert got["perf/step_time_cv"].value == 0.02 and got["ckpt/verified"].scope == "*"
    assert "perf/mfu" in got and "perf/tokens_per_s" not in got
    assert refs.for_run("h100", "llama-1b", "fp32", "zero2")["perf/step_time_cv"].value == 0.05
    assert refs.for_run("a100", "llama-1b", "bf16", "zero2")["perf/step_time_cv"].value == 0.1
    assert "perf/tokens_per_s" in refs.for_run("h100", "llama-7b", "bf16", "zero3")


def test_malformed_references_are_problems_not_crashes(tmp_path: Path) -> None:
    refs = parse_references(
        {
            "references": {
                "h100": {
                    "perf/tokens_per_s": ["fast", -0.1, None, "t/s"],
                    "perf/mfu": [0.4, 0.1, None, "fraction"],  # lower must be <= 0
                    "ckpt/save_s": [20, None, None],
                },
                "a/b/c/d/e": {"perf/mfu": [0.4, -0.1, None, "fraction"]},
                "l40s": "not a mapping",
            }
        },
        "bad.yaml",
    )
    text = "\n".join(refs.problems)
    assert len(refs.problems) == 5 and not refs.metrics()
    assert "value must be a number" in text and "lower must be null or a fraction <= 0" in text
    assert "expected [value, lower, upper, unit]" in text and "scope 'a/b/c/d/e'" in text
    assert "no references applied" in parse_references({"h100": {}}, "flat.yaml").problems[0]
    broken = tmp_path / "broken.yaml"
    broken.write_text("references: [unclosed")
    assert "not valid YAML" in load_references(broken).problems[0]
    assert "does not exist" in load_references(tmp_path / "nope.yaml").problems[0]


def test_unknown_reference_key_is_reported_and_not_judged(
    uri: str, sweep: FakeSweep, refs_path: Path
) -> None:
    s = load_sweep(MlflowClient(tracking_uri=uri), "slurm-qualify")
    refs = load_references(refs_path)
    rows = {r.candidate: r for r in build_rows(s, refs)}
    [problem] = [p for p in refs.problems if "perf/tokens_per_sec" in p]
    assert "unknown reference key" in problem and "did you mean 'perf/tokens_per_s'" in problem
    assert rows[H200_7B].verdict == "pass" and [r.metric for r in rows[H200_7B].refs] == ["ckpt/verified"]


def test_each_run_gets_pass_or_fail_with_the_reason(uri: str, sweep: FakeSweep, refs_path: Path) -> None:
    s = load_sweep(MlflowClient(tracking_uri=uri), "slurm-qualify")
    refs = load_references(refs_path)
    by_name = {r.name: r for r in s.runs}
    ok = {r.metric: r for r in judge_run(refs, by_name["h100-a-1"])}
    assert ok[K.PERF_TOKENS_PER_S].ok and ok["ckpt/verified"].ok
    slow = {r.metric: r for r in judge_run(refs, by_name["a100-7b-1"])}
    assert not slow[K.PERF_TOKENS_PER_S].ok
    assert "5000 tokens/s < 6300, the lower bound" in slow[K.PERF_TOKENS_PER_S].reason
    crashed = {r.metric: r for r in judge_run(refs, by_name["l40s-7b-2"])}
    assert crashed["ckpt/verified"].reason == "not reported: the run failed (crash)"  # says why


# --- candidates, costs, recommendation -------------------------------------------------------


def test_candidate_costs_match_hand_computation(uri: str, sweep: FakeSweep, refs_path: Path) -> None:
    rows = rows_of(uri, refs_path)
    h = rows[H100_A]
    # 4 GPUs x (1200 + 1500 + 600) s / 3600 x $3.00 = $11.00 compute over 3 finished runs (the
    # crashed one counts, the running one does not), + 3 x $0.46 storage (20 GB, 30 days,
    # $0.023/GB-month) = $12.38; 2 accepted runs, 1 + 2 verified checkpoints.
    assert (
        h.cost is not None and h.cost.compute == pytest.approx(11.0) and h.cost.total == pytest.approx(12.38)
    )
    assert h.per_finished_run == pytest.approx(12.38 / 2)
    assert h.per_checkpoint == pytest.approx(12.38 / 3)
    assert h.tokens_per_usd == pytest.approx(2 * 20 * 4 * 4096 / 12.38)
    assert h.outcome_text() == "2 accepted, 1 failed (crash), 1 running"
    assert h.value(K.PERF_TOKENS_PER_S) == statistics.median([12000, 11800])
    assert h.restart_parts[K.RESTART_EXIT_TO_START_S] == 30.0


def test_zero_accepted_runs_cost_is_not_defined(
    uri: str, sweep: FakeSweep, refs_path: Path, tmp_path: Path
) -> None:
    rows = rows_of(uri, refs_path)
    l40s = rows[L40S_7B]
    assert l40s.accepted == 0 and l40s.per_finished_run is None and l40s.per_checkpoint is None
    assert l40s.cost is not None and l40s.cost.total > 0 and l40s.cost_note.startswith("lower bound")
    assert l40s.tokens_per_usd == 0.0
    assert rows[H200_7B].per_finished_run is None and rows[H200_7B].cost_note == "no price"
    assert run_report(uri, tmp_path / "out", "--references", str(refs_path)) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    # the candidate's rows in the main table and in its details
    line = " ".join(x for x in md.splitlines() if x.startswith(f"| {L40S_7B} "))
    assert "not defined (0 accepted runs)" in line and "not defined (0 verified checkpoints)" in line
    line = " ".join(x for x in md.splitlines() if x.startswith(f"| {H200_7B} "))
    assert line.count("not defined (no price)") == 3


def test_recommendation_is_the_cheapest_passing_candidate(
    uri: str, sweep: FakeSweep, refs_path: Path
) -> None:
    rows = rows_of(uri, refs_path)
    # a100 is cheaper per checkpoint than h100 but fails its tokens/s reference; h100's zero2
    # passes but costs more; h200 passes but has no price; l40s accepted nothing.
    assert rows[A100_7B].per_checkpoint < rows[H100_A].per_checkpoint < rows[H100_B].per_checkpoint  # type: ignore[operator]
    assert rows[A100_7B].verdict == "fail" and rows[H100_B].verdict == "pass"
    rec = recommend(list(rows.values()))
    assert rec["llama-7b"][0] is rows[H100_A] and "2 passing" in rec["llama-7b"][1]
    assert rec["llama-1b"][0] is rows[A100_1B]
    assert rows[H200_7B].ineligible() == "cost not defined (no price)"
    assert rows[L40S_7B].ineligible() == "no accepted run"
    rows[H100_A].cost_note = "lower bound: 1 run(s) without cost or time"
    assert rows[H100_A].ineligible() == "cost incomplete (lower bound: 1 run(s) without cost or time)"


def test_no_passing_candidate_says_why(uri: str, sweep: FakeSweep, tmp_path: Path) -> None:
    strict = tmp_path / "strict.yaml"
    strict.write_text(
        'references:\n  "*/llama-1b":\n    perf/tokens_per_s: [1.0e9, -0.1, null, "tokens/s"]\n'
    )
    rec = recommend(list(rows_of(uri, strict).values()))
    assert rec["llama-1b"][0] is None and f"{A100_1B}: fails its references" in rec["llama-1b"][1]


# --- the report ----------------------------------------------------------------------------


def test_report_writes_pages_tags_runs_and_attaches_to_parent(
    uri: str, sweep: FakeSweep, refs_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    assert run_report(uri, out, "--references", str(refs_path)) == 0
    page = (out / "report.html").read_text()
    md = (out / "report.md").read_text()
    assert len(re.findall(r'<img alt="[^"]+" src="data:image/png;base64,', page)) == 6
    assert not re.search(r'(src|href)="(?!data:)', page), "the HTML must not load anything external"
    for text in (page, md):
        assert f"llama-7b: {H100_A}" in text and "$3.00/GPU-h (2026-11-01, illustrative list price)" in text
        assert "Problems" in text and "perf/tokens_per_sec" in text and "logged no metrics" in text
        # every number the table shows is defined, with its source
        assert "Definitions" in text and "torchtitan" in text and "reusable value" in text
    assert len(list((out / "report_plots").glob("*.png"))) == 6 and "](report_plots/throughput.png)" in md

    client = MlflowClient(tracking_uri=uri)
    attached = {a.path for a in client.list_artifacts(sweep.parent_id, "report")}
    assert {"report/report.html", "report/report.md", "report/report_plots"} <= attached
    copy = client.download_artifacts(sweep.parent_id, "report/report.html", str(tmp_path))
    assert Path(copy).read_text() == page

    tags = {name: client.get_run(run_id).data.tags for name, run_id in sweep.run_ids.items()}
    assert (
        tags["h100-a-1"][K.TAG_VERDICT] == "pass" and tags["h100-a-1"]["sq.ref.perf/tokens_per_s"] == "pass"
    )
    assert tags["a100-7b-1"][K.TAG_VERDICT] == "fail"
    assert tags["a100-7b-1"]["sq.ref.perf/tokens_per_s"].startswith("fail: 5000 tokens/s < 6300")
    assert K.TAG_VERDICT not in tags["h100-a-4"]  # still running: not judged
    # a run that failed without metrics: its reference verdict says why it has no value
    l40s = tags["l40s-7b-2"]
    assert l40s[K.TAG_VERDICT] == "fail"
    assert all(
        v == "fail: not reported: the run failed (crash)" for k, v in l40s.items() if k.startswith("sq.ref.")
    ), l40s
    assert "reference tags written on 12 of 12 finished runs" in md
    assert run_report(uri, tmp_path / "again", "--references", str(refs_path)) == 0
    assert "reference tags written on 0 of 12" in (tmp_path / "again" / "report.md").read_text()


def test_report_survives_missing_references_and_unknown_sweep(
    uri: str, sweep: FakeSweep, tmp_path: Path
) -> None:
    assert run_report(uri, tmp_path / "o", "--references", str(tmp_path / "missing.yaml")) == 0
    md = (tmp_path / "o" / "report.md").read_text()
    assert "missing.yaml does not exist: runs are not judged" in md and "no references" in md
    assert run_report(uri, tmp_path / "x", "--sweep", "no-such-sweep") == 2


def test_report_on_an_empty_sweep_and_on_runs_without_metrics(uri: str, tmp_path: Path) -> None:
    empty = start_sweep(uri, "20261129-090000-empty", start_ms=int(time.time() * 1000) - 60_000)
    client = MlflowClient(tracking_uri=uri)
    # the fake sweep's parent holds the manifest as production logs it: name and format
    assert [a.path for a in client.list_artifacts(empty.parent_id)] == [MANIFEST]
    client.download_artifacts(empty.parent_id, MANIFEST, str(tmp_path))
    logged = Manifest.read(tmp_path)
    assert (logged.sweep_id, logged.parent_run_id, logged.tracking_uri) == (
        empty.sweep_id,
        empty.parent_id,
        uri,
    )
    assert run_report(uri, tmp_path / "e", "--sweep", empty.sweep_id) == 0
    md = (tmp_path / "e" / "report.md").read_text()
    assert (
        "has a parent run but no child runs" in md and md.count("_No plot: ") == 7
    )  # 6 plots + the power plot
    bare = start_sweep(uri, "20261129-100000-bare")
    for i, outcome in enumerate(("accepted", "failed", "weird")):
        log_run(client, bare, RunSpec("h100", outcome=outcome, with_metrics=False), f"bare-{i}", i)
    assert run_report(uri, tmp_path / "b") == 0  # the latest sweep
    md = (tmp_path / "b" / "report.md").read_text()
    assert "run 'bare-0'" in md and "is accepted but logged no metrics" in md
    assert "outcome 'weird' (expected one of accepted, failed, error, running, submitted): not counted" in md
    assert "llama-7b: no candidate can be recommended" in md and "no run logged its cost or time" in md
    assert md.count("_No plot: ") == 7  # 6 plots + the power plot


def test_compare_mode_shows_deltas_per_candidate(uri: str, refs_path: Path, tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    a = make_fake_sweep(uri, "20261129-100000-aaaa", start_ms=now - 3_600_000)
    make_fake_sweep(uri, "20261129-110000-bbbb", start_ms=now)
    out = tmp_path / "cmp"
    assert run_report(uri, out, "--sweep", a.sweep_id, "--compare", "20261129-110000-bbbb") == 0
    md = (out / "compare-20261129-110000-bbbb.md").read_text()
    assert f"| {H100_A} | 1.19e+04 -> 1.19e+04 (+0.0%)" in md and "pass -> pass" in md
    attached = {x.path for x in MlflowClient(tracking_uri=uri).list_artifacts(a.parent_id, "report")}
    assert "report/compare-20261129-110000-bbbb.html" in attached


# --- baseline ------------------------------------------------------------------------------


def test_baseline_writes_references_the_next_sweep_is_judged_against(
    uri: str, sweep: FakeSweep, tmp_path: Path
) -> None:
    out = tmp_path / "baseline.yaml"
    args = ["--tracking-uri", uri, "--out", str(out), "--tolerance", "0.2"]
    assert baseline_main([*args, "--tolerance-for", "ckpt/save_s=0.5"]) == 0
    assert yaml.safe_load(out.read_text())["references"]  # plain YAML, comments aside
    refs = load_references(out)
    assert not refs.problems
    tps = refs.for_run("h100", "llama-7b", "bf16", "any")[K.PERF_TOKENS_PER_S]
    assert tps.value == statistics.median([12000, 11800, 9000, 9100]) and (tps.lower, tps.upper) == (
        -0.2,
        None,
    )
    save = refs.for_run("h100", "llama-7b", "bf16", "any")[K.CKPT_SAVE_S]
    assert (save.lower, save.upper) == (None, 0.5)
    assert refs.for_run("l40s", "llama-7b", "bf16", "any").keys() == {"ckpt/verified"}  # nothing accepted
    # per candidate, every candidate with accepted runs passes a baseline made from itself
    assert baseline_main([*args, "--by", "candidate", "--tolerance", "0.05"]) == 0
    rows = rows_of(uri, out)
    assert all(r.verdict == "pass" for r in rows.values() if r.accepted), {c: r.refs for c, r in rows.items()}
    assert baseline_main(["--tracking-uri", uri, "--sweep", "nope"]) == 2


# --- scale ---------------------------------------------------------------------------------


@pytest.fixture
def fast_tmp(tmp_path: Path) -> Iterator[Path]:
    """A folder on tmpfs when there is one: creating 5,000 runs on disk spends minutes in fsync."""
    if not Path("/dev/shm").is_dir():
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="sq_analysis_") as tmp:
        yield Path(tmp)


def test_bulk_runs_read_back_as_logged_runs(tmp_path: Path) -> None:
    """The scale fixture's one-transaction writer against the client, run by run: every run
    reads back the same through search_runs and get_metric_history (ids aside).
    The awkward cases are in: running, no metrics, failed, drills, NaN and infinity."""
    specs = list(fake_specs().items()) + [(f"p{i:05d}", s) for i, s in enumerate(many_specs(30))]
    specs.append(("nan-inf", RunSpec("h100", tokens_per_s=float("inf"), mfu=float("nan"))))
    read: list[dict[str, tuple[object, ...]]] = []
    for how in ("api", "bulk"):
        uri = f"sqlite:///{tmp_path / how}.db"
        sweep = start_sweep(uri, "20261202-020000-eq", start_ms=1_000)
        if how == "api":
            for i, (name, spec) in enumerate(specs):
                log_run(MlflowClient(tracking_uri=uri), sweep, spec, name, 2_000 + i)
        else:
            bulk_insert_runs(sweep, [run_content(sweep, s, n, 2_000 + i) for i, (n, s) in enumerate(specs)])
        client = MlflowClient(tracking_uri=uri)
        runs = client.search_runs([sweep.experiment_id], f"tags.`{K.TAG_PARENT_KIND}` = 'point'")
        seen: dict[str, tuple[object, ...]] = {}
        for r in runs:
            info = r.info
            history = {
                key: [
                    (m.step, m.timestamp, repr(m.value)) for m in client.get_metric_history(info.run_id, key)
                ]
                for key in (K.PERF_STEP_TIME_S, K.TRAIN_LOSS, K.PERF_MFU, K.PERF_TOKENS_PER_S)
            }
            seen[info.run_name] = (
                info.status,
                info.start_time,
                info.end_time,
                info.lifecycle_stage,
                info.user_id,
                info.artifact_uri.replace(info.run_id, "<id>").replace(str(tmp_path / how), "<store>"),
                {k: v.replace(sweep.parent_id, "<parent>") for k, v in r.data.tags.items()},
                r.data.params,
                {k: repr(v) for k, v in r.data.metrics.items()},  # repr: NaN == NaN
                history,
            )
        read.append(seen)
    api, bulk = read
    assert len(api) == len(specs) and api.keys() == bulk.keys()
    for name in api:
        assert bulk[name] == api[name], name
    assert api["h100-a-4"][0] == "RUNNING" and api["h100-a-4"][2] is None and not api["l40s-7b-2"][8]
    assert api["nan-inf"][8][K.PERF_TOKENS_PER_S] == repr(sys.float_info.max)
    assert api["nan-inf"][8][K.PERF_MFU] == "nan"


@pytest.mark.slow
@pytest.mark.long(71)
def test_report_on_5000_runs_finishes(fast_tmp: Path, tmp_path: Path) -> None:
    """The report reads and summarises 5,000 runs (its speed: benchmarks/bench_report.py)."""
    uri = f"sqlite:///{fast_tmp / 'big.db'}"
    big = make_many_runs(uri, 5000)
    assert run_report(uri, tmp_path / "out", "--no-tag-runs", "--references", "/nonexistent") == 0
    rows = rows_of(uri, Path("/nonexistent"))
    assert len(rows) == 48 and sum(len(r.runs) for r in rows.values()) == 5000
    md = (tmp_path / "out" / "report.md").read_text()
    assert big.sweep_id in md and "step times of 20 of" in md


def test_report_projects_each_candidate_to_a_target_run_and_ranks_by_it(
    uri: str, sweep: FakeSweep, refs_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "proj"
    args = ("--references", str(refs_path), "--no-attach", "project.tokens=2e10", "project.gpus=64")
    assert run_report(uri, out, *args) == 0
    md = (out / "report.md").read_text()
    first = md.index("Decision")
    assert first < md.index("Projection to the production run") < md.index("Candidates")
    assert "wins on projected cost to the target run" in md[first:]
    section = md[md.index("Projection to the production run") :]
    assert "2e+10 tokens on 64 GPUs" in section and "Young/Daly" in section
    # what each projection used: measured inputs by key, the assumed rate with its source
    assert "measured: median perf/tokens_per_s" in section and "assumed: Llama 3 pre-training" in section
    assert (out / "report_plots" / "projection.png").exists()
    # ranked by projected cost: the costs in the table's order never decrease
    rows = re.findall(r"\| \d+ \| [^|]+ \| \$([\d,]+) \| \$([\d,]+) - \$([\d,]+) \|", section)
    costs = [float(c.replace(",", "")) for c, _, _ in rows]
    assert len(costs) >= 2 and costs == sorted(costs)
    # the band propagates every input: it holds the central cost, and each input's share is shown
    for mid, low, high in rows:
        assert float(low.replace(",", "")) <= float(mid.replace(",", "")) <= float(high.replace(",", ""))
    assert "share of the band" in section and "interruption_rate" in section and "scaling" in section


@pytest.mark.parametrize(
    "bad",
    [["project.tokens=2e10"], ["project.gpus=64"], ["project.tokens=abc", "project.gpus=8"], ["tokens=5"]],
)
def test_report_refuses_a_bad_target(uri: str, sweep: FakeSweep, tmp_path: Path, bad: list[str]) -> None:
    assert run_report(uri, tmp_path / "bad", *bad) == 2
    assert not (tmp_path / "bad").exists()


def test_the_report_logs_candidate_costs_on_runs_and_the_decision_in_the_parent(
    sqlite_uri: str, tmp_path: Path
) -> None:
    """`make report` logs each candidate's cost per finished run and per successful checkpoint
    on its runs (for the MLflow runs table), equal to a hand sum of the runs' own costs, and puts
    the decision and candidate tables under the parent's own description; a second report
    writes no metric again and replaces its part of the description."""
    sweep = make_fake_sweep(sqlite_uri)
    client = MlflowClient(tracking_uri=sqlite_uri)
    client.set_tag(sweep.parent_id, K.TAG_NOTE, "sweep summary written as it closed")
    assert run_report(sqlite_uri, tmp_path / "out") == 0
    runs = {r.info.run_name: r for r in client.search_runs([sweep.experiment_id])}
    # h100 A: runs 1 and 2 accepted ($4.46, $5.46), 3 failed ($2.46), 4 still running (no cost)
    a = [runs[f"h100-a-{i}"].data.metrics for i in (1, 2, 3)]
    total = sum(m[K.COST_USD] for m in a)
    assert total == pytest.approx(4.46 + 5.46 + 2.46)
    for i in (1, 2, 3, 4):
        assert runs[f"h100-a-{i}"].data.metrics[K.CAND_USD_PER_FINISHED_RUN] == pytest.approx(total / 2)
    note = client.get_run(sweep.parent_id).data.tags[K.TAG_NOTE]
    assert note.startswith("sweep summary written as it closed\n\n---\n**From `make report`:**")
    assert "## Decision" in note and "## Candidates" in note and "| h100/llama-7b/bf16/zero3" in note
    assert "![" not in note  # no plots in a description
    # h100 A's failed run has no checkpoint: resamples of its runs without one cost without
    # bound, so the interval's top is unbounded and a100's lower cost is no win beyond the noise
    decision = note.split("## Decision", 1)[1].split("\n## ", 1)[0]
    assert not re.search(r"\b(nan|inf)\b", decision), decision
    assert "-unbounded): tie within the measured noise" in decision, decision
    history = len(client.get_metric_history(runs["h100-a-1"].info.run_id, K.CAND_USD_PER_FINISHED_RUN))
    assert run_report(sqlite_uri, tmp_path / "out2") == 0
    again = client.get_run(sweep.parent_id).data.tags[K.TAG_NOTE]
    assert again.count("## Decision") == 1 and again.startswith("sweep summary written as it closed")
    assert (
        len(client.get_metric_history(runs["h100-a-1"].info.run_id, K.CAND_USD_PER_FINISHED_RUN)) == history
    )
