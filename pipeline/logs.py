"""The log of the commands and of the job: every module logs through `logging.getLogger(__name__)`;
`setup` (called once by each entry point: the `qualify` command, the job's ranks) prints each
record as one line, `[component] message`, the component being the package the record comes
from (`[tracking]`, `[submit]`, `[job]`, `[analysis]`) or the name a job module gives its
logger, `pipeline.<component>` (`[rank]`, `[health]`, `[straggler]`, `[drill]`, `[checkpoint]`), on the standard error of the moment (a
test's capture, the job's log file). A command's own output (tables, paths it wrote) is not a
log: the command writes it to stdout. Standard library only.
"""

from __future__ import annotations

import logging
import sys

PACKAGES = ("pipeline", "analysis")


class _Component(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = record.name.split(".")
        record.component = parts[1] if parts[0] == "pipeline" and len(parts) > 1 else parts[0]
        return super().format(record)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to sys.stderr as it is when the record is emitted, not when the handler was made."""

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def setup(level: int = logging.INFO) -> None:
    """One handler on the project's loggers (idempotent: a second call replaces it)."""
    handler = _Stderr()
    handler.setFormatter(_Component("[%(component)s] %(message)s"))
    handler.set_name("slurm-qualify")
    for name in PACKAGES:
        log = logging.getLogger(name)
        log.handlers = [h for h in log.handlers if h.get_name() != "slurm-qualify"] + [handler]
        log.setLevel(level)
