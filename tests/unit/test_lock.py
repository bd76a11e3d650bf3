"""The locked environment (scripts/install.sh, requirements.lock): every dependency that
pyproject.toml declares is pinned in the lock at a version its specifier admits, every pin
carries its sha256 hashes, torch and torch's CUDA wheels are left to the per-machine torch step,
and install.sh reads the versions it installs first from the lock's own header."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest's own dependency on 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements.lock"


def _pins() -> dict[str, list[tuple[Version, str, int]]]:
    """name -> [(version, marker text, number of hashes)], read from the lock's text."""
    pins: dict[str, list[tuple[Version, str, int]]] = {}
    entry: list[str] = []
    for line in [*LOCK.read_text().splitlines(), ""]:
        if line and not line.startswith((" ", "#")):
            entry = [line]
            continue
        if entry and line.startswith("    --hash="):
            entry.append(line)
            continue
        if entry:
            head = entry[0].rstrip(" \\")
            spec, _, marker = head.partition(";")
            name, _, version = spec.strip().partition("==")
            pins.setdefault(canonicalize_name(name), []).append(
                (Version(version), marker.strip(), len(entry) - 1)
            )
            entry = []
    return pins


def _declared() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["dev"]]]


def test_every_declared_dependency_is_pinned_at_a_version_its_specifier_admits() -> None:
    pins = _pins()
    for req in _declared():
        name = canonicalize_name(req.name)
        if name == "torch":
            assert name not in pins, "torch is installed per machine (CPU or CUDA build), not from the lock"
            continue
        assert name in pins, (
            f"{req} is declared in pyproject.toml but not in requirements.lock: run make lock"
        )
        for version, marker, _ in pins[name]:
            assert req.specifier.contains(version, prereleases=True), (
                f"requirements.lock pins {name}=={version} ({marker or 'every Python'}), outside {req}: run make lock"
            )


def test_every_pin_carries_hashes_and_no_cuda_wheel_is_locked() -> None:
    pins = _pins()
    assert len(pins) > 50  # the whole closure, not only the direct dependencies
    for name, entries in pins.items():
        for version, _, hashes in entries:
            assert hashes >= 1, f"{name}=={version} has no --hash line"
        assert not re.fullmatch(r"nvidia-(?!ml-py).*|cuda-.*|triton", name), (
            f"{name} is a wheel of torch's CUDA build: a CPU machine must not install it from the lock"
        )
    assert "nvidia-ml-py" in pins  # NVML's bindings are the project's own dependency


def test_the_running_python_finds_exactly_one_pin_of_each_package() -> None:
    """Universal resolution may pin a package once per Python range: the ranges do not overlap."""
    for name, entries in _pins().items():
        live = [v for v, marker, _ in entries if not marker or Marker(marker).evaluate()]
        assert len(live) <= 1, f"{name}: {len(live)} pins apply to this Python: {live}"


def test_install_reads_torch_and_uv_versions_from_the_lock_header() -> None:
    header = LOCK.read_text().split("\n", 6)[:6]
    torch = next(line for line in header if line.startswith("# torch=="))
    uv = next(line for line in header if line.startswith("# uv=="))
    script = (
        'LOCK=requirements.lock; cd "$1"; '
        + "\n".join(
            line
            for line in (REPO / "scripts/install.sh").read_text().splitlines()
            if line.startswith(("TORCH_VERSION=", "UV_VERSION="))
        )
        + '\necho "$TORCH_VERSION $UV_VERSION"'
    )
    out = subprocess.run(
        ["bash", "-c", script, "_", str(REPO)], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == [torch.split("==")[1].split()[0], uv.split("==")[1].split()[0]]
