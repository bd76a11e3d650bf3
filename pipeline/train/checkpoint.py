"""Checkpoints that are never half taken for good.

A save goes to `<root>/.staging/<tag>/` on every rank. The step loop waits only while the
state is copied to host memory (a copy of every tensor; pinned memory on a GPU); each rank then
writes its files in background threads, O_DIRECT by default, through a CRC-32 computed as the
bytes pass (no read-back), and fsyncs each, while training goes on. A commit thread waits for
all of them, the ranks agree that every file is durable (over a gloo group of their own, so
the agreement never runs against the training's collectives), and rank 0 then writes
`manifest.json` (every file's size and CRC-32), renames the folder into `<root>/<tag>` and
moves the `latest` pointer last (write to a temporary file, fsync, rename). At most one save is
in flight: the next save, a stop and the end of training wait for it (`wait()`), and a failed
commit is raised there. An interrupted save therefore leaves the previous checkpoint
the one that is loaded. Checkpoints past the last K are renamed into `<root>/.trash` (atomic,
so a half-deleted checkpoint is never a candidate) and deleted in the background; the next
save waits for that deletion, so the space is back before it writes. On load the manifest is
checked; a missing or truncated file falls back to the previous good checkpoint, and the
fallback is counted.
"""

from __future__ import annotations

import contextlib
import copy as copy_module
import errno
import fcntl
import json
import logging
import mmap
import os
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn, cast

from pipeline.config.schema import CHECKPOINT_IO
from pipeline.files import fsync_dir, write_atomic

try:  # ISA-L's CRC-32, the same value as zlib's: 2.5-12 GB/s here, the system zlib (1.2.13) 0.6-1.9
    from isal.isal_zlib import crc32
except ImportError:  # a platform without its wheel: correct, and the hash caps the write again
    from zlib import crc32

# the job log's `[checkpoint] ...` lines (pipeline.logs renders the second part of the name)
log = logging.getLogger("pipeline.checkpoint")

MANIFEST = "manifest.json"
LATEST = "latest"
STAGING = ".staging"
TRASH = ".trash"
_CHUNK = 8 << 20


class CheckpointSaveError(RuntimeError):
    """A save failed part-way; the previous checkpoint is untouched and still the latest."""


@dataclass
class SaveStats:
    step: int
    tag: str
    seconds: float  # start of the save to its commit (files durable, every rank past it)
    bytes: int
    stall_s: float | None = None  # the part that holds the loop: the previous save + the host copy
    blocking: bool = True  # the loop waited for the commit (a round trip, a stop): all of `seconds`
    # seconds of each stage, in order, on this rank (docs/design.md, "Checkpoint"): previous
    # (the save in flight), staging (folder, barrier), hand_over (DeepSpeed's save_checkpoint;
    # the files are already being written), host_copy (background saves), write (serialise,
    # CRC-32, write, fsync: waiting for this rank's files), agree (the ranks' manifest shares),
    # commit (manifest, rename, `latest`, prune, the last barrier)
    stages: dict[str, float] = field(default_factory=dict)

    @property
    def stalled_s(self) -> float:
        """The part of the save that holds the step loop (None recorded: all of it)."""
        return self.seconds if self.stall_s is None else self.stall_s

    @property
    def waited_s(self) -> float:
        """What the step loop waited for this save: all of it when blocking."""
        return self.seconds if self.blocking else self.stalled_s

    @property
    def gbps(self) -> float:
        return self.bytes / 1e9 / self.seconds if self.seconds > 0 else 0.0


@dataclass
class LoadStats:
    step: int
    tag: str
    seconds: float
    bytes: int
    fallbacks: int  # newer checkpoints skipped because their manifest did not check out
    client_state: dict[str, Any]

    @property
    def gbps(self) -> float:
        return self.bytes / 1e9 / self.seconds if self.seconds > 0 else 0.0


def tag_for(step: int) -> str:
    return f"step{step:08d}"


def step_of(tag: str) -> int:
    return int(tag.removeprefix("step"))


