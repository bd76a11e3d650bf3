"""Every call to a Slurm client command, bounded in time. Nothing else in the package runs
`scontrol`, `sinfo`, `squeue`, `sacct`, `scancel` or `sbatch` (submitit's own sbatch aside).

A controller that is down makes a client hang (`sinfo` against a dead controller takes 9 s a
call), so every call has a timeout. Torch-free: the login node and the job both use it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

CLIENT_TIMEOUT_S = 8.0  # every Slurm client call is bounded


@dataclass(frozen=True)
class Address:
    """Which cluster a client call addresses. The default (both None) is the cluster of this
    machine's slurm.conf, as every call before multi-cluster operation. `cluster`: the name
    handed to every client as `-M <name>` (`--clusters`), for a cluster that shares this one's
    slurmdbd; `slurm_conf`: the SLURM_CONF its clients read (another cluster's own config)."""

    cluster: str | None = None
    slurm_conf: str | None = None

    def flags(self) -> list[str]:
        return ["-M", self.cluster] if self.cluster else []

    def env(self) -> dict[str, str] | None:
        return {"SLURM_CONF": self.slurm_conf} if self.slurm_conf else None


HERE = Address()
"""This machine's own cluster."""


def addressed(cmd: list[str], at: Address | None) -> list[str]:
    """`cmd` with the address's `-M <cluster>` right after the program's name (where every
    Slurm client reads it: `scontrol -M x show job`, `sbatch -M x ...`)."""
    flags = at.flags() if at else []
    return [cmd[0], *flags, *cmd[1:]] if flags else list(cmd)


class SlurmCommandError(RuntimeError):
    """A Slurm client command failed or did not answer in time."""


class SlurmKilled(SlurmCommandError):
    """A Slurm client command died of a signal (it printed nothing)."""

    def __init__(self, cmd: list[str], signum: int) -> None:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        super().__init__(f"`{' '.join(cmd)}` was killed by {name}")
        self.signum = signum


class SlurmTimeout(SlurmCommandError):
    """A Slurm client command did not answer in time. Unlike a refusal, its request may still
    reach the controller and take effect (a busy slurmctld serves it late)."""


def execute(
    cmd: list[str], timeout_s: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Where every client command is started: the one seam tests replace (monkeypatch) with
    recorded outputs, as submitit's tests do with their MockedSubprocess. `env`: variables
    set for this command on top of ours."""
    full = {**os.environ, **env} if env else None
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=full)


def run(cmd: list[str], timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None) -> str:
    """Run one client command (at the cluster `at` addresses); its stdout, stripped. Raises
    SlurmCommandError."""
    cmd = addressed(cmd, at)
    env = at.env() if at else None
    try:
        out = execute(cmd, timeout_s, env=env) if env else execute(cmd, timeout_s)
    except subprocess.TimeoutExpired as e:
        raise SlurmTimeout(f"Slurm did not answer `{' '.join(cmd)}` within {timeout_s:.0f} s") from e
    except OSError as e:
        raise SlurmCommandError(f"cannot run `{' '.join(cmd)}` ({e})") from e
    if out.returncode < 0:
        raise SlurmKilled(cmd, -out.returncode)
    if out.returncode != 0:
        raise SlurmCommandError(
            f"`{' '.join(cmd)}` failed: {(out.stderr.strip() or out.stdout.strip())[:300]}"
        )
    return out.stdout.strip()


def run_lines(
    cmd: list[str], timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None
) -> list[str] | None:
    """The output lines of a query, or None when Slurm does not answer (never raises)."""
    try:
        return run(cmd, timeout_s, at).splitlines()
    except SlurmCommandError:
        return None


def answers(timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None) -> bool:
    """True when a Slurm controller answers `sinfo` on this machine (no sinfo on PATH: the
    seam's OSError, so False; every client call goes through `execute`, which tests replace)."""
    return bool(run_lines(["sinfo", "-h", "-o", "%P"], timeout_s, at))


def show(what: str, timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None) -> list[str]:
    """`scontrol show <what> -o`: one line per record. Raises SlurmCommandError."""
    return [
        line for line in run(["scontrol", "show", what, "-o"], timeout_s, at).splitlines() if line.strip()
    ]


def show_config(timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None) -> list[str]:
    """`scontrol show config`: "Name = value" lines. Raises SlurmCommandError."""
    return run(["scontrol", "show", "config"], timeout_s, at).splitlines()


def show_node(node: str, timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None) -> str | None:
    """`scontrol show node <node> -o`, or None when Slurm does not answer."""
    lines = run_lines(["scontrol", "show", "node", node, "-o"], timeout_s, at)
    return lines[0] if lines else None


def hostnames(nodelist: str, timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None) -> list[str]:
    """A node list expanded ("a100-[1-2]" -> ["a100-1", "a100-2"]); [] when Slurm does not answer."""
    return run_lines(["scontrol", "show", "hostnames", nodelist], timeout_s, at) or []


def requeue(job_id: str, timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None) -> None:
    """`scontrol requeue <job>` (submitit's own way to requeue). Raises SlurmCommandError.
    A job that requeues itself has its processes sent SIGTERM, scontrol among them: see
    _run_through."""
    _run_through(["scontrol", "requeue", job_id], timeout_s, signal.SIGTERM, at)


def signal_job(job_id: str, sig: str, timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None) -> None:
    """`scancel --signal=<sig> --full <job>`: --full so the batch shell gets it too. A job that
    signals itself gets it in scancel too: see _run_through."""
    _run_through(["scancel", f"--signal={sig}", "--full", job_id], timeout_s, signal.Signals[f"SIG{sig}"], at)


def _run_through(cmd: list[str], timeout_s: float, signum: signal.Signals, at: Address | None = None) -> None:
    """`cmd`, which may make Slurm send `signum` to this very job. A job that preempts itself
    (the preempt drill) runs the command inside its own step, so Slurm delivers the signal to
    the command too, and at its default action (USR2, TERM) the command dies before it exits:
    no output, a failed trigger (seen in CI under load). So the signal is blocked in this
    thread while the command runs (the child inherits the mask; the caller gets its own copy
    once it is unblocked), and a command killed by the very signal it asked for is a request
    that reached the job. Whether the job was really preempted is the drill's evidence."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    try:
        run(cmd, timeout_s, at)
    except SlurmKilled as e:
        if e.signum != signum:
            raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def submit_wrap(
    options: list[str], wrap: str, timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None
) -> str:
    """`sbatch --parsable <options> --wrap=<wrap>`: the new job's id."""
    return run(["sbatch", "--parsable", *options, f"--wrap={wrap}"], timeout_s, at)


def release(job_ids: Iterable[str], timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None) -> None:
    """`scontrol release <ids>`: held jobs may start. Raises SlurmCommandError (a job that is
    not held, or gone, is refused by scontrol: callers that release twice ignore that)."""
    ids = sorted({j for j in job_ids if j})
    if ids:
        run(["scontrol", "release", ",".join(ids)], timeout_s, at)


def queue_named(
    name: str, fmt: str, timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None
) -> list[str] | None:
    """`squeue -h -r -n <name> -o <fmt>` lines: every job of this user's queue with that name."""
    return run_lines(["squeue", "-h", "-r", "-n", name, "-o", fmt], timeout_s, at)


def cancel(job_ids: Iterable[str], timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None) -> None:
    """scancel these jobs (array tasks or whole arrays); bounded, errors ignored."""
    ids = sorted({j for j in job_ids if j})
    if ids:
        with contextlib.suppress(SlurmCommandError):
            run(["scancel", *ids], timeout_s, at)


def sacctmgr_show(
    entity: str, where: list[str], fields: str, timeout_s: float = CLIENT_TIMEOUT_S
) -> list[str] | None:
    """`sacctmgr -n -P show <entity> [where <k=v> ...] format=<fields>` lines (pipe-separated);
    None where sacctmgr is missing or the accounting database does not answer."""
    return run_lines(  # no sacctmgr on PATH: run's OSError, so None
        ["sacctmgr", "-n", "-P", "show", entity, *(["where", *where] if where else []), f"format={fields}"],
        timeout_s,
    )


def clusters(timeout_s: float = CLIENT_TIMEOUT_S) -> list[str] | None:
    """`sacctmgr -n -P show cluster format=Cluster`: every cluster this machine's accounting
    database (slurmdbd) knows, which `-M <name>` can address; None where it does not answer."""
    lines = sacctmgr_show("cluster", [], "Cluster", timeout_s)
    return None if lines is None else [line.strip() for line in lines if line.strip()]


def queue_of_user(
    user: str, fmt: str, timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None
) -> list[str] | None:
    """`squeue -h -r -u <user> -o <fmt>` lines: every job of the user (array tasks one per line)."""
    return run_lines(["squeue", "-h", "-r", "-u", user, "-o", fmt], timeout_s, at)


def accounting(
    job_ids: str, fields: str, timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None
) -> list[str] | None:
    """`sacct -X -n -P -o <fields> -j <ids>` lines (allocations only, pipe-separated)."""
    return run_lines(["sacct", "-X", "-n", "-P", "-o", fields, "-j", job_ids], timeout_s, at)


def queue(
    job_ids: str, fmt: str, timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None
) -> list[str] | None:
    """`squeue -h -r -o <fmt> -j <ids>` lines (array tasks one per line)."""
    return run_lines(["squeue", "-h", "-r", "-o", fmt, "-j", job_ids], timeout_s, at)


def allocations(
    job_id: str, timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None
) -> list[str] | None:
    """`sacct -D -X -n -P -o JobID,ElapsedRaw,AllocTRES,Start,State,Eligible,JobName -j <job>`: one
    line per allocation of the job, requeued ones included (-D: duplicates, each with its own
    Eligible and Start); None when Slurm does not answer. A running allocation's ElapsedRaw is
    its time so far."""
    return run_lines(
        [
            "sacct",
            "-D",
            "-X",
            "-n",
            "-P",
            "-o",
            "JobID,ElapsedRaw,AllocTRES,Start,State,Eligible,JobName%200",
            "-j",
            job_id,
        ],
        timeout_s,
        at,
    )


def test_only(
    options: list[str], timeout_s: float = CLIENT_TIMEOUT_S, at: Address | None = None
) -> str | None:
    """`sbatch --test-only <options> --wrap=true`: what the scheduler answers (on stderr, whether
    it would accept the job or not; nothing is submitted), or None when it does not answer."""
    cmd = addressed(["sbatch", "--test-only", *options, "--wrap=true"], at)
    env = {"SLURM_TIME_FORMAT": "standard", **((at.env() if at else None) or {})}
    try:  # the start time in ISO 8601, whatever the user's SLURM_TIME_FORMAT ("relative" etc.)
        out = execute(cmd, timeout_s, env=env)
    except (subprocess.TimeoutExpired, OSError):
        return None
    if out.returncode < 0:
        return None
    return "\n".join(t.strip() for t in (out.stderr, out.stdout) if t.strip())
