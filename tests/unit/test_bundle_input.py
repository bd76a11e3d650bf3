"""Issue 47, cases 1-4: a bundle is untrusted input. Each hostile bundle goes through the real
`qualify import` (in process) and must be refused with exit code 2 and one paragraph naming the
field, before anything is written: no store is created, nothing appears outside the bundle, and
no file outside the bundle is read (a secret file next to it never reaches any output). The
well-formed bundle they are all made from passes the same checks (the refusals are the
mutations', not the builder's)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import pytest

from pipeline.cli import main
from pipeline.tracking import keys as K
from pipeline.tracking.bundle import read_bundle
from pipeline.tracking.store import artifact_location

PARENT, CHILD = "a" * 32, "b" * 32
SECRET = "the-secret-next-to-the-bundle"


def _bundle(root: Path) -> Path:
    """A well-formed bundle as `qualify export` writes it: a parent and a child run, metrics,
    an artifact and a ledger."""
    b = root / "bundle"
    for rid, tags in (
        (PARENT, {K.TAG_SWEEP_ID: "20260101-000000-abcd", K.TAG_PARENT_KIND: "sweep"}),
        (CHILD, {K.TAG_SWEEP_ID: "20260101-000000-abcd", K.TAG_MLFLOW_PARENT: PARENT}),
    ):
        run = b / "runs" / rid
        (run / "artifacts").mkdir(parents=True)
        (run / "artifacts" / "config.yaml").write_text("train: {}\n")
        info = {"run_id": rid, "name": rid[:4], "status": "FINISHED", "start_time": 1, "end_time": 2}
        (run / "run.json").write_text(json.dumps(info | {"tags": tags, "params": {"p": "1"}}))
        lines = [
            {"key": "train/loss", "value": v, "timestamp": 5, "step": i}
            for i, v in enumerate([1.5, "nan", 2])
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    (b / "ledgers" / "tracking").mkdir(parents=True)
    (b / "ledgers" / "tracking" / "events.jsonl").write_text("{}\n")
    meta = {
        "format": 1,
        "sweep_id": "20260101-000000-abcd",
        "experiment": "slurm-qualify",
        "source": "sqlite:///elsewhere.db",
        "runs": [PARENT, CHILD],
        "ledgers": {"tracking": PARENT},
    }
    (b / "bundle.json").write_text(json.dumps(meta))
    (root / "secret.txt").write_text(SECRET)
    return b


def _meta(field: str, value: object) -> Callable[[Path], None]:
    def change(b: Path) -> None:
        meta = json.loads((b / "bundle.json").read_text())
        meta[field] = value
        (b / "bundle.json").write_text(json.dumps(meta))

    return change


def _tag(tag: str, value: str) -> Callable[[Path], None]:
    def change(b: Path) -> None:
        path = b / "runs" / CHILD / "run.json"
        info = json.loads(path.read_text())
        info["tags"][tag] = value
        path.write_text(json.dumps(info))

    return change


def _link(where: str, target: str) -> Callable[[Path], None]:
    def change(b: Path) -> None:
        (b / where).symlink_to(b.parent / target)

    return change


def _line(b: Path) -> None:
    with open(b / "runs" / CHILD / "metrics.jsonl", "a") as f:
        f.write('{"key": "train/loss", "value": 1.0, "timest\n')


def _rename_run(b: Path) -> None:  # a run id that climbs out of runs/
    _meta("runs", [PARENT, "../../../secret"])(b)


# (what the hostile bundle does, the field the refusal must name)
CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("experiment-climbs", _meta("experiment", "../../../../elsewhere/x"), "'experiment'"),
    ("experiment-absolute", _meta("experiment", "/tmp/elsewhere"), "'experiment'"),
    ("experiment-control", _meta("experiment", "a\nb"), "'experiment'"),
    ("sweep-id-climbs", _meta("sweep_id", "../../outside"), "'sweep_id'"),
    ("sweep-id-absolute", _meta("sweep_id", "/tmp/outside"), "'sweep_id'"),
    ("run-id-climbs", _rename_run, "'runs'"),
    ("ledger-key-climbs", _meta("ledgers", {"../../..": PARENT}), "'ledgers', key '../../..'"),
    ("ledger-key-absolute", _meta("ledgers", {"/etc": PARENT}), "'ledgers', key '/etc'"),
    ("ledger-of-no-run", _meta("ledgers", {"tracking": "c" * 32}), "is no run of the bundle"),
    ("artifact-link-out", _link(f"runs/{CHILD}/artifacts/stolen.txt", "secret.txt"), "stolen.txt"),
    ("artifact-folder-link", _link(f"runs/{CHILD}/artifacts/up", "."), "artifacts/up"),
    ("ledger-link-out", _link("ledgers/tracking/more.jsonl", "secret.txt"), "more.jsonl"),
    ("metrics-line-broken", _line, f"runs/{CHILD}/metrics.jsonl:4"),
    ("tag-sweep-id-climbs", _tag(K.TAG_SWEEP_ID, "../../x"), f"tag '{K.TAG_SWEEP_ID}'"),
    ("tag-origin-climbs", _tag(K.TAG_ORIGIN_RUN_ID, "../x"), f"tag '{K.TAG_ORIGIN_RUN_ID}'"),
    ("status-unknown", lambda b: _edit_info(b, "status", "DONE"), "field 'status'"),
    ("params-not-text", lambda b: _edit_info(b, "params", {"p": 1}), "field 'params'"),
]


def _edit_info(b: Path, field: str, value: object) -> None:
    path = b / "runs" / CHILD / "run.json"
    info = json.loads(path.read_text())
    info[field] = value
    path.write_text(json.dumps(info))


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def test_the_well_formed_bundle_passes(tmp_path: Path) -> None:
    meta = read_bundle(_bundle(tmp_path))
    assert set(meta["infos"]) == {PARENT, CHILD}


@pytest.mark.parametrize(("name", "change", "field"), CASES, ids=[c[0] for c in CASES])
def test_a_hostile_bundle_is_refused_whole_before_anything_is_written(
    name: str,
    change: Callable[[Path], None],
    field: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bundle = _bundle(tmp_path)
    change(bundle)
    before = _files(tmp_path)
    store = tmp_path / "store" / "mlruns.db"
    assert main(["import", str(bundle), "--tracking-uri", f"sqlite:///{store}"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: import: the bundle") and err.count("\n") == 1, err
    assert field in err and "Nothing was imported" in err, err
    assert SECRET not in out + err
    assert _files(tmp_path) == before, "nothing written: no store, nothing beside the bundle"
    assert not store.parent.exists()


def test_an_experiment_argument_that_climbs_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = _bundle(tmp_path)
    argv = [
        "import",
        str(bundle),
        "--experiment",
        "../x",
        "--tracking-uri",
        f"sqlite:///{tmp_path / 's' / 'm.db'}",
    ]
    assert main(argv) == 2
    assert "--experiment is refused" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("name", ["../../../../elsewhere/x", "/abs/x", "..", "a/../../b", "team/exp"])
def test_a_store_keeps_every_experiments_artifacts_inside_it(tmp_path: Path, name: str) -> None:
    """Whatever an experiment's name (a config's, a bundle's), a SQLite store's artifacts go to
    one folder directly under its mlartifacts/ (the name joined as it was climbed out)."""
    loc = artifact_location(f"sqlite:///{tmp_path / 'mlruns.db'}", name)
    assert loc is not None
    folder = Path(urlparse(loc).path)
    assert folder.parent == (tmp_path / "mlartifacts").resolve()
    assert folder.name not in ("", ".", "..") and os.sep not in folder.name
    plain = artifact_location(f"sqlite:///{tmp_path / 'mlruns.db'}", "slurm-qualify")
    assert plain is not None and plain.endswith("/mlartifacts/slurm-qualify")  # plain names as before