def hash_file(path: Path, fsync: bool = False) -> str:
    """CRC-32 of the file (ISA-L's: far faster than sha256 or the system zlib, so the check
    does not halve the checkpoint's bandwidth); with fsync, the same pass makes the file durable."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = crc32(chunk, crc)
        if fsync:
            os.fsync(f.fileno())
    return f"{crc:08x}"


_ALIGN = 4096  # O_DIRECT: buffer address, length and file offset are multiples of this
# 8 MiB writes: on this VM's disk one to three concurrent O_DIRECT streams of 8 MiB writes
# reach the same total (1.3-1.9 GB/s); 32 and 64 MiB writes lost up to half of it once two or
# three streams (both ranks' files) ran at once (docs/design.md, "Checkpoint").
_DIRECT_BUFFER = 8 << 20
_DEPTH = 3  # buffers per file: one being filled (copy + CRC-32), up to two queued to the disk


class BufferPool:
    """Page-aligned buffers of _DIRECT_BUFFER bytes, kept for the next file and the next save:
    a fresh anonymous mapping pays a page fault per 4 KiB on first touch, measured here at
    0.2 GB/s, slower than the disk."""

    def __init__(self) -> None:
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self, n: int) -> list[mmap.mmap]:
        with self._lock:
            got, self._free = self._free[:n], self._free[n:]
        return got + [mmap.mmap(-1, _DIRECT_BUFFER) for _ in range(n - len(got))]

    def give(self, buffers: list[mmap.mmap]) -> None:
        with self._lock:
            self._free.extend(buffers)


def _write_all(fd: int, view: memoryview) -> None:
    done = 0
    while done < len(view):  # a write may take less than it is given
        try:
            done += os.write(fd, view[done:])
        except OSError as e:
            if e.errno != errno.EINVAL or not _drop_direct(fd):
                raise
            # O_DIRECT refused this write: a filesystem that takes O_DIRECT only at open, or a
            # write that a file-size limit or quota cut to an unaligned length. Buffered, the
            # retry completes or reports the real error (EFBIG, ENOSPC, EDQUOT).
            continue
        if done < len(view) and done % _ALIGN:  # a short write leaves the rest unaligned
            _drop_direct(fd)


def _drop_direct(fd: int) -> bool:
    """Clear O_DIRECT on fd; False if it was not set."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    direct = getattr(os, "O_DIRECT", 0)
    if not flags & direct:
        return False
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~direct)
    return True


class CheckpointFile:
    """A write-only binary file for one checkpoint file. It computes the CRC-32 of every byte
    as it passes: torch.save writes each record of its zip archive with one `write` of a
    memoryview, so the hash is one pass over memory that is hot anyway, with no read-back. It
    has no `fileno`, so torch never writes around it.

    direct=True opens it O_DIRECT and writes through _DEPTH page-aligned buffers of 8 MiB
    (reused from `pool`): one is filled (copy + CRC) while a thread writes the others to the
    disk, in order. A multi-GB checkpoint then
    neither needs fresh page-cache pages (which cost more than the disk on some VMs) nor evicts
    the job's working set. The last buffer is padded to the alignment and the file truncated
    back to its size; close fsyncs it. Where the filesystem refuses O_DIRECT (older tmpfs, some FUSE and network
    mounts) it writes buffered; `direct` says which it got."""

    def __init__(self, path: Path, direct: bool, pool: BufferPool | None = None) -> None:
        self.nbytes = 0
        self._crc = 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        self.direct = direct and hasattr(os, "O_DIRECT")
        if self.direct:
            try:
                self._fd = os.open(path, flags | os.O_DIRECT, 0o644)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self.direct = False
        if not self.direct:
            self._fd = os.open(path, flags, 0o644)
            return
        self._pool = pool or BufferPool()
        self._buffers = self._pool.take(_DEPTH)  # page-aligned
        self._current, self._filled = 0, 0
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-direct")  # in order
        self._in_flight: deque[Future[None]] = deque()

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if not self.direct:
            self._crc = crc32(view, self._crc)
            _write_all(self._fd, view)
        else:
            pos = 0
            while pos < len(view):  # hash and copy a buffer's worth while the other is written
                n = min(len(view) - pos, _DIRECT_BUFFER - self._filled)
                piece = view[pos : pos + n]
                self._crc = crc32(piece, self._crc)
                self._buffers[self._current][self._filled : self._filled + n] = piece
                self._filled += n
                pos += n
                if self._filled == _DIRECT_BUFFER:
                    self._hand_over(_DIRECT_BUFFER)
        self.nbytes += len(view)
        return len(view)

    def _hand_over(self, length: int) -> None:
        """Queue the current buffer to the disk and go on filling the next one, once the
        disk is done with it (it was queued _DEPTH - 1 hand-overs ago)."""
        view = memoryview(self._buffers[self._current])[:length]
        self._in_flight.append(self._writer.submit(_write_all, self._fd, view))
        self._current, self._filled = (self._current + 1) % _DEPTH, 0
        if len(self._in_flight) == _DEPTH:
            self._in_flight.popleft().result()

    def _wait(self) -> None:
        while self._in_flight:
            self._in_flight.popleft().result()

    def tell(self) -> int:
        return self.nbytes

    def flush(self) -> None:
        pass  # what is buffered goes out on close

    def close(self, complete: bool = True) -> None:
        """Write what is left and close; complete=False (the save failed) just closes."""
        try:
            if self.direct:
                try:
                    if complete and self._filled:
                        padded = self._filled + (-self._filled) % _ALIGN
                        self._buffers[self._current][self._filled : padded] = bytes(padded - self._filled)
                        self._hand_over(padded)
                    self._wait()
                except OSError:
                    if complete:
                        raise  # else the save's own error is the one to report
                finally:
                    self._writer.shutdown()
                    if complete:
                        self._pool.give(self._buffers)  # a failed write's traceback may still
                    # hold a view of a buffer: those of a failed file are left to the collector
                if complete:
                    os.ftruncate(self._fd, self.nbytes)
            if complete:
                os.fsync(self._fd)  # durable before the manifest names it
        finally:
            os.close(self._fd)

    @property
    def crc32(self) -> str:
        return f"{self._crc:08x}"


