"""Issue 36: `qualify export` / `qualify import` move one sweep from one SQLite store into another
without loss, and importing twice adds nothing. The sweep is the report's fake sweep
(tests/support/analysis_helpers.py: every awkward case, logged through the MLflow API), with
ledgers written by the job's own Tracker into its sweep folder. The references are the source
store itself: every run read back from it, and the report over it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from analysis.report import report_main
from pipeline import cli
from pipeline.files import write_atomic
from pipeline.tracking import keys as K
from pipeline.tracking.ledger import LedgerDir, Tracker
from tests.support.analysis_helpers import FAKE_REFERENCES, FakeSweep, make_fake_sweep

EXPERIMENT = "slurm-qualify"
IMPORT_TAGS = (K.TAG_ORIGIN_RUN_ID, K.TAG_ORIGIN_STORE, K.TAG_IMPORT_COMPLETE)


@pytest.fixture
def source(sqlite_uri: str, tmp_path: Path) -> tuple[FakeSweep, Path]:
    """The fake sweep, and its sweep folder with the ledgers of its parent and of one point,
    each written by a Tracker logging into that run (as the sweep and the job do)."""
    sweep = make_fake_sweep(sqlite_uri)
    sweep_dir = tmp_path / "runs" / sweep.sweep_id
    for folder, run_id in (
        ("tracking", sweep.parent_id),
        ("points/h100-a-1/tracking", sweep.run_ids["h100-a-1"]),
    ):
        (sweep_dir / folder).mkdir(parents=True)  # the run's id, as the attempt that created it wrote it
        write_atomic(LedgerDir(sweep_dir / folder).run_id, run_id)
    parent = Tracker(
        sqlite_uri, EXPERIMENT, sweep_dir / "tracking", "sweep", run_id=sweep.parent_id, background=False
    )
    parent.set_tags({K.TAG_POINTS: str(len(sweep.run_ids))})
    parent.close(terminate=False)
    point = sweep_dir / "points" / "h100-a-1" / "tracking"
    child = Tracker(
        sqlite_uri, EXPERIMENT, point, "h100-a-1", run_id=sweep.run_ids["h100-a-1"], background=False
    )
    child.log_metrics({K.EVAL_LOSS: 4.25}, step=7)
    child.close(terminate=False)
    return sweep, sweep_dir


def _store(tmp_path: Path, name: str) -> str:
    return f"sqlite:///{tmp_path / name / 'mlruns.db'}"


def _qualify(*argv: str) -> int:
    return cli.main(list(argv))


def _export(sweep_id: str, out: Path | str, runs_dir: Path | str, uri: str) -> int:
    return _qualify(
        "export", "--sweep", sweep_id, "--out", str(out), "--runs-dir", str(runs_dir), "--tracking-uri", uri
    )


def _runs(uri: str) -> list[Any]:
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    return list(client.search_runs([exp.experiment_id], max_results=1000))


def _histories(client: MlflowClient, run: Any) -> dict[str, list[tuple[int, int, float]]]:
    return {
        k: sorted((m.step, m.timestamp, m.value) for m in client.get_metric_history(run.info.run_id, k))
        for k in run.data.metrics
    }


def _artifacts(client: MlflowClient, run_id: str, tmp: Path) -> dict[str, bytes]:
    if not client.list_artifacts(run_id):
        return {}
    dest = tmp / run_id
    dest.mkdir(parents=True)
    for entry in client.list_artifacts(run_id):
        client.download_artifacts(run_id, entry.path, str(dest))
    return {str(p.relative_to(dest)): p.read_bytes() for p in sorted(dest.rglob("*")) if p.is_file()}


def _report(uri: str, out: Path, refs: Path, sweep_id: str) -> str:
    """The report's Markdown, with what names the store (its URI, run and experiment ids) and
    the hour it was made blanked: every figure stays."""
    rc = report_main(
        [
            "--tracking-uri",
            uri,
            "--out",
            str(out),
            "--sweep",
            sweep_id,
            "--references",
            str(refs),
            "--no-attach",
            "--no-tag-runs",
        ]
    )
    assert rc == 0
    text = (out / "report.md").read_text()
    ids = {r.info.run_id for r in _runs(uri)}
    for run_id in ids:
        text = text.replace(run_id, "<run>").replace(run_id[:8], "<run>")
    text = text.replace(uri, "<uri>")
    return re.sub(r"generated \S+ \S+ \S+", "generated <time>", text)


def test_export_then_import_loses_nothing_and_twice_adds_nothing(
    source: tuple[FakeSweep, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep, sweep_dir = source
    src, dst, bundle = sweep.uri, _store(tmp_path, "dest"), tmp_path / "bundle"
    assert _export(sweep.sweep_id, bundle, sweep_dir.parent, src) == 0
    assert "14 run(s)" in (said := capsys.readouterr().out) and "2 ledger(s)" in said, said
    assert _qualify("import", str(bundle), "--tracking-uri", dst) == 0
    assert "14 run(s) added, 0 already there" in capsys.readouterr().out

    a, b = MlflowClient(tracking_uri=src), MlflowClient(tracking_uri=dst)
    originals = {r.info.run_id: r for r in _runs(src)}
    imported = {r.data.tags[K.TAG_ORIGIN_RUN_ID]: r for r in _runs(dst)}
    assert imported.keys() == originals.keys() and len(_runs(dst)) == 14, "the parent and its 13 points"
    new_id = {o: r.info.run_id for o, r in imported.items()}
    for run_id, old in originals.items():
        new = imported[run_id]
        assert (new.info.run_name, new.info.status, new.info.start_time, new.info.end_time) == (
            old.info.run_name, old.info.status, old.info.start_time, old.info.end_time,
        )  # fmt: skip
        assert new.data.params == old.data.params
        want = dict(old.data.tags)
        if K.TAG_MLFLOW_PARENT in want:  # the child names the imported parent
            want[K.TAG_MLFLOW_PARENT] = new_id[want[K.TAG_MLFLOW_PARENT]]
        got = {k: v for k, v in new.data.tags.items() if k not in IMPORT_TAGS}
        assert got == want, run_id
        assert new.data.tags[K.TAG_ORIGIN_STORE] == src and new.data.tags[K.TAG_IMPORT_COMPLETE] == "1"
        assert _histories(b, new) == _histories(a, old), f"every value of every metric of {run_id}"
        moved = _artifacts(b, new.info.run_id, tmp_path / "b")
        kept = _artifacts(a, run_id, tmp_path / "a")
        ledger = {k: v for k, v in moved.items() if k.startswith(K.ARTIFACT_LEDGER + "/")}
        assert {k: v for k, v in moved.items() if k not in ledger} == kept
        if run_id in (sweep.parent_id, sweep.run_ids["h100-a-1"]):  # the two runs with a ledger
            folder = (
                sweep_dir / "tracking"
                if run_id == sweep.parent_id
                else sweep_dir / "points/h100-a-1/tracking"
            )
            assert ledger == {f"{K.ARTIFACT_LEDGER}/{p.name}": p.read_bytes() for p in folder.iterdir()}
        else:
            assert ledger == {}
    assert any(
        m[0] == 7 and m[2] == 4.25 for m in _histories(b, imported[sweep.run_ids["h100-a-1"]])[K.EVAL_LOSS]
    )

    # the report over the imported runs is the report over the originals
    refs = tmp_path / "refs.yaml"
    refs.write_text(FAKE_REFERENCES)
    assert _report(dst, tmp_path / "rb", refs, sweep.sweep_id) == _report(
        src, tmp_path / "ra", refs, sweep.sweep_id
    )

    # a second import adds nothing: no run, no value, no artifact
    def counts() -> tuple[int, int, int]:
        runs = _runs(dst)
        values = sum(len(h) for r in runs for h in _histories(b, r).values())
        files = sum(len(b.list_artifacts(r.info.run_id)) for r in runs)
        return len(runs), values, files

    before = counts()
    assert _qualify("import", str(bundle), "--tracking-uri", dst) == 0
    assert "0 run(s) added, 14 already there" in capsys.readouterr().out
    assert counts() == before
    # issue 47: into the store it came from (its own runs carry no origin tag): nothing either,
    # so the report does not count each run twice
    assert _qualify("import", str(bundle), "--tracking-uri", src) == 0
    assert "0 run(s) added, 14 already there" in capsys.readouterr().out
    assert sorted(r.info.run_id for r in _runs(src)) == sorted(originals)

    # a run an interrupted import left incomplete is imported again, once
    half = imported[sweep.run_ids["a100-7b-1"]]
    b.delete_tag(half.info.run_id, K.TAG_IMPORT_COMPLETE)
    assert _qualify("import", str(bundle), "--tracking-uri", dst) == 0
    assert "1 run(s) added, 13 already there, 1 left incomplete" in capsys.readouterr().out
    assert counts() == before
    (again,) = [r for r in _runs(dst) if r.data.tags[K.TAG_ORIGIN_RUN_ID] == sweep.run_ids["a100-7b-1"]]
    assert _histories(b, again) == _histories(a, originals[sweep.run_ids["a100-7b-1"]])


def test_a_bundle_of_an_imported_sweep_keeps_the_first_origin(
    source: tuple[FakeSweep, Path], tmp_path: Path
) -> None:
    """Store A -> B -> C: C's runs name A's run ids, and importing A's bundle into C adds nothing."""
    sweep, sweep_dir = source
    b, c = _store(tmp_path, "b"), _store(tmp_path, "c")
    runs_dir = str(sweep_dir.parent)
    assert _export(sweep.sweep_id, tmp_path / "ab", runs_dir, sweep.uri) == 0
    assert _qualify("import", str(tmp_path / "ab"), "--tracking-uri", b) == 0
    assert _export(sweep.sweep_id, tmp_path / "bc", tmp_path, b) == 0
    assert _qualify("import", str(tmp_path / "bc"), "--tracking-uri", c) == 0
    origins = {r.data.tags[K.TAG_ORIGIN_RUN_ID] for r in _runs(c)}
    assert origins == {r.info.run_id for r in _runs(sweep.uri)}
    assert {r.data.tags[K.TAG_ORIGIN_STORE] for r in _runs(c)} == {sweep.uri}
    assert _qualify("import", str(tmp_path / "ab"), "--tracking-uri", c) == 0
    assert len(_runs(c)) == 14


