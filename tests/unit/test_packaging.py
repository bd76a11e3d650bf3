"""The repository as a user installs it: a wheel carries the config groups, and `qualify`
works from an installed wheel in a folder that has nothing to do with the repository."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_an_installed_wheel_finds_its_config_groups_outside_the_repository(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(REPO),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    (wheel,) = wheels.glob("slurm_qualify-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for group in ("model", "precision", "parallelism", "partition", "drill", "cost", "sweep", "references"):
        conf = sorted((REPO / "conf" / group).glob("*.yaml"))
        assert conf and all(f"pipeline/conf/{group}/{f.name}" in names for f in conf), group
    packages = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    on_disk = {
        str(p.parent.relative_to(REPO))
        for pkg in ("pipeline", "analysis")
        for p in (REPO / pkg).rglob("__init__.py")
    }
    assert on_disk <= packages, f"packages missing from the wheel (pyproject's list): {on_disk - packages}"

    site, work = tmp_path / "site", tmp_path / "elsewhere"
    work.mkdir()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-compile",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQ_")}
    env["PYTHONPATH"] = str(site)  # ahead of the editable install of the checkout
    probe = "import pipeline.home as h; print(h.__file__); print(h.conf_dir()); print(h.project_home())"
    where = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert where[0].startswith(str(site)), where
    assert where[1] == str(site / "pipeline" / "conf")
    assert where[2] == str(work), "runs and the MLflow store go where the user works, not into site-packages"
    listed = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "list"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    for option in ("tiny", "llama-7b", "zero3", "h100", "checkpoint", "smoke"):
        assert option in listed.stdout
    assert not (work / "runs").exists() and not (site / "runs").exists()
