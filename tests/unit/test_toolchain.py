"""A job puts its own interpreter's tools first on PATH (pipeline.job.startup), so DeepSpeed's
ops built at install with the venv's ninja are found built; checked here on plain mappings, and
end to end (a sweep started without the venv on PATH compiles nothing) in
tests/integration/test_toolchain.py."""

from __future__ import annotations

import os

from pipeline.job.startup import use_interpreter_toolchain

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