def test_bad_input_is_one_paragraph_and_exit_2(
    source: tuple[FakeSweep, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep, sweep_dir = source
    runs_dir = str(sweep_dir.parent)

    def refused(*argv: str) -> str:
        assert _qualify(*argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err, err
        return err

    out = str(tmp_path / "bundle")
    assert sweep.sweep_id in refused("export", "--sweep", "nope", "--out", out, "--tracking-uri", sweep.uri)
    assert "no MLflow store" in refused(
        "export", "--sweep", "x", "--out", out, "--tracking-uri", _store(tmp_path, "none")
    )
    assert not (tmp_path / "bundle").exists(), "nothing written"
    assert "no complete export bundle" in refused(
        "import", str(tmp_path / "nothing"), "--tracking-uri", sweep.uri
    )
    # a ledger whose events MLflow does not have yet: exporting now would lose them
    late = Tracker(
        sweep.uri,
        EXPERIMENT,
        sweep_dir / "points" / "late" / "tracking",
        "late",
        offline=True,
        background=False,
    )
    late.log_metrics({K.TRAIN_LOSS: 1.0}, step=1)
    late.close()
    assert "qualify sync" in refused(
        "export", "--sweep", sweep.sweep_id, "--out", out, "--runs-dir", runs_dir, "--tracking-uri", sweep.uri
    )
    shutil.rmtree(sweep_dir / "points" / "late")
    # a bundle half written (bundle.json is written last)
    assert _export(sweep.sweep_id, out, runs_dir, sweep.uri) == 0
    (tmp_path / "bundle" / "bundle.json").unlink()
    assert "interrupted export" in refused("import", out, "--tracking-uri", _store(tmp_path, "d"))
    assert "not an empty folder" in refused(
        "export", "--sweep", sweep.sweep_id, "--out", out, "--tracking-uri", sweep.uri
    )
    # issue 47, case 4: a run the destination refuses midway (a metric key MLflow does not take)
    # is deleted, exit 2 naming it: nothing of it is left RUNNING, the runs before it complete
    shutil.rmtree(tmp_path / "bundle")
    assert _export(sweep.sweep_id, out, runs_dir, sweep.uri) == 0
    child = sweep.run_ids["a100-7b-1"]
    with open(tmp_path / "bundle" / "runs" / child / "metrics.jsonl", "a") as f:
        f.write('{"key": "bad*key", "value": 1.0, "timestamp": 1, "step": 0}\n')
    dst = _store(tmp_path, "refuses")
    assert _qualify("import", out, "--tracking-uri", dst) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after MLflow's own log lines
    assert err.startswith("error: ") and f"run {child}" in err and "deleted" in err, err
    left = _runs(dst)
    assert left and all(r.data.tags.get(K.TAG_IMPORT_COMPLETE) == "1" for r in left), "no half-imported run"
    assert child not in {r.data.tags[K.TAG_ORIGIN_RUN_ID] for r in left}
    # issue 47, case 2: a parent run whose sweep id tag is a path: the report writes nothing
    MlflowClient(tracking_uri=sweep.uri).set_tag(sweep.parent_id, K.TAG_SWEEP_ID, "../../outside")
    assert report_main(["--tracking-uri", sweep.uri, "--sweep", "../../outside", "--no-attach"]) == 2
    assert "no plain name" in capsys.readouterr().err
