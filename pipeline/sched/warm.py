"""Warm ranks for the local launcher (docs/design.md, "Warm ranks"): one server per local sweep
imports what every rank imports (torch, transformers, DeepSpeed, the job's own modules) once,
before any thread exists, and forks each rank from that state; a local sweep of N points pays
the imports once instead of 2N times.

submitit's local controller starts each task as `<python> -u -m submitit.core._submit <folder>`;
the local launcher names as `<python>` this module's client (`python -m pipeline.sched.warm
--socket S run`), a small stdlib-only process that stands in for the rank toward the controller:
it hands its stdin/stdout/stderr, argv, environment and working directory to the server, which
forks the rank; it forwards the signals it receives (the controller's SIGINT/SIGTERM/SIGUSR2)
to the rank, and ends as the rank ended (its exit code, or the same signal). When the server is
not there (not yet ready, refused, gone), the client runs the rank itself, cold, as submitit
would have: warm ranks are a speed-up, never a new way to fail.

Fork safety: the server forks only while it has exactly one thread and CUDA is not initialised
(it checks both after its imports and refuses to serve otherwise), and each rank resets its
signal handlers, its working directory, environment and standard streams to the client's before
it runs. A rank started warm has `SQ_WARM_RANK=1`: its start-up measures a fork, not a process
start, so the job labels its run (`sq.ranks=warm`) and the projection never uses its start-up.

Import rule: the package's (tests/unit/test_boundaries.py); the server imports the job's
libraries by name, in the process it runs in (`serve`), never in the client or the login node.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import logging
import os
import select
import shlex
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NoReturn

log = logging.getLogger("pipeline.warm")

WARM_ENV = "SQ_WARM_RANK"
"""Set to 1 in a rank forked by the server (the job labels its start-up as warm)."""
IMPORT_ENV = "SQ_WARM_IMPORT_S"
"""In a warm rank: the seconds the server's imports took (the start-up the rank did not pay)."""
SHARED_ENV = "SQ_WARM_SERVER"
"""The socket of a server already running (`python -m pipeline.sched.warm --socket S serve
<modules>`), which a local sweep then uses instead of starting its own: many sweeps in a row (a
test suite, a script of sweeps) pay the imports once. Owned by this user, in a directory only
this user can enter; otherwise it is ignored, with a warning."""
CLIENT_ENV = "SQ_WARM_CLIENT_PID"
"""The pid of the client standing in for a warm rank: the controller's child, the process
submitit signals and waits for (pipeline.sched.local's preempt signals the point's tasks)."""


def started_warm(env: Mapping[str, str] | None = None) -> bool:
    """This rank was forked by the server (its start-up is a fork's, not a process start's)."""
    return (os.environ if env is None else env).get(WARM_ENV) == "1"


def warm_import_s(env: Mapping[str, str] | None = None) -> float | None:
    """What the server's imports took (seconds, measured by the server), for a warm rank; None
    for a rank started cold. A cold rank pays about this much more before its first line."""
    env = os.environ if env is None else env
    if not started_warm(env) or IMPORT_ENV not in env:
        return None
    return float(env[IMPORT_ENV])


PRELOAD = (
    "torch",
    "torch.distributed",
    "deepspeed",
    "transformers",
    "transformers.modeling_utils",
    "peft",
    "submitit",
    "mlflow",  # the rank that logs imports it, and builds the SQL store (its alembic)
    "mlflow.store.tracking.sqlalchemy_store",
    "pipeline.job.entry",
    "pipeline.job.runner",
)
"""What every rank imports before its first line of work: the server imports it once."""

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGCONT)
READY_WAIT_S = 120.0  # a client waits this long for a server still importing, then runs cold
SHARED_WAIT_S = 5.0  # a shared server was ready when the sweep began: not there now, it is gone
POLL_S = 0.2


# --- the server -----------------------------------------------------------------------------


def native_threads() -> dict[int, str]:
    """This process's threads other than the calling one, from the kernel, with their state
    (proc(5): R running, S sleeping, D disk sleep, ...)."""
    me = threading_native_id()
    out = {}
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == me:
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
            out[int(tid)] = stat.rsplit(")", 1)[1].split()[0]
    return out


def threading_native_id() -> int:
    import threading

    return threading.get_native_id()


