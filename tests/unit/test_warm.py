"""Warm ranks (pipeline/sched/warm.py): a rank forked by the server behaves toward submitit's
controller as the process it stands in for would: its streams, arguments, environment and
place are the client's, its exit code and its killing signal come back, the controller's
signals reach it, a killed client takes its rank along, and without a server the rank runs
cold. The server here preloads nothing heavy (the protocol is what is tested; the sweep's
server, tests/integration/test_sweep_local.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pipeline.sched import warm

REPO = Path(__file__).resolve().parents[2]

RANK = """
import json, os, sys, time
out = {"argv": sys.argv[1:], "cwd": os.getcwd(), "warm": os.environ.get("SQ_WARM_RANK"),
       "mine": os.environ.get("MINE"), "pid": os.getpid()}
print(json.dumps(out), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if sys.argv[1] == "sleep":
    open(sys.argv[2], "w").write(str(os.getpid()))
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


def _serve(sock: Path, tmp_path: Path) -> subprocess.Popen:
    (tmp_path / "fakerank.py").write_text(RANK)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.sched.warm", "--socket", str(sock), "serve"],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    return proc


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Path]:
    sock = tmp_path / "w.sock"
    proc = _serve(sock, tmp_path)
    yield sock
    proc.terminate()
    proc.wait(timeout=10)


def _client(sock: Path, tmp_path: Path, *args: str, **kw: object) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}", "MINE": "yes"}
    cmd = [
        sys.executable,
        "-m",
        "pipeline.sched.warm",
        "--socket",
        str(sock),
        "run",
        "-u",
        "-m",
        "fakerank",
        *args,
    ]
    return subprocess.Popen(
        cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )  # type: ignore[call-overload]


def _wait_for(path: Path) -> int:
    deadline = time.monotonic() + 30
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return int(path.read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return (
        Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
    )


def test_a_warm_rank_has_the_clients_streams_place_and_exit_code(server: Path, tmp_path: Path) -> None:
    import json

    c = _client(server, tmp_path, "7")
    out, err = c.communicate(timeout=60)
    assert c.returncode == 7
    seen = json.loads(out.splitlines()[0])
    assert seen["argv"] == ["7"] and seen["cwd"] == str(tmp_path) and seen["mine"] == "yes"
    assert seen["warm"] == "1" and seen["pid"] != c.pid  # forked by the server, not the client
    assert "to stderr" in err


def test_the_controllers_signal_reaches_the_rank_and_comes_back(server: Path, tmp_path: Path) -> None:
    c = _client(server, tmp_path, "sleep", str(tmp_path / "pid"))
    rank = _wait_for(tmp_path / "pid")
    c.send_signal(signal.SIGTERM)
    c.wait(timeout=30)
    assert c.returncode == -signal.SIGTERM  # the client ends as its rank did: by SIGTERM
    deadline = time.monotonic() + 10
    while _alive(rank) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(rank)


def test_a_drills_signal_to_the_server_leaves_it_serving_and_the_rank_gets_its_own(
    server: Path, tmp_path: Path
) -> None:
    """USR2 to every child of the ranks' parent (the local preempt trigger of ranks started by
    hand) reaches the server too: it ignores it and serves on; a rank it forks after that still
    ends on USR2 (its default back), as a cold rank would."""
    proc = next(
        p
        for p in psutil.Process().children()
        if str(server) in " ".join(p.cmdline()) and "serve" in p.cmdline()
    )
    proc.send_signal(signal.SIGUSR2)
    proc.send_signal(signal.SIGUSR1)
    c = _client(server, tmp_path, "sleep", str(tmp_path / "pid"))
    rank = _wait_for(tmp_path / "pid")
    assert proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    os.kill(rank, signal.SIGUSR2)
    c.wait(timeout=30)
    assert c.returncode == -signal.SIGUSR2


def test_a_killed_client_takes_its_rank_along(server: Path, tmp_path: Path) -> None:
    c = _client(server, tmp_path, "sleep", str(tmp_path / "pid"))
    rank = _wait_for(tmp_path / "pid")
    c.kill()  # the controller's last resort: nothing forwards a SIGKILL
    c.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _alive(rank) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(rank)


def test_without_a_server_the_rank_runs_cold(tmp_path: Path) -> None:
    import json

    (tmp_path / "fakerank.py").write_text(RANK)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}", "MINE": "yes"}
    cmd = [sys.executable, "-m", "pipeline.sched.warm", "--socket", str(tmp_path / "none.sock"), "--server-pid", "999999999", "run", "-u", "-m", "fakerank", "3"]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    seen = json.loads(done.stdout.splitlines()[0])
    assert seen["warm"] is None and seen["mine"] == "yes"


def test_the_server_refuses_to_fork_beside_a_python_thread() -> None:
    assert warm.fork_unsafe() is None or threading.active_count() > 1
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        why = warm.fork_unsafe()
        assert why is not None and "Python threads" in why
    finally:
        stop.set()
        t.join()


def test_only_a_module_command_line_is_served() -> None:
    assert warm.parse_python_argv(["-u", "-m", "submitit.core._submit", "/f"]) == (
        "submitit.core._submit",
        ["/f"],
    )
    for bad in (["-c", "print(1)"], ["script.py"], ["-u"], []):
        with pytest.raises(ValueError, match="-m module"):
            warm.parse_python_argv(bad)


