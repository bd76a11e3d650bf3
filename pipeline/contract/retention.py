"""What a point leaves on its storage after the run: the bytes of the checkpoints it really kept
(torch-free; the job bills them as it ends, the login node again when it bills from sacct).

A kept checkpoint is a committed one: a folder `step<N>` directly in the point's `checkpoints/`
(pipeline.train.checkpoint's `tag_for`; a save in progress sits in `.staging/`, a discarded one
in `.trash/` until deleted). The storage bill is these bytes over the retention, whatever
`train.keep_last` allowed: a run that saved one checkpoint and may keep two stores one."""

from __future__ import annotations

import os
from pathlib import Path

COMMITTED_PREFIX = "step"


def kept_checkpoints(folder: Path) -> list[Path]:
    """The committed checkpoint folders in `folder` (a point's `checkpoints/`), by name."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith(COMMITTED_PREFIX))


def kept_checkpoint_bytes(folder: Path) -> int:
    """Bytes of every file in the committed checkpoints of `folder`, every rank's shards
    included (0 when the run kept none)."""
    total = 0
    for ckpt in kept_checkpoints(folder):
        for dirpath, _, files in os.walk(ckpt):
            total += sum(os.lstat(os.path.join(dirpath, f)).st_size for f in files)
    return total
