"""The Slurm client seam (pipeline/slurm/commands.py) where a command dies of a signal: a job
that signals itself runs scancel inside its own step, and Slurm signals scancel too."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.slurm import commands


@pytest.fixture
def usr2_seen() -> Iterator[list[int]]:
    """This process handles USR2 as a rank does (a handler that records), for the test's span."""
    seen: list[int] = []
    old = signal.signal(signal.SIGUSR2, lambda signum, frame: seen.append(signum))
    yield seen
    signal.signal(signal.SIGUSR2, old)


def test_a_job_signalling_itself_survives_its_own_signal(
    monkeypatch: pytest.MonkeyPatch, usr2_seen: list[int]
) -> None:
    """As slurmstepd delivers `scancel --signal=USR2 --full` to every process of the step: to
    the scancel process (a real child, USR2 at its default action) and to this one, its parent.
    The child lives to exit 0, and this process gets its USR2 once signal_job returns."""
    calls: list[list[str]] = []

    def step_delivers(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        script = "kill -USR2 $$; kill -USR2 $PPID; sleep 0.2; echo delivered"
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=timeout_s)

    monkeypatch.setattr(commands, "execute", step_delivers)
    commands.signal_job("35_1", "USR2", 10)
    assert calls == [["scancel", "--signal=USR2", "--full", "35_1"]]
    assert usr2_seen == [signal.SIGUSR2]
    assert signal.SIGUSR2 not in signal.pthread_sigmask(signal.SIG_BLOCK, set()), "the mask is restored"


def _ended_by(signum: int) -> Any:
    def execute(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, -signum, "", "")

    return execute


def test_a_command_killed_by_the_signal_it_sent_reached_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "execute", _ended_by(signal.SIGUSR2))
    commands.signal_job("35_1", "USR2", 10)  # no error: the signal it asked for arrived
    monkeypatch.setattr(commands, "execute", _ended_by(signal.SIGTERM))
    commands.requeue("35_1", 10)  # a requeue terminates the job's processes, scontrol among them


def test_a_command_killed_otherwise_says_by_what(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "execute", _ended_by(signal.SIGKILL))
    with pytest.raises(
        commands.SlurmCommandError, match=r"`scancel --signal=USR2 --full 35_1` was killed by SIGKILL"
    ):
        commands.signal_job("35_1", "USR2", 10)
    with pytest.raises(commands.SlurmCommandError, match=r"`scontrol requeue 7` was killed by SIGKILL"):
        commands.requeue("7", 10)
    monkeypatch.setattr(commands, "execute", _ended_by(signal.SIGTERM))
    with pytest.raises(
        commands.SlurmCommandError, match=r"`scancel --signal=USR2 --full 7` was killed by SIGTERM"
    ):
        commands.signal_job("7", "USR2", 10)
