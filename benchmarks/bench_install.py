"""The locked install with uv against the same lock with pip, side by side in one run
(scripts/install.sh, docs/install.md).

Each repeat makes two fresh venvs, puts the same torch in each first (not timed: install.sh's
torch step is the same for both), then times the step install.sh runs next, both installers
from requirements.lock with hashes checked, no dependency resolution and every module compiled
to bytecode (pip does; uv only with --compile-bytecode), caches off (a clean machine downloads
every wheel): `uv pip install --compile-bytecode --require-hashes --no-deps -r requirements.lock`
against `pip install --require-hashes --no-deps -r requirements.lock`. The two alternate which
goes first. Printed: each installer's seconds per repeat and the pip / uv ratio of the medians
(goal >= 3: the lock's install at least three times as fast as pip's).

Run: .venv/bin/python -m benchmarks.bench_install [--repeats N]
Needs the network to the package index (or its mirror: UV_INDEX_URL for uv, pip.conf for pip).
Exit 1 when the goal is missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements.lock"
GOAL = 3.0


def _header(key: str) -> str:
    line = next(x for x in LOCK.read_text().splitlines() if x.startswith(f"# {key}=="))
    return line.split("==", 1)[1].split()[0]


def _venv(root: Path) -> Path:
    """A fresh venv with this interpreter's torch build and uv in it (neither timed)."""
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    py = root / "bin" / "python"
    import torch

    subprocess.run([str(py), "-m", "pip", "install", "-q", f"torch=={torch.__version__}"], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", f"uv=={_header('uv')}"], check=True)
    return py


def _timed(installer: str, py: Path) -> float:
    common = ["--require-hashes", "--no-deps", "-r", str(LOCK)]
    if installer == "uv":
        cmd = [
            str(py.parent / "uv"),
            "pip",
            "install",
            "--quiet",
            "--python",
            str(py),
            "--no-build-isolation-package",
            "deepspeed",
            *common,
        ]
        env = {**os.environ, "UV_NO_CACHE": "1"}
    else:
        cmd = [str(py), "-m", "pip", "install", "-q", "--no-build-isolation", *common]
        env = {**os.environ, "PIP_NO_CACHE_DIR": "1"}
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    times: dict[str, list[float]] = {"uv": [], "pip": []}
    for i in range(args.repeats):
        order = ("uv", "pip") if i % 2 == 0 else ("pip", "uv")
        for installer in order:
            with tempfile.TemporaryDirectory(prefix=f"bench-install-{installer}-") as tmp:
                py = _venv(Path(tmp) / "venv")
                times[installer].append(_timed(installer, py))
                print(
                    f"repeat {i + 1}: {installer} installed the lock in {times[installer][-1]:.1f} s",
                    flush=True,
                )
    uv, pip = statistics.median(times["uv"]), statistics.median(times["pip"])
    print(f"median: uv {uv:.1f} s, pip {pip:.1f} s (the lock, hashes checked, caches off)")
    print(f"pip_over_uv={pip / uv:.2f} (goal >= {GOAL})")
    return 0 if pip / uv >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