class DurableWriter:
    """Wraps DeepSpeed's TorchCheckpointEngine (`engine.checkpoint_engine`). A synchronous
    save (`defer` unset) serialises the live state: the loop waits for its commit, so nothing
    changes it meanwhile, and a copy to host memory first would be one more pass over every
    byte on the critical path. With `defer` set (a background save), `save` only keeps the
    state dict and `copy_to_host()` (the manager's commit thread) copies it later (every tensor
    detached and copied; pinned on a GPU): the manager holds the next optimizer update until
    the copy is done (`CheckpointManager.before_update`); the host buffers are kept and reused
    by the next save of the same file (one save is in flight at most, so they are free again
    by then). Each file is serialized in a background thread through a CheckpointFile (CRC-32
    as the bytes pass, fsynced on close), so a rank that writes two files (ZeRO-1/2 rank 0: the
    model and its optimizer shard) writes them at once. `collect()` waits for every file to be
    durable and returns what was written (raising the first error). Everything else (load,
    commit, ...) is DeepSpeed's."""

    def __init__(self, inner: Any, direct: bool) -> None:
        self.inner, self.direct = inner, direct
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ckpt-save")
        self._pending: dict[str, Future[dict[str, Any]]] = {}
        self._host: dict[str, list[Any]] = {}  # file name -> its host buffers, in traversal order
        self.defer = False  # save() only keeps the state; copy_to_host() copies it
        self._staged: list[tuple[Any, str]] = []
        self._buffers = BufferPool()  # the O_DIRECT buffers, kept from file to file

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def save(self, state_dict: Any, path: str) -> None:
        if self.defer:  # copied by `copy_to_host`, before the optimizer next changes the state
            self._staged.append((state_dict, str(path)))
            return
        self._pending[str(path)] = self._pool.submit(self._write, state_dict, Path(path))

    def discard_staged(self) -> None:
        self._staged = []

    def copy_to_host(self) -> None:
        """Copy what deferred saves handed over, then write it in the background."""
        staged, self._staged = self._staged, []
        for state_dict, path in staged:
            snapshot = self.to_host(state_dict, Path(path).name)
            self._pending[path] = self._pool.submit(self._write, snapshot, Path(path))

    def to_host(self, state: Any, name: str) -> Any:
        """`state` with every tensor replaced by a host copy (a tensor met twice is copied
        once, so shared tensors stay shared). Buffers of the last save of `name` are reused."""
        import torch

        old = self._host.get(name, [])
        new: list[Any] = []
        memo: dict[int, Any] = {}
        on_gpu = False

        def copy(t: torch.Tensor) -> torch.Tensor:
            nonlocal on_gpu
            t = t.detach()
            i = len(new)
            buf = old[i] if i < len(old) else None
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype or buf.stride() != t.stride():
                pin = t.device.type == "cuda"
                buf = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu", pin_memory=pin)
            on_gpu = on_gpu or t.device.type != "cpu"
            buf.copy_(t, non_blocking=t.device.type == "cuda")
            new.append(buf)
            return buf

        def walk(obj: Any) -> Any:
            if isinstance(obj, torch.Tensor):
                if id(obj) not in memo:
                    memo[id(obj)] = copy(obj)
                return memo[id(obj)]
            if isinstance(obj, dict):
                out = copy_module.copy(obj)  # keeps the mapping's type (OrderedDict, ...)
                for k, v in obj.items():
                    out[k] = walk(v)
                return out
            if isinstance(obj, list):
                return [walk(v) for v in obj]
            if type(obj) is tuple:
                return tuple(walk(v) for v in obj)
            if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
                return type(obj)(*(walk(v) for v in obj))
            return obj  # str, numbers, torch.Size, config objects: nothing that training changes

        snapshot = walk(state)
        if on_gpu:
            torch.cuda.synchronize()  # the non-blocking device-to-host copies are done
        self._host[name] = new
        return snapshot

    def _write(self, state_dict: Any, path: Path) -> dict[str, Any]:
        import torch

        out = CheckpointFile(path, self.direct, self._buffers)
        try:
            torch.save(
                state_dict,
                cast(IO[bytes], out),
                _use_new_zipfile_serialization=self.inner.zipfile_serialization,
            )
        except BaseException:
            out.close(complete=False)
            raise
        out.close()  # fsynced
        return {"bytes": out.nbytes, "crc32": out.crc32}

    def collect(self) -> dict[str, dict[str, Any]]:
        """{path: {"bytes", "crc32"}} of every file saved since the last call, once durable.
        Waits for all of them even when one failed, then raises that failure."""
        self.copy_to_host()
        pending, self._pending = self._pending, {}
        wait(pending.values())
        return {path: job.result() for path, job in pending.items()}