def test_a_rank_is_labelled_warm_only_by_the_server() -> None:
    assert warm.started_warm({warm.WARM_ENV: "1"}) and not warm.started_warm({})
    assert warm.warm_import_s({warm.WARM_ENV: "1", warm.IMPORT_ENV: "6.5"}) == 6.5
    assert warm.warm_import_s({warm.IMPORT_ENV: "6.5"}) is None  # a cold rank with a stray variable


def test_the_launchers_server_serves_a_sweep_folder_of_any_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Unix socket's path is at most 107 bytes; a sweep folder's often is longer (pytest's
    own tmp_path under a long test name was): the server's socket lives elsewhere, and a rank
    started through the launcher's command is warm."""
    import json
    import shlex

    monkeypatch.delenv(warm.SHARED_ENV, raising=False)  # the sweep's own server, not a shared one

    (tmp_path / "fakerank.py").write_text(RANK)
    folder = tmp_path / ("a-long-sweep-folder-name-" * 6) / "submitit"
    with warm.warm_ranks(folder, modules=()) as python:
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
        cmd = [*shlex.split(python), "-u", "-m", "fakerank", "0"]
        done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0])["warm"] == "1"
    assert len(str(folder)) > 107 and (folder / "warm.log").exists()


def test_a_client_does_not_wait_for_a_dead_server(tmp_path: Path) -> None:
    """A server that died (a zombie its parent has not reaped yet) is gone: the client runs its
    rank cold at once instead of waiting for a socket that will never come."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    while warm.alive(dead.pid) and dead.poll() is None:
        time.sleep(0.01)
    assert not warm.alive(dead.pid)
    assert warm.alive(os.getpid())
    started = time.monotonic()
    assert warm._connect(tmp_path / "never.sock", 60.0, dead.pid) is None
    assert time.monotonic() - started < 5


def test_a_shared_server_forks_a_sweeps_ranks_and_the_sweep_starts_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQ_WARM_SERVER names a running server: the launcher's command reaches it (the rank's
    parent is that server) and no server of the sweep's own is started (it would log to the
    sweep folder's warm.log)."""
    import json
    import shlex
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="sq-warm-unit-"))  # 0700
    sock = home / "s"
    proc = _serve(sock, tmp_path)
    try:
        monkeypatch.setenv(warm.SHARED_ENV, str(sock))
        folder = tmp_path / "sweep" / "submitit"
        for code in ("0", "4"):  # two sweeps in a row, one server
            with warm.warm_ranks(folder, modules=()) as python:
                assert shlex.split(python)[3:5] == ["--socket", str(sock)]
                env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
                cmd = [*shlex.split(python), "-u", "-m", "fakerank", code]
                done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
            assert done.returncode == int(code), done.stderr
            rank = json.loads(done.stdout.splitlines()[0])
            assert rank["warm"] == "1"
        assert not (folder / "warm.log").exists()
        assert proc.poll() is None  # the sweep's end leaves the shared server running
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_shared_server_another_user_could_reach_is_not_used(tmp_path: Path) -> None:
    """A rank hands its server its whole environment (secrets included): only a socket of this
    user, in a directory no one else can enter, is used; anything else is ignored and the sweep
    starts its own server."""
    import socket
    import tempfile

    assert warm.shared_server({}) is None
    assert warm.shared_server({warm.SHARED_ENV: str(tmp_path / "missing")}) is None
    private = Path(tempfile.mkdtemp(prefix="sq-warm-unit-"))
    try:
        (private / "file").write_text("")
        assert warm.shared_server({warm.SHARED_ENV: str(private / "file")}) is None  # not a socket
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(private / "s"))
        try:
            assert warm.shared_server({warm.SHARED_ENV: str(private / "s")}) == private / "s"
            private.chmod(0o755)  # others may enter: the socket (mode from the umask) is reachable
            assert warm.shared_server({warm.SHARED_ENV: str(private / "s")}) is None
        finally:
            listener.close()
    finally:
        import shutil

        shutil.rmtree(private, ignore_errors=True)


def test_the_server_does_not_outlive_an_owner_killed_during_its_imports(tmp_path: Path) -> None:
    """Issue 47, case 10: the sweep is SIGKILLed while its server still imports (a slow module
    here): the server serves nothing and ends within a poll of its imports, instead of holding
    its memory for the idle time (10 minutes) as it did when it read its parent after them."""
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(1.5)\n")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    owner = (
        "import sys\nfrom pathlib import Path\nfrom pipeline.sched.warm import start_server\n"
        f"p = start_server(Path({str(tmp_path / 'w.sock')!r}), ['slowmod'], open({str(tmp_path / 'w.log')!r}, 'ab'))\n"
        "print(p.pid, flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", owner], env=env, capture_output=True, text=True, timeout=60)
    server_pid = int(done.stdout)  # the owner has exited: the server's parent is gone
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:  # gone, or a zombie no one has reaped yet
            if Path(f"/proc/{server_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.1)
    else:
        os.kill(server_pid, signal.SIGKILL)
        raise AssertionError("the server outlived its owner by 30 s (its idle time is 600 s)")
    assert not (tmp_path / "w.sock").exists()
