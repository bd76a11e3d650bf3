"""The one way a file of a sweep or a point is written: atomically and durably.

`write_atomic` writes a unique temporary file in the same folder, flushes and fsyncs it,
renames it over the target and fsyncs the folder, so a reader sees the old file or the whole
new one (never half of one), two writers never share a temporary file, and a file that was
replaced survives a crash of the node (the rename itself is durable). Like submitit's
`temporary_save_path`, but durable. Standard library only: every side imports it (the job,
the login node, the trainer, the tracker). `tests/unit/test_files.py` fails when a module of
`pipeline/` writes a file any other way without a stated reason.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename into it, a new file) durable; also works on a file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Replace `path` with `data` (text is UTF-8), atomically and durably."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    raw = data.encode() if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json(path: str | Path, data: Any, indent: int | None = 1) -> None:
    """Replace `path` with `data` as JSON (values JSON cannot hold as their str), atomically and durably."""
    write_atomic(path, json.dumps(data, indent=indent, default=str))


def read_json(path: str | Path) -> Any | None:
    """The JSON in `path`, or None when it does not exist (or is not JSON)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