def preload(modules: Sequence[str]) -> list[str]:
    """Import `modules` by name; the ones that fail (an optional library absent) are skipped."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - an absent optional library: the rank imports it cold
            log.warning("warm: %s not preloaded: %s", name, e)
            missing.append(name)
    return missing


def fork_unsafe() -> str | None:
    """Why this process must not fork ranks, or None.

    A fork copies only the calling thread. Python threads (any but this one) could hold a lock
    the rank then waits for forever: none may exist. The libraries' own native helper threads
    (measured here: one of torch's after `import torch`, pyarrow's jemalloc background thread,
    one more after transformers' modeling_utils) sleep on a futex and own nothing the rank
    takes, as with PyTorch's fork-started DataLoader workers: they may exist if every one is
    asleep (state S) as the fork happens. CUDA must not be initialised (a forked child cannot
    use its parent's context)."""
    import threading

    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads after the imports (a fork copies only this one)"
    awake = {tid: st for tid, st in native_threads().items() if st != "S"}
    if awake:
        return f"native threads not asleep after the imports: {awake}"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialised by the imports (a forked child cannot use it)"
    return None


@dataclass
class _Rank:
    conn: socket.socket
    pid: int


@dataclass
class Server:
    path: Path
    imported_s: float
    """What its imports took, seconds: handed to every rank (IMPORT_ENV)."""
    idle_s: float = 600.0
    ranks: dict[int, _Rank] = field(default_factory=dict)
    parent: int = field(default_factory=os.getppid)
    """Its owner (the sweep): the server ends once it is no longer its parent process. Given by
    the owner (`--owner-pid`): read here after the imports, a parent killed during them would
    already be the re-parented one's, and the server would outlive it by `idle_s`."""

    def serve(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        listener.bind(str(tmp))
        listener.listen(64)
        os.replace(tmp, self.path)  # the socket appears ready, never half set up
        log.info("warm: serving %s (pid %d)", self.path, os.getpid())
        idle_since = time.monotonic()
        try:
            while True:
                self._reap()
                if self.ranks:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > self.idle_s or os.getppid() != self.parent:
                    return  # the sweep is gone, or has started nothing for a long time
                conns = [r.conn for r in self.ranks.values()]
                ready, _, _ = select.select([listener, *conns], [], [], POLL_S)
                for s in ready:
                    if s is listener:
                        self._accept(listener)
                    else:
                        self._client_gone(s)
        finally:
            listener.close()
            with contextlib.suppress(OSError):
                self.path.unlink()

    def _accept(self, listener: socket.socket) -> None:
        conn, _ = listener.accept()
        _, uid, _ = struct.unpack(
            "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        )
        if uid != os.getuid():
            log.warning("warm: refused a caller of uid %d", uid)
            conn.close()
            return
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError) as e:
            log.warning("warm: a bad request: %s", e)
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        why = fork_unsafe()
        if why is not None:  # a library started a thread since: this request runs cold
            log.warning("warm: not forking: %s", why)
            conn.close()
            for fd in fds:
                os.close(fd)
            return
        pid = os.fork()
        if pid == 0:  # the rank
            listener.close()
            for r in self.ranks.values():
                r.conn.close()
            conn.close()
            _become_rank(request, fds, self.imported_s)  # never returns
        for fd in fds:
            os.close(fd)
        conn.sendall(f"pid {pid}\n".encode())
        self.ranks[pid] = _Rank(conn, pid)

    def _reap(self) -> None:
        for pid in list(self.ranks):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rank = self.ranks.pop(pid)
                with contextlib.suppress(OSError):
                    rank.conn.sendall(f"exit {status}\n".encode())
                rank.conn.close()

    def _client_gone(self, conn: socket.socket) -> None:
        """The client's end closed (the controller killed it): its rank goes too."""
        data = b""
        with contextlib.suppress(OSError):
            data = conn.recv(64)
        if data:
            return  # clients send nothing after their request; ignore it
        for pid, rank in list(self.ranks.items()):
            if rank.conn is conn:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                self.ranks.pop(pid)
                conn.close()


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not msg.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise ValueError("the request ended early")
        msg += more
    if len(fds) != 3:
        raise ValueError(f"{len(fds)} file descriptors, not 3")
    return json.loads(msg), list(fds)


def _become_rank(request: dict, fds: list[int], imported_s: float) -> None:
    """In the forked child: take the client's streams, place and environment, then run the
    module as `python -m` would, and leave as the interpreter would (threads joined, atexit)."""
    code: int = 1
    try:
        _die_with_parent()
        log.handlers.clear()  # the server's own log line handler: the rank sets up its own
        log.propagate = True
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, io.TextIOWrapper):
                stream.reconfigure(line_buffering=True, write_through=True)  # python -u
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _client_sys_path(request["cwd"], request["env"].get("PYTHONPATH", ""))
        os.environ[WARM_ENV] = "1"
        os.environ[CLIENT_ENV] = str(request["client_pid"])
        os.environ[IMPORT_ENV] = f"{imported_s:.3f}"
        code = _run_module(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the rank's crash, printed as python would
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        code = _shutdown(code)
        os._exit(code)


def _client_sys_path(cwd: str, pythonpath: str) -> None:
    """sys.path as `python -m` in the client's place builds it: its working directory first
    (the server's own was), then its PYTHONPATH entries, then the rest (site-packages)."""
    ours = [p for p in pythonpath.split(os.pathsep) if p]
    rest = [p for p in sys.path[1:] if p not in ours]
    sys.path[:] = [cwd, *ours, *rest]


def _run_module(argv: Sequence[str]) -> int:
    import runpy

    module, rest = parse_python_argv(argv)
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


def _shutdown(code: int) -> int:
    """What the interpreter does at exit: join the non-daemon threads, run atexit's functions,
    flush the streams."""
    import atexit
    import threading

    try:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - at exit, as python: the code stands
        return code or 1
    return code


def _die_with_parent() -> None:
    """The kernel kills this rank if the server dies (prctl PR_SET_PDEATHSIG)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def parse_python_argv(argv: Sequence[str]) -> tuple[str, list[str]]:
    """`-u -m module args...` (the interpreter's options as submitit writes them) into the
    module and its arguments; anything else is refused."""
    args = list(argv)
    while args and args[0] in ("-u", "-B", "-s", "-E"):
        args.pop(0)
    if len(args) < 2 or args[0] != "-m":
        raise ValueError(f"not a `-m module` command line: {list(argv)}")
    return args[1], args[2:]


# --- the client -----------------------------------------------------------------------------


def run(path: Path, argv: Sequence[str], wait_s: float = READY_WAIT_S, server_pid: int | None = None) -> int:
    """Stand in for one rank: forked by the server when it is there, else run cold."""
    conn = _connect(path, wait_s, server_pid)
    if conn is None:
        return _run_cold(argv)
    pending: list[int] = []

    def _note(signum: int, frame: object) -> None:  # only sets a flag: forwarded below
        pending.append(signum)

    for sig in FORWARDED:
        signal.signal(sig, _note)
    request = {"argv": list(argv), "env": dict(os.environ), "cwd": os.getcwd(), "client_pid": os.getpid()}
    socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
    reader = conn.makefile("rb")
    pid = _expect(reader, "pid")
    if pid is None:
        print("warm: the server did not start the rank", file=sys.stderr)
        return 1
    while True:
        ready, _, _ = _select([conn], POLL_S)
        while pending:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, pending.pop(0))
        if ready:
            status = _expect(reader, "exit")
            if status is None:
                print("warm: the server ended before the rank", file=sys.stderr)
                return 1
            return _end_as(status)


def _select(socks: list[socket.socket], timeout: float) -> tuple[list, list, list]:
    try:
        return select.select(socks, [], [], timeout)
    except InterruptedError:  # a signal: forward it first
        return [], [], []


def _expect(reader: object, word: str) -> int | None:
    line = reader.readline()  # type: ignore[attr-defined]
    parts = line.decode().split()
    if len(parts) != 2 or parts[0] != word:
        return None
    return int(parts[1])


def _end_as(status: int) -> int:
    """Leave as the rank did: killed by the same signal, or with its exit code."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.waitstatus_to_exitcode(status)


def _connect(path: Path, wait_s: float, server_pid: int | None) -> socket.socket | None:
    """A connection to the server; None when it is not ready within `wait_s`, or has gone."""
    deadline = time.monotonic() + wait_s
    while True:
        if path.exists():
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(str(path))
                return conn
            except OSError:
                conn.close()
        if server_pid is not None and not alive(server_pid):
            return None
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """The process exists and has not ended (a zombie, not yet reaped by its parent, has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _run_cold(argv: Sequence[str]) -> NoReturn:
    """Become the rank as submitit would have started it (this interpreter, these arguments)."""
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, *argv])


# --- the launcher's side ---------------------------------------------------------------------


def shared_server(env: Mapping[str, str] | None = None) -> Path | None:
    """The running server that SHARED_ENV names, when it is one this user may trust with a
    rank's environment (its secrets included): a socket owned by this user, in a directory
    owned by this user that no one else can enter. None (with a warning for a bad one) else."""
    raw = (os.environ if env is None else env).get(SHARED_ENV, "")
    if not raw:
        return None
    path = Path(raw)
    try:
        sock, home = path.stat(), path.parent.stat()
    except OSError as e:
        log.warning("warm: %s=%s is not there (%s): this sweep starts its own server", SHARED_ENV, raw, e)
        return None
    me = os.getuid()
    if not stat.S_ISSOCK(sock.st_mode) or sock.st_uid != me or home.st_uid != me or home.st_mode & 0o077:
        log.warning(
            "warm: %s=%s is not a socket of this user in a directory only this user can enter: "
            "this sweep starts its own server",
            SHARED_ENV,
            raw,
        )
        return None
    return path


@contextlib.contextmanager
def warm_ranks(folder: Path, modules: Sequence[str] = PRELOAD) -> Iterator[str]:
    """Start a server for the ranks started in this block; yield the `python` command that
    submitit's LocalExecutor is to use. The server ends with the block (its ranks with it).
    With SHARED_ENV naming a running server, that one forks the ranks and nothing is started.

    Its socket lives in a fresh 0700 directory of the temporary folder: a Unix socket's path is
    at most 107 bytes (a sweep folder's is often longer), and no other user may reach a server
    that forks whatever it is asked to (it also checks each caller's uid, SO_PEERCRED)."""
    shared = shared_server()
    if shared is not None:
        log.debug("warm: the ranks are forked by the running server %s", shared)
        yield shlex.join(
            [sys.executable, "-m", __name__, "--socket", str(shared), "--wait-s", str(SHARED_WAIT_S), "run"]
        )
        return
    folder.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="sq-warm-"))
    path = home / "s"
    logfile = open(folder / "warm.log", "ab")  # noqa: SIM115 - the server's own log, closed below
    proc = start_server(path, modules, logfile)
    try:
        client = [sys.executable, "-m", __name__, "--socket", str(path), "--server-pid", str(proc.pid), "run"]
        yield shlex.join(client)
    finally:
        stop_server(proc)
        logfile.close()
        shutil.rmtree(home, ignore_errors=True)


def start_server(
    path: Path, modules: Sequence[str], logfile: IO[bytes], extra: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    """A server on `path` that preloads `modules`, its output to `logfile`; `extra`: more of
    main()'s options (`--idle-s`). In its own session: a Ctrl-C or hang-up of the terminal
    reaches each rank once, through its client (in the controller's process group, where a cold
    rank would be), never the server."""
    cmd = [sys.executable, "-m", __name__, "--socket", str(path), "--owner-pid", str(os.getpid()), *extra]
    cmd += ["serve", *modules]
    return subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=logfile, stderr=logfile, start_new_session=True
    )


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (its ranks die with it), then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """`--socket S [--server-pid N] run <python's arguments>` (a client) or `--socket S
    [--owner-pid N] serve <modules>` (the server). The client's arguments are python's own
    (`-u -m ...`), so they are split off before argparse reads the rest."""
    parent = os.getppid()  # before the imports: the owner may die during them
    args = list(sys.argv[1:] if argv is None else argv)
    if "run" in args:
        at = args.index("run")
        args, rank_argv = args[:at], args[at + 1 :]
    else:
        rank_argv = None
    parser = argparse.ArgumentParser(prog="python -m pipeline.sched.warm", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--server-pid", type=int, default=None)
    parser.add_argument("--idle-s", type=float, default=600.0)
    parser.add_argument(
        "--owner-pid", type=int, default=None, help="the server ends when this parent is gone"
    )
    parser.add_argument(
        "--wait-s", type=float, default=READY_WAIT_S, help="a client: how long to wait for the server"
    )
    parser.add_argument("what", nargs="?", choices=("serve",))
    parser.add_argument("modules", nargs="*")
    opts = parser.parse_args(args)
    if rank_argv is not None:
        return run(opts.socket, rank_argv, wait_s=opts.wait_s, server_pid=opts.server_pid)
    # a drill's USR1/USR2 are the ranks' (their clients forward them); one that reaches the
    # server (ranks started by hand: the local preempt trigger signals every child of their
    # parent, the server among them) must not end it, and with it every rank it serves. A
    # forked rank has them back at their defaults (FORWARDED).
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    started = time.monotonic()
    missing = preload(opts.modules)
    why = fork_unsafe()
    if why is not None:
        log.warning("warm: not serving: %s; the ranks start cold", why)
        return 0
    took = time.monotonic() - started
    log.info("warm: %d modules imported in %.1f s (%d missing)", len(opts.modules), took, len(missing))
    owner = parent if opts.owner_pid is None else opts.owner_pid
    Server(opts.socket, imported_s=took, idle_s=opts.idle_s, parent=owner).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
