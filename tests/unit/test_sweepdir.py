"""The sweep folder's one owner (`pipeline/contract/sweepdir.py`): its layout as documented, the
manifest read and written through its type, by the job's parent-run closer too."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.contract import sweepdir
from pipeline.contract.parent import close_if_done, closed
from pipeline.contract.sweepdir import Manifest, PointEntry, SweepDir


def _manifest(root: Path) -> Manifest:
    sd = SweepDir(root / "runs" / "s1")
    point = sd.point("p0000")
    entry = PointEntry("p0000", 0, ["a=1"], "c", "local", "none", str(point.path), "fits")
    return Manifest(
        "s1", "smoke", "2026-12-01T12:00:00", "local", "", "e", [], points=[entry], submitted=True
    )


def test_every_name_of_the_layout_is_documented() -> None:
    doc = sweepdir.__doc__ or ""
    names = [v for k, v in vars(SweepDir).items() if k.isupper()]
    assert len(names) == 11
    assert all(n in doc for n in names), [n for n in names if n not in doc]


def test_the_manifest_round_trips_through_its_type(tmp_path: Path) -> None:
    m = _manifest(tmp_path)
    sd = SweepDir(tmp_path / "runs" / "s1")
    sd.path.mkdir(parents=True)
    assert m.write(sd.path) == sd.path / "manifest.json"
    assert json.loads(sd.manifest.read_text())["points"][0]["point_dir"] == str(sd.path / "points" / "p0000")
    assert Manifest.read(sd.path) == m
    assert SweepDir.of_point(sd.point("p0000")).path == sd.path


def test_the_closer_reads_the_manifest_through_its_type(tmp_path: Path) -> None:
    """No manifest, or a file that is not one: nothing to close (never a crash in a job's end)."""
    m = _manifest(tmp_path)
    sd = SweepDir(tmp_path / "runs" / "s1")
    sd.path.mkdir(parents=True)
    assert not close_if_done(sd.path, by="test")  # no manifest yet
    sd.manifest.write_text('{"sweep_id": "s1"}')  # not a manifest
    assert not close_if_done(sd.path, by="test")
    m.write(sd.path)
    assert not close_if_done(sd.path, by="test")  # its point has no outcome
    sd.point("p0000").write_outcome({"outcome": "accepted"})
    assert close_if_done(sd.path, by="test")  # no tracking URI: only the marker
    assert (closed(sd.path) or {})["by"] == "test" and sd.parent_closed.exists()
