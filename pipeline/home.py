"""Where slurm-qualify reads its config groups and where it writes, from a source checkout or
an installed wheel alike. Torch-free, Hydra-free: every side imports it.

- The config groups (`conf/`) ship inside the package: `pipeline/conf/` in a wheel, the
  repository's `conf/` in a source checkout. `SQ_CONF_DIR` points at another folder with the
  same layout (a site's own partitions, say).
- The project home holds what a sweep writes: `runs/` and the SQLite MLflow store `mlruns.db`.
  It is `SQ_HOME` when set, else the slurm-qualify checkout the command runs in (the working
  folder or one above it: a venv made in another checkout must not write there), else the
  source checkout the package runs from, else the folder the user works in. Never inside
  site-packages.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
RUNS_DIR = "runs"
"""The folder under the project home that holds the sweeps (the default of `runs_dir`)."""


def source_checkout() -> Path | None:
    """The repository this package runs from (an editable install or a bare checkout), if any."""
    root = _PACKAGE.parent
    return root if (root / "pyproject.toml").exists() and (root / "conf" / "config.yaml").exists() else None


def is_checkout(folder: Path) -> bool:
    """A slurm-qualify source checkout: its pyproject names the project and conf/ is there."""
    try:
        text = (folder / "pyproject.toml").read_text()
    except OSError:
        return False
    return (folder / "conf" / "config.yaml").is_file() and re.search(
        r'(?m)^name\s*=\s*"slurm-qualify"', text
    ) is not None


def working_checkout() -> Path | None:
    """The slurm-qualify checkout the command runs in: the working folder or the nearest one above."""
    here = Path.cwd().resolve()
    return next((d for d in (here, *here.parents) if is_checkout(d)), None)


def conf_dir() -> Path:
    """The config groups: SQ_CONF_DIR, the packaged copy, or the checkout's conf/."""
    if os.environ.get("SQ_CONF_DIR"):
        return Path(os.environ["SQ_CONF_DIR"]).resolve()
    packaged = _PACKAGE / "conf"
    if (packaged / "config.yaml").exists():
        return packaged
    checkout = source_checkout()
    if checkout is None:
        raise FileNotFoundError(
            "slurm-qualify cannot find its config groups: no pipeline/conf in the installed package "
            "and no source checkout; set SQ_CONF_DIR to a folder with config.yaml"
        )
    return checkout / "conf"


def project_home() -> Path:
    """Where runs/ and mlruns.db go: SQ_HOME, the checkout the command runs in, the source
    checkout of the package, or the working folder."""
    if os.environ.get("SQ_HOME"):
        return Path(os.environ["SQ_HOME"]).resolve()
    return working_checkout() or source_checkout() or Path.cwd().resolve()


_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def is_plain_name(value: object) -> bool:
    """Whether `value` can name one folder under another and nothing else: letters, digits,
    `.`, `_`, `-`, not starting with a dot, at most 200 characters (a sweep id, a run id). No
    `/`, no `..`, no absolute path: a name from a file someone else wrote (an imported bundle,
    a tag) joined into a path stays under the folder it is joined to."""
    return isinstance(value, str) and _PLAIN_NAME.fullmatch(value) is not None
