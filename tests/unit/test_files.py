"""`pipeline/files.py`: the one atomic, durable write, and a scan that fails when a module of
`pipeline/` writes a file any other way (`open` for writing, `write_text`/`write_bytes`,
`json.dump`, `os.replace`/`os.rename`, `os.open` with a write flag) without a reason below."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

from pipeline import files
from pipeline.files import read_json, write_atomic, write_json

REPO = Path(__file__).resolve().parents[2]
HELPER = "pipeline/files.py"

ALLOWED: dict[tuple[str, str], str] = {
    # (module, how it writes): why it does not go through write_atomic
    ("pipeline/train/checkpoint.py", "os.open"): "checkpoint shards written with O_DIRECT, fsynced, then "
    "committed by a manifest written with write_atomic",
    (
        "pipeline/train/checkpoint.py",
        "os.replace",
    ): "moves whole checkpoint folders (staging -> step, -> trash): "
    "a rename of a folder, followed by fsync_dir of the parent",
    ("pipeline/tracking/ledger.py", "open('a')"): "the ledger is append-only JSON lines, fsynced on flush; a "
    "torn last line is cut by repair_ledger",
    ("pipeline/tracking/ledger.py", "open('rb+')"): "repair_ledger truncates a torn last line and fsyncs",
    ("pipeline/contract/parent.py", "open('a')"): "a lock file for flock: never written",
    ("pipeline/submit/status.py", "open('a')"): "a lock file for flock: never written",
    (
        "pipeline/cli.py",
        "os.open",
    ): "os.devnull, put in place of stdout once its reader closed the pipe: no file",
    ("pipeline/submit/rounds.py", "open('a')"): "a lock file for flock: never written",
    (
        "pipeline/tracking/store.py",
        "open('a')",
    ): "a lock file for flock beside the SQLite store: never written",
    (
        "pipeline/submit/launcher.py",
        "open('a')",
    ): "the controller's stderr, appended by the processes it starts",
    (
        "pipeline/job/search.py",
        "open('w')",
    ): "/proc/self/clear_refs: a kernel control file, not a file on disk",
    ("pipeline/train/describe.py", "json.dump"): "to sys.stdout: the helper process's answer, not a file",
    ("pipeline/data/tokenfile.py", "open('wb')"): "streams a token file larger than memory next to the data "
    "(not a point or sweep file), to a unique temporary file",
    ("pipeline/data/tokenfile.py", "os.replace"): "the rename of that streamed temporary file",
    ("pipeline/sched/warm.py", "open('ab')"): "the warm server's own log (stdout, stderr), appended by it",
    ("pipeline/sched/warm.py", "os.replace"): "the server's socket, bound at a temporary name and renamed "
    "into place once it listens (not a file of data)",
    ("pipeline/submit/discover.py", "write_text"): "conf stubs for a person to edit (not a point or sweep "
    "file); an existing one is kept unless --force",
}

READ_FLAGS = {"O_RDONLY", "O_DIRECTORY", "O_CLOEXEC", "O_NOFOLLOW"}
"""An os.open whose flags name only these reads; any other (a variable included) may write."""


def _open_mode(call: ast.Call, is_method: bool) -> str | None:
    args = call.args[0:1] if is_method else call.args[1:2]
    mode = next((a.value for a in args if isinstance(a, ast.Constant)), None)
    for k in call.keywords:
        if k.arg == "mode" and isinstance(k.value, ast.Constant):
            mode = k.value.value
    return mode if isinstance(mode, str) and any(c in mode for c in "wax+") else None


def _write_of(call: ast.Call) -> str | None:
    """How this call writes a file, or None."""
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
    if name in ("write_text", "write_bytes"):
        return name
    if name == "dump" and owner == "json":
        return "json.dump"
    if name in ("replace", "rename") and owner == "os":
        return f"os.{name}"
    if name == "open" and owner == "os":
        flags = {n.attr for a in call.args[1:2] for n in ast.walk(a) if isinstance(n, ast.Attribute)}
        return None if flags and flags <= READ_FLAGS else "os.open"
    if name == "open":
        mode = _open_mode(call, isinstance(f, ast.Attribute))
        return f"open({mode!r})" if mode else None
    return None


def writes(root: Path) -> list[tuple[str, int, str]]:
    """(module, line, how) of every write in `pipeline/` outside the helper."""
    out = []
    for path in sorted((root / "pipeline").rglob("*.py")):
        rel = str(path.relative_to(root))
        if rel == HELPER:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and (how := _write_of(node)):
                out.append((rel, node.lineno, how))
    return out


def test_every_write_goes_through_the_atomic_helper() -> None:
    bad = [f"{rel}:{line}: {how}" for rel, line, how in writes(REPO) if (rel, how) not in ALLOWED]
    assert not bad, "write these with pipeline.files.write_atomic / write_json:\n" + "\n".join(bad)


def test_the_allow_list_is_not_stale() -> None:
    found = {(rel, how) for rel, _, how in writes(REPO)}
    stale = sorted(set(ALLOWED) - found)
    assert not stale, f"these no longer write that way: drop them from ALLOWED: {stale}"


def test_the_scan_catches_each_way_of_writing(tmp_path: Path) -> None:
    src = (
        "import json, os\n"
        "def f(p, d):\n"
        "    p.write_text('x')\n"  # 3
        "    open(p, 'w').write('x')\n"  # 4
        "    with p.open(mode='ab') as fh: json.dump(d, fh)\n"  # 5 (open and dump)
        "    os.replace(p, p)\n"  # 6
        "    os.open(p, os.O_WRONLY | os.O_CREAT)\n"  # 7
        "    open(p).read(); os.open(p, os.O_RDONLY)\n"  # reads: not writes
    )
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "bad.py").write_text(src)
    got = sorted((line, how) for _, line, how in writes(tmp_path))
    assert got == [
        (3, "write_text"),
        (4, "open('w')"),
        (5, "json.dump"),
        (5, "open('ab')"),
        (6, "os.replace"),
        (7, "os.open"),
    ]


# --- the helper itself -------------------------------------------------------------------
def test_write_replaces_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "outcome.json"
    write_json(target, {"a": 1})
    write_json(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    write_atomic(tmp_path / "t.txt", "é")  # text is UTF-8
    assert (tmp_path / "t.txt").read_bytes() == "é".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outcome.json", "t.txt"]
    assert read_json(tmp_path / "missing.json") is None


def test_a_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash between the write and the rename (here: fsync raises) leaves the old content and
    no temporary file: a reader never sees half a file."""
    target = tmp_path / "attempts.json"
    write_json(target, [1])

    def broken(fd: int) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(files.os, "fsync", broken)
    with pytest.raises(OSError, match="disk gone"):
        write_json(target, [1, 2])
    assert json.loads(target.read_text()) == [1]
    assert [p.name for p in tmp_path.iterdir()] == ["attempts.json"]


def test_the_file_and_its_folder_are_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Durable: the temporary file's data before the rename, the folder's entry after it."""
    synced: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(files.os, "fsync", spy)
    write_atomic(tmp_path / "x.json", "{}")
    assert len(synced) == 2
    assert Path(synced[0]).parent == tmp_path and Path(synced[0]).name.startswith(".x.json.")
    assert Path(synced[1]) == tmp_path