def durable_writer(engine: Any, direct: bool) -> DurableWriter | None:
    """Put a DurableWriter in front of the engine's checkpoint engine, once; None when the
    engine writes some other way (DeepSpeed's decoupled or fast writers), whose files the
    manifest pass then reads back and fsyncs itself."""
    inner = getattr(engine, "checkpoint_engine", None)
    if isinstance(inner, DurableWriter):
        return inner
    if type(inner).__name__ != "TorchCheckpointEngine":
        return None
    engine.checkpoint_engine = DurableWriter(inner, direct)
    return engine.checkpoint_engine


def owner_rank(name: str, world: int) -> int:
    """Which rank fsyncs and hashes a file: the rank whose ZeRO shard it is, else rank 0."""
    for r in range(world):
        if f"zero_pp_rank_{r}_" in name:
            return r
    return 0


def check_manifest(folder: Path, rank: int = 0, world: int = 1, hashes: bool = True) -> str | None:
    """None if this rank's share of the files matches the manifest, else what is wrong."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        return f"no readable manifest in {folder}: {e}"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(
        isinstance(e, dict) and isinstance(e.get("bytes"), int) and isinstance(e.get("crc32"), str)
        for e in files.values()
    ):
        return f"the manifest in {folder} has no table of files with their bytes and CRC-32"
    if not any(name.endswith("model_states.pt") for name in files):
        # DeepSpeed cannot load a checkpoint without its model states (a bare AssertionError)
        return f"the manifest in {folder} lists no model states file ({len(files)} file(s) listed)"
    for name, entry in sorted(files.items()):
        if owner_rank(name, world) != rank:
            continue
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != entry["bytes"]:
            return f"{path} has {size} bytes, the manifest says {entry['bytes']}"
        if hashes and hash_file(path) != entry["crc32"]:
            return f"{path} does not match its CRC-32 in the manifest"
    return None


def _skip_torch_record_crc() -> None:
    """torch.save computes a CRC-32 of every zip record by default, which caps a save at about
    0.5 GB/s here (5 GB/s without). Our manifest already holds a CRC-32 of every file and is
    checked on every load, so the per-record one adds nothing but time."""
    import torch.serialization

    if hasattr(torch.serialization, "set_crc32_options"):  # torch >= 2.5
        torch.serialization.set_crc32_options(False)


class _Laps:
    """Times the stages of a save: each call records the time since the previous one."""

    def __init__(self, t0: float, stages: dict[str, float] | None = None) -> None:
        self.last, self.stages = t0, stages if stages is not None else {}

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages[stage] = now - self.last
        self.last = now


class CheckpointManager:
    """Decides when to save, saves atomically, keeps the last K, loads with fallback.

    `comm` is the collective interface (barrier, all_ok, gather_obj, broadcast_obj): the
    trainer's DistComm, over torch.distributed. `commit_comm`, the same interface over a
    process group of its own, lets a save's agreement and commit run in a background thread
    while training goes on (`save(..., blocking=False)`); without it every save commits before
    it returns.
    """

    def __init__(
        self,
        root: Path,
        interval: int,
        keep_last: int,
        rank: int,
        world: int,
        comm: Any,
        io: str = "direct",
        commit_comm: Any = None,
    ) -> None:
        """io: direct (O_DIRECT through a DurableWriter), buffered (a DurableWriter through the
        page cache) or deepspeed (DeepSpeed's checkpoint engine as configured; the manifest
        pass then reads every file back to hash and fsync it)."""
        _skip_torch_record_crc()
        if io not in CHECKPOINT_IO:
            raise ValueError(f"checkpoint io {io!r}: expected one of {', '.join(CHECKPOINT_IO)}")
        self.root, self.interval, self.keep_last = Path(root), interval, keep_last
        self.io = io
        self.rank, self.world, self.comm = rank, world, comm
        self.commit_comm = commit_comm
        self.saves: list[SaveStats] = []  # committed saves
        self.skipped: list[tuple[str, str]] = []
        """The last load's checkpoints that failed verification, newest first: (tag, why)."""
        # adapter methods: save only the trainable parameters (DeepSpeed's exclude_frozen_parameters)
        # and load them into a model whose frozen base was rebuilt (set by the Trainer)
        self.adapters_only = False
        self._trash_thread: threading.Thread | None = None
        self._in_flight: threading.Thread | None = None  # the commit of a background save
        self._copied: threading.Event | None = None  # set once its state is on the host
        self._in_flight_stats: SaveStats | None = None
        self._failure: CheckpointSaveError | None = None  # what that commit raised
        if rank == 0:  # what a killed attempt left behind: staged saves, undeleted checkpoints
            if (self.root / STAGING).is_dir():
                (self.root / TRASH).mkdir(exist_ok=True)
                os.replace(self.root / STAGING, self.root / TRASH / f"staging.{uuid.uuid4().hex[:8]}")
            self._empty_trash()

    def should_save(self, step: int, last_step: bool) -> bool:
        return last_step or (self.interval > 0 and step % self.interval == 0)

    def tags(self) -> list[str]:
        """Committed checkpoints, newest first."""
        if not self.root.is_dir():
            return []
        found = [p.name for p in self.root.iterdir() if p.is_dir() and p.name.startswith("step")]
        return sorted(found, key=step_of, reverse=True)

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def wait(self) -> SaveStats | None:
        """Wait for the save in flight, if any, to be committed; its stats (None if none was in
        flight). Raises CheckpointSaveError if it failed (on any rank: all of them raise)."""
        thread, self._in_flight = self._in_flight, None
        if thread is None:
            return None
        thread.join()
        self._copied = self._in_flight_stats = None
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure
        return self.saves[-1]

    def before_update(self) -> None:
        """Called by the loop before anything changes the model or optimizer state (the
        optimizer update): waits until the state of the save in flight is on the host. The
        wait counts in that save's stall_s."""
        copied, stats = self._copied, self._in_flight_stats
        if copied is None or stats is None or copied.is_set():
            return
        t0 = time.perf_counter()
        copied.wait()
        stats.stall_s = (stats.stall_s or 0.0) + time.perf_counter() - t0

    def save(self, engine: Any, step: int, client_state: dict[str, Any], blocking: bool = True) -> SaveStats:
        """Save `step`. The loop waits for the save in flight; blocking (or without a
        commit_comm) it waits for the state to be copied to host memory and for the commit.
        Non-blocking, DeepSpeed hands the state over and save returns: the copy to the host
        goes on in the commit thread while the loop runs the next forward and backward, and
        `before_update()` holds the next optimizer update until it is done; then the files are
        written and committed. The returned stats are completed (seconds, bytes, stall_s) and
        appended to `saves` (and returned by `wait()`) once the commit is done."""
        t0 = time.perf_counter()
        self.wait()  # at most one save in flight: the previous one is committed (or raises)
        lap = _Laps(t0)
        lap("previous")
        tag = tag_for(step)
        staging_root = self.root / STAGING
        if self.rank == 0:
            self._wait_for_trash()  # the space of the checkpoints pruned last time is back
            shutil.rmtree(staging_root / tag, ignore_errors=True)
            staging_root.mkdir(parents=True, exist_ok=True)
        self.comm.barrier()
        lap("staging")
        background = not blocking and self.commit_comm is not None
        writer, error = self._hand_over(engine, staging_root, tag, client_state, background)
        lap("hand_over")
        stats = SaveStats(step, tag, 0.0, 0, stall_s=time.perf_counter() - t0, blocking=not background)
        stats.stages = lap.stages
        if not background:
            return self._commit(self.comm, staging_root / tag, writer, error, t0, stats)
        self._commit_in_background(staging_root / tag, writer, error, t0, stats, lap)
        return stats

    def _hand_over(
        self, engine: Any, staging_root: Path, tag: str, client_state: dict[str, Any], background: bool
    ) -> tuple[DurableWriter | None, Exception | None]:
        """DeepSpeed's save_checkpoint into the staging folder, through this manager's durable
        writer (deferred: the copy to the host happens in the commit thread). A full disk, a
        quota, an I/O error is returned, not raised: the ranks agree on it at the commit and
        the previous checkpoint stays."""
        writer = None
        try:
            writer = durable_writer(engine, self.io == "direct") if self.io != "deepspeed" else None
            if writer is not None:
                writer.defer = background
            try:
                engine.save_checkpoint(
                    str(staging_root),
                    tag=tag,
                    client_state=client_state,
                    save_latest=False,
                    exclude_frozen_parameters=self.adapters_only,
                )
            finally:
                if writer is not None:
                    writer.defer = False
        except Exception as e:
            return writer, e
        return writer, None

    def _commit_in_background(
        self,
        folder: Path,
        writer: DurableWriter | None,
        error: Exception | None,
        t0: float,
        stats: SaveStats,
        lap: _Laps,
    ) -> None:
        """The commit thread: copy the state to the host (then the loop may update it), write,
        agree and commit over commit_comm. Its failure is raised by the next `wait()`."""
        copied = threading.Event()

        def commit() -> None:
            nonlocal error
            try:
                if writer is not None and error is None:
                    try:
                        writer.copy_to_host()
                    except Exception as e:
                        error = e
                lap("host_copy")
                copied.set()
                self._commit(self.commit_comm, folder, writer, error, t0, stats)
            except CheckpointSaveError as e:
                self._failure = e
            except BaseException as e:  # a collective that broke (a peer died): the save failed
                self._failure = CheckpointSaveError(f"committing checkpoint {stats.tag} failed: {e}")
            finally:
                copied.set()

        self._copied, self._in_flight_stats = copied, stats
        self._in_flight = threading.Thread(target=commit, name="ckpt-commit", daemon=True)
        self._in_flight.start()

    def _commit(
        self,
        comm: Any,
        folder: Path,
        writer: DurableWriter | None,
        error: Exception | None,
        t0: float,
        stats: SaveStats,
    ) -> SaveStats:
        """Wait for this rank's files, agree with the other ranks, and (rank 0) commit; fills
        in `stats` and appends it to `saves`."""
        lap = _Laps(time.perf_counter(), stats.stages)
        mine, error = self._written(folder, writer, error)
        lap("write")
        files = None
        if comm.all_ok(error is None):
            files, error = self._complete_manifest(folder, mine, comm)
        lap("agree")
        if files is None:
            self._fail(comm, folder, stats.tag, error)
        published: Exception | None = None
        if self.rank == 0:
            try:
                self._publish(folder, stats, files)
            except OSError as e:  # a full disk as the manifest or `latest` is written
                published = e
                self._unpublish(folder, stats.tag)
        if not comm.all_ok(published is None):  # every rank stops now, none waits on a dead peer
            self._fail(comm, folder, stats.tag, published)
        if self.rank == 0:
            self._prune()  # committed: the retention
        lap("commit")
        stats.seconds, stats.bytes = time.perf_counter() - t0, sum(e["bytes"] for e in files.values())
        self.saves.append(stats)
        return stats

    def _written(
        self, folder: Path, writer: DurableWriter | None, error: Exception | None
    ) -> tuple[dict[str, Any], Exception | None]:
        """The files this rank's writer wrote into `folder` (name -> size and CRC-32), once
        they are on disk; after a failed hand-over, nothing (and nothing still writing)."""
        if error is not None:
            if writer is not None:
                writer.discard_staged()
                with contextlib.suppress(Exception):
                    writer.collect()  # nothing of this save may still be writing
            return {}, error
        try:
            written = writer.collect() if writer else {}
        except Exception as e:
            return {}, e
        return {Path(p).name: e for p, e in written.items() if Path(p).parent == folder}, None

    def _fail(self, comm: Any, folder: Path, tag: str, error: Exception | None) -> NoReturn:
        """A rank failed to save (every rank calls this, after agreeing so): nothing is
        committed, rank 0 removes the staged folder (its space is back for the outcome), and
        each rank raises with the cause: its own, else the first failed rank's."""
        own = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}" if error else None
        causes = [c for c in comm.gather_obj(own) if c]
        if self.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
        kept = self.tags()[0] if self.tags() else "none"
        why = own or (f"on another rank: {causes[0]}" if causes else "on another rank")
        raise CheckpointSaveError(
            f"saving checkpoint {tag} failed ({why}); nothing was committed, the latest good checkpoint is still {kept}"
        ) from error

    def _publish(self, folder: Path, stats: SaveStats, files: dict[str, Any]) -> None:
        """Rank 0: the manifest, then the staged folder renamed into place, then `latest`;
        each step durable before the next (the retention follows once every rank agreed)."""
        manifest = {
            "tag": stats.tag,
            "step": stats.step,
            "world_size": self.world,
            "files": files,
            "time": time.time(),
        }
        write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1))
        fsync_dir(folder)
        final = self.root / stats.tag
        if final.exists():  # a re-save of the same step (e.g. after a resume): replace it
            self._discard(stats.tag)
        os.replace(folder, final)
        fsync_dir(self.root)
        write_atomic(self.root / LATEST, stats.tag)
        for extra in folder.parent.iterdir():  # DeepSpeed's zero_to_fp32.py: next to `latest`
            if extra.is_file():
                os.replace(extra, self.root / extra.name)

    def _unpublish(self, folder: Path, tag: str) -> None:
        """Rank 0, after a failed publish: the staged folder, or the renamed one that `latest`
        does not name yet, removed (their space is back); `latest` still names the previous."""
        shutil.rmtree(folder, ignore_errors=True)
        latest = self.root / LATEST
        if (self.root / tag).is_dir() and (not latest.is_file() or latest.read_text().strip() != tag):
            shutil.rmtree(self.root / tag, ignore_errors=True)

    def _complete_manifest(
        self, folder: Path, mine: dict[str, Any], comm: Any
    ) -> tuple[dict[str, Any] | None, Exception | None]:
        """Every file of the staged checkpoint with its size and CRC-32: what each rank wrote
        through its DurableWriter, and the rest (files DeepSpeed wrote some other way) read
        back, hashed and fsynced by the rank that owns them. (None, this rank's error or
        None) if that failed on any rank."""
        files: dict[str, Any] = {}
        for share in comm.gather_obj(mine):
            files.update(share)
        rest: dict[str, Any] = {}
        problem: Exception | None = None
        try:
            for p in sorted(folder.iterdir()):
                if p.is_file() and p.name not in files and owner_rank(p.name, self.world) == self.rank:
                    rest[p.name] = {"bytes": p.stat().st_size, "crc32": hash_file(p, fsync=True)}
        except OSError as e:
            problem = e
        if not comm.all_ok(problem is None):
            return None, problem
        for share in comm.gather_obj(rest):
            files.update(share)
        return dict(sorted(files.items())), None

    def _discard(self, tag: str) -> None:
        """Take a committed checkpoint out of the candidates at once (a rename), and leave its
        deletion to a background thread."""
        trash = self.root / TRASH
        trash.mkdir(exist_ok=True)
        os.replace(self.root / tag, trash / f"{tag}.{uuid.uuid4().hex[:8]}")

    def _prune(self) -> None:
        for tag in self.tags()[self.keep_last :]:
            self._discard(tag)
        self._empty_trash()

    def _empty_trash(self) -> None:
        """Delete `.trash` (and any staging left by a killed save) in the background: deleting
        a large checkpoint takes a while on a discard-mounted disk, and no step needs to wait
        for it. Not a daemon thread, so a normal exit finishes the job; what a hard exit
        leaves is deleted by the next attempt."""
        trash = self.root / TRASH
        if not trash.is_dir():
            return
        self._wait_for_trash()
        self._trash_thread = threading.Thread(
            target=shutil.rmtree,
            args=(trash,),
            kwargs={"ignore_errors": True},
            name="ckpt-trash",
            daemon=False,  # also when started by the (daemon) commit thread, which it would inherit
        )
        self._trash_thread.start()

    def _wait_for_trash(self) -> None:
        if self._trash_thread is not None:
            self._trash_thread.join()
            self._trash_thread = None

    def candidates(self) -> Iterator[str]:
        """The `latest` pointer first, then every other committed tag, newest first."""
        seen: set[str] = set()
        latest = self.root / LATEST
        if latest.is_file():
            tag = latest.read_text().strip()
            seen.add(tag)
            yield tag
        for tag in self.tags():
            if tag not in seen:
                yield tag

    def load_latest(self, engine: Any) -> LoadStats | None:
        """Load the newest checkpoint whose manifest checks out on every rank; None if none.
        Every one skipped is in `skipped` (and counted in the LoadStats' fallbacks), and said
        in the log: a fallback, or that none was valid (`resume_note`)."""
        t0 = time.perf_counter()
        tags = self.comm.broadcast_obj(list(self.candidates()) if self.rank == 0 else None)
        self.skipped = []
        for tag in tags:
            folder = self.root / tag
            problem = (
                check_manifest(folder, self.rank, self.world) if folder.is_dir() else f"{folder} is gone"
            )
            if not self.comm.all_ok(problem is None):
                self.skipped.append((tag, problem or "it failed verification on another rank"))
                if problem:
                    log.warning("rank %d: skipping %s: %s", self.rank, tag, problem)
                continue
            _, client_state = engine.load_checkpoint(
                str(self.root),
                tag=tag,
                load_optimizer_states=True,
                load_lr_scheduler_states=True,
                load_module_strict=not self.adapters_only,  # adapters only: the frozen base is rebuilt
            )
            manifest = json.loads((folder / MANIFEST).read_text())
            nbytes = sum(e["bytes"] for e in manifest["files"].values())
            self.comm.barrier()
            load = LoadStats(
                step=step_of(tag),
                tag=tag,
                seconds=time.perf_counter() - t0,
                bytes=nbytes,
                fallbacks=len(self.skipped),
                client_state=client_state or {},
            )
            self._say_resume(load)
            return load
        self._say_resume(None)
        return None

    def resume_note(self, load: LoadStats | None) -> str:
        """One sentence when the load skipped a checkpoint ("" when it did not): a fallback to
        an older one, or none valid at all (the run starts from step 0)."""
        if not self.skipped:
            return ""
        n = len(self.skipped)
        why = "; ".join(f"{tag}: {problem}" for tag, problem in self.skipped[:3]) + ("; ..." if n > 3 else "")
        if load is None:
            return (
                f"no valid checkpoint to resume from: all {n} checkpoint(s) failed verification ({why}); "
                "training started again from step 0"
            )
        return (
            f"resumed from {load.tag} after skipping {n} newer checkpoint(s) that failed verification ({why})"
        )

    def _say_resume(self, load: LoadStats | None) -> None:
        if self.rank == 0 and (note := self.resume_note(load)):
            (log.error if load is None else log.warning)("%s", note)
