"""A job puts its own interpreter's tools first on PATH (pipeline.job.startup), so DeepSpeed's
ops built at install with the venv's ninja are found built; checked here on plain mappings, and
end to end (a sweep started without the venv on PATH compiles nothing) in
tests/integration/test_toolchain.py."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.job.startup import use_interpreter_toolchain, use_venv_ops_cache, venv_ops_cache

VENV_PY = "/opt/proj/.venv/bin/python"


def test_the_interpreters_bin_goes_first_once() -> None:
    env = {"PATH": os.pathsep.join(["/usr/local/bin", "/opt/proj/.venv/bin", "/usr/bin"])}
    assert use_interpreter_toolchain(env, VENV_PY)
    assert env["PATH"].split(os.pathsep) == ["/opt/proj/.venv/bin", "/usr/local/bin", "/usr/bin"]
    assert not use_interpreter_toolchain(env, VENV_PY), "already first: PATH is left as it is"
    assert env["PATH"].split(os.pathsep) == ["/opt/proj/.venv/bin", "/usr/local/bin", "/usr/bin"]


def test_an_empty_or_missing_path_gets_the_bin_folder_alone() -> None:
    for env in ({}, {"PATH": ""}):
        assert use_interpreter_toolchain(env, VENV_PY)
        assert env["PATH"] == "/opt/proj/.venv/bin"


def test_the_venvs_python_link_is_not_resolved(tmp_path: os.PathLike[str]) -> None:
    """A venv's bin/python links to the base interpreter; its folder is the venv's, not /usr/bin."""
    real = os.path.join(tmp_path, "base", "bin")
    venv = os.path.join(tmp_path, "venv", "bin")
    os.makedirs(real)
    os.makedirs(venv)
    open(os.path.join(real, "python3"), "w").close()
    os.symlink(os.path.join(real, "python3"), os.path.join(venv, "python"))
    env = {"PATH": "/usr/bin"}
    use_interpreter_toolchain(env, os.path.join(venv, "python"))
    assert env["PATH"].split(os.pathsep)[0] == venv


def _venv(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "bin" / "python").touch()
    return root


def test_the_op_cache_is_the_venvs_own(tmp_path: Path) -> None:
    """Issue #46: DeepSpeed's ops are kept with the venv that built them, so two checkouts (two
    venvs) on one machine never make each other's stale; a link to a venv shares its cache."""
    a, b = _venv(tmp_path / "a" / ".venv"), _venv(tmp_path / "b" / ".venv")
    env: dict[str, str] = {"TORCH_EXTENSIONS_DIR": "/home/u/.cache/torch_extensions"}
    assert use_venv_ops_cache(env, str(a / "bin" / "python")) == a.resolve() / "torch_extensions"
    assert env["TORCH_EXTENSIONS_DIR"] == str(a.resolve() / "torch_extensions")
    assert venv_ops_cache(str(b / "bin" / "python")) == b.resolve() / "torch_extensions"
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / ".venv").symlink_to(a)  # a worktree whose .venv links to a's
    assert (
        venv_ops_cache(str(tmp_path / "wt" / ".venv" / "bin" / "python")) == a.resolve() / "torch_extensions"
    )


def test_outside_a_venv_the_cache_is_left_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    env = {"TORCH_EXTENSIONS_DIR": "/somewhere"}
    assert use_venv_ops_cache(env, str(tmp_path / "bin" / "python3")) is None
    assert env == {"TORCH_EXTENSIONS_DIR": "/somewhere"}


def test_this_interpreters_venv_is_where_the_tests_find_the_ops() -> None:
    """conftest sets it for the in-process engines, as every job does."""
    cache = venv_ops_cache()
    assert cache is not None, "the tests run in the project's venv"
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(cache)
