"""MLflow tracking that loses nothing when MLflow is down.

Every event (metrics, params, tags, artifacts) is appended to a local ledger (JSON lines,
fsynced on flush) before it is sent. A background thread sends what is pending every few
seconds with `log_batch`, and a cursor file records how many ledger lines MLflow has. If the
server is unreachable the events stay in the ledger, and `qualify sync` replays them later,
creating the run if it never could be created. The step loop only appends to a list.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from pipeline.files import read_json, write_atomic, write_json
from pipeline.tracking import keys as K
from pipeline.tracking.redact import DEFAULT_SECRET_PATTERNS, adopt_credentials, redact_mapping
from pipeline.tracking.store import client_for, get_or_create_experiment

log = logging.getLogger(__name__)

_MAX_METRICS, _MAX_PARAMS, _MAX_TAGS = 1000, 100, 100  # MLflow's log_batch limits
PARAM_VALUE_MAX = 6000


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{'a': {'b': 1}} -> {'a.b': '1'}: the resolved config as MLflow params."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list | tuple) else str(v)
    return out


REOPENED = "RUNNING"
"""The status a ledger's end event sets on a run that goes on after it ended."""


class EventKind(str, Enum):
    """What one ledger line holds (its `k`)."""

    METRICS = "m"
    PARAMS = "p"
    TAGS = "t"
    ARTIFACT = "a"  # a file's path, sent as the run's artifact
    END = "e"  # the run's status: its end (FINISHED, FAILED, KILLED) or REOPENED


BATCHED = (EventKind.METRICS, EventKind.PARAMS, EventKind.TAGS)
"""The kinds that travel together in one `log_batch`."""


@dataclass(frozen=True)
class LedgerEvent:
    """One ledger line: {"k": kind, "d": data, "s": step, "t": Unix time in ms}."""

    kind: EventKind
    data: Any
    step: int | None
    time_ms: int

    def to_line(self) -> str:
        return json.dumps({"k": self.kind.value, "d": self.data, "s": self.step, "t": self.time_ms}) + "\n"

    @classmethod
    def from_line(cls, line: bytes | str) -> LedgerEvent:
        raw = json.loads(line)
        return cls(EventKind(raw["k"]), raw["d"], raw["s"], raw["t"])


class LedgerDir:
    """A ledger's folder (a point's `tracking/`, the sweep's `tracking/`): its file names."""

    LEDGER = "ledger.jsonl"  # the events, one JSON line each, appended and fsynced
    CURSOR = "ledger.synced"  # how many ledger lines MLflow has
    RUN_ID = "mlflow_run_id"  # the run's id, once MLflow created it
    META = "tracker.json"  # the experiment, run name, parent and URI `qualify sync` replays with

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def ledger(self) -> Path:
        return self.path / self.LEDGER

    @property
    def cursor(self) -> Path:
        return self.path / self.CURSOR

    @property
    def run_id(self) -> Path:
        return self.path / self.RUN_ID

    @property
    def meta(self) -> Path:
        return self.path / self.META

    def read_run_id(self) -> str | None:
        try:
            return self.run_id.read_text().strip() or None
        except OSError:
            return None

    def synced(self) -> int:
        """Ledger lines MLflow has (the cursor)."""
        return int(self.cursor.read_text() or 0) if self.cursor.exists() else 0

    def read_meta(self) -> dict[str, Any]:
        meta = read_json(self.meta)
        return dict(meta) if isinstance(meta, dict) else {}


class NullTracker:
    """What ranks other than 0 get: the same interface, doing nothing."""

    run_id: str | None = None

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        pass

    def log_artifact(self, path: Path) -> None:
        pass

    def flush(self) -> bool:
        return True

    def close(self, status: str = "FINISHED", terminate: bool = True) -> None:
        pass


class Tracker(NullTracker):
    """Logs into one MLflow run (created on the first attempt, reused by later ones).

    `parent_dir`: the ledger folder of the parent run (the sweep's), for a run whose parent
    could not be created yet (MLflow was down when the sweep started): the run is linked to
    the parent as soon as the parent exists. `offline`: write the ledger only, never try to
    send (the sweep, after its reachability probe failed). Param and tag values of keys that
    match `redact` are written as ***; a URI's user-info never reaches the ledger.
    """

    def __init__(
        self,
        uri: str,
        experiment: str,
        ledger_dir: Path,
        run_name: str,
        parent_run_id: str | None = None,
        run_id: str | None = None,
        flush_every_s: float = 5.0,
        background: bool = True,
        parent_dir: Path | None = None,
        offline: bool = False,
        redact: Sequence[str] = DEFAULT_SECRET_PATTERNS,
    ) -> None:
        self.uri, self.experiment, self.run_name, self.parent_run_id = (
            adopt_credentials(uri),  # user-info goes to MLflow's env vars, never to a file
            experiment,
            run_name,
            parent_run_id,
        )
        self.parent_dir = Path(parent_dir) if parent_dir else None
        self.offline = offline
        self.redact = tuple(redact)
        self.files = LedgerDir(ledger_dir)
        self.ledger_dir = self.files.path
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        self.ledger_path = self.files.ledger
        self.cursor_path = self.files.cursor
        self.run_id_path = self.files.run_id
        self.run_id = run_id or self.files.read_run_id()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # the background thread and close() never send twice
        self._pending: list[LedgerEvent] = []  # events not yet appended to the ledger file
        meta = {
            "experiment": experiment,
            "run_name": run_name,
            "parent_run_id": parent_run_id,
            "uri": self.uri,
            "parent_dir": str(self.parent_dir) if self.parent_dir else None,
        }
        write_json(self.files.meta, meta, indent=None)
        repair_ledger(self.ledger_path)
        self._ledger = open(self.ledger_path, "a")  # noqa: SIM115 - closed in close()
        self.ledger_pos = (0, 0)  # (line, byte offset) of a line start: replay reads on from there
        self.last_error: str | None = None
        self._client: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not offline:
            self.flush()  # create the run now if MLflow answers
        if background:
            # MLflow's first import happens here, in the caller's thread, before the flusher
            # starts: a package with import cycles imported by two threads at once can leave one
            # of them a partially initialized module (a requeued rank 0 died of "partially
            # initialized module 'mlflow' has no attribute 'version'": its main thread in `import
            # mlflow` while this tracker's thread, offline at start, made the first import)
            import mlflow.tracking  # noqa: F401

            self._thread = threading.Thread(target=self._loop, args=(flush_every_s,), daemon=True)
            self._thread.start()

    # --- the sink interface (cheap: append to a list) ---------------------------------------
    def _add(self, kind: EventKind, data: Any, step: int | None = None) -> None:
        with self._lock:
            self._pending.append(LedgerEvent(kind, data, step, int(time.time() * 1000)))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self._add(EventKind.METRICS, {k: float(v) for k, v in metrics.items()}, step)

    def log_params(self, params: Mapping[str, Any]) -> None:
        redacted = redact_mapping(params, self.redact)
        self._add(EventKind.PARAMS, {k: v[:PARAM_VALUE_MAX] for k, v in redacted.items()})

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._add(EventKind.TAGS, redact_mapping(tags, self.redact))

    def log_artifact(self, path: Path) -> None:
        self._add(EventKind.ARTIFACT, str(Path(path).resolve()))

    # --- delivery --------------------------------------------------------------------------
    def _loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.flush()

    def _write_pending(self) -> None:
        with self._lock:
            events, self._pending = self._pending, []
        for ev in events:
            self._ledger.write(ev.to_line())
        self._ledger.flush()
        os.fsync(self._ledger.fileno())

    def flush(self) -> bool:
        """Append pending events to the ledger, then send what MLflow lacks. True if in sync."""
        with self._flush_lock:
            self._write_pending()
            if self.offline:
                return False
            try:
                sent = replay(self.ledger_dir, self)
                self.last_error = None
                return sent
            except Exception as e:  # MLflow down, locked or refusing: keep the ledger, retry later
                self.last_error = f"{type(e).__name__}: {e}"
                return False

    def client(self) -> Any:
        if self._client is None:
            self._client = client_for(self.uri)
        return self._client

    def ensure_run(self) -> str:
        parent = self._parent_id()
        if self.run_id is None:
            client = self.client()
            exp_id = get_or_create_experiment(client, self.experiment)
            tags = {K.TAG_MLFLOW_PARENT: parent} if parent else {}
            run = client.create_run(exp_id, run_name=self.run_name, tags=tags)
            self.run_id = str(run.info.run_id)
            write_atomic(self.run_id_path, self.run_id)
        elif parent and not self.parent_run_id:  # the parent appeared after this run was created
            self.client().set_tag(self.run_id, K.TAG_MLFLOW_PARENT, parent)
        self.parent_run_id = self.parent_run_id or parent
        return self.run_id

    def _parent_id(self) -> str | None:
        """The parent run's id: given, or created since by the parent's own ledger."""
        if self.parent_run_id or self.parent_dir is None:
            return self.parent_run_id
        return LedgerDir(self.parent_dir).read_run_id()

    def reopen(self) -> None:
        """The run goes on after it ended (`qualify resume`): RUNNING again, until it ends anew."""
        self._add(EventKind.END, REOPENED)

    def close(self, status: str = "FINISHED", terminate: bool = True) -> None:
        """Flush everything; end the run unless a later attempt will go on logging into it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if terminate:  # the run's end is an event like any other: replayed if MLflow is down
            self._add(EventKind.END, status)
        ok = self.flush()
        if not ok and not self.offline:
            refused = any(
                w in (self.last_error or "") for w in ("401", "403", "Unauthorized", "PERMISSION_DENIED")
            )
            why = "refused the credentials" if refused else "is unreachable"
            log.warning(
                "MLflow at %s %s (%s); every event is kept in %s. Replay it with: qualify sync %s",
                self.uri,
                why,
                self.last_error,
                self.ledger_path,
                self.ledger_dir,
            )
        self._ledger.close()


def repair_ledger(path: Path) -> None:
    """Cut a torn last line (a process killed in the middle of appending it): it was never a
    complete, fsynced event, and the next attempt's appends must start on a line of their own."""
    if not path.exists():
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        keep, end = 0, size
        while end > 0:  # back from the end, a chunk at a time, to the last newline
            start = max(0, end - (1 << 20))
            f.seek(start)
            cut = f.read(end - start).rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            end = start
        log.warning("%s: cut a torn last line (%d bytes) left by a killed process", path, size - keep)
        f.truncate(keep)
        os.fsync(f.fileno())


def replay(ledger_dir: Path, tracker: Tracker) -> bool:
    """Send the ledger lines past the cursor to MLflow, in order, advancing the cursor. Reads
    from the last known line start at or before the cursor (`tracker.ledger_pos`), so a long
    run's background flush does not re-read the whole ledger every few seconds."""
    files = LedgerDir(ledger_dir)
    done = files.synced()
    todo, starts = _unsent(files, tracker, done)
    tracker.ledger_pos = (done, starts[0])
    run_id = tracker.ensure_run()  # create the run, or link it to a parent that appeared since
    if not todo:
        return True
    client = tracker.client()
    has_params = any(ev.kind == EventKind.PARAMS for ev in todo)
    logged_params = dict(client.get_run(run_id).data.params) if has_params else {}
    i = 0
    while i < len(todo):
        if todo[i].kind in BATCHED:
            i = _send_batch(client, run_id, todo, i, logged_params)
        else:
            _send_one(client, run_id, todo[i])
            i += 1
        write_atomic(files.cursor, str(done + i))
        tracker.ledger_pos = (done + i, starts[i])
    return True


def _unsent(files: LedgerDir, tracker: Tracker, done: int) -> tuple[list[LedgerEvent], list[int]]:
    """The complete ledger lines past the cursor (a line still being appended is not read), and
    starts[i]: the byte offset of line done + i."""
    start_line, start_byte = tracker.ledger_pos if tracker.ledger_pos[0] <= done else (0, 0)
    with open(files.ledger, "rb") as f:
        f.seek(start_byte)
        complete = f.read().split(b"\n")[:-1]
    skip = done - start_line
    starts = list(itertools.accumulate((len(ln) + 1 for ln in complete), initial=start_byte))[skip:]
    return [LedgerEvent.from_line(line) for line in complete[skip:]], starts


def _send_batch(
    client: Any, run_id: str, todo: list[LedgerEvent], i: int, logged_params: dict[str, Any]
) -> int:
    """Send the consecutive metric/param/tag events from todo[i] as one batch within MLflow's
    limits (params in chunks); the index of the first event not sent."""
    from mlflow.entities import Metric, Param, RunTag

    metrics: list[Any] = []
    params: list[Any] = []
    tags: list[Any] = []
    j = i
    while j < len(todo) and todo[j].kind in BATCHED:
        ev = todo[j]
        if ev.kind == EventKind.METRICS:
            new_metrics = [Metric(k, v, ev.time_ms, ev.step or 0) for k, v in ev.data.items()]
            if metrics and len(metrics) + len(new_metrics) > _MAX_METRICS:
                break
            metrics += new_metrics
        elif ev.kind == EventKind.PARAMS:
            # MLflow refuses to change a param: a later attempt with another value (say a
            # raised train.steps) records the new value as a tag instead
            fresh = {k: v for k, v in ev.data.items() if k not in logged_params}
            changed = {k: v for k, v in ev.data.items() if k in logged_params and logged_params[k] != v}
            if params and len(params) + len(fresh) > _MAX_PARAMS:
                break
            params += [Param(k, v) for k, v in fresh.items()]
            tags += [RunTag(K.TAG_PARAM_CHANGED_PREFIX + k, v) for k, v in changed.items()]
            logged_params.update(fresh)
        else:
            new_tags = [RunTag(k, v) for k, v in ev.data.items()]
            if tags and len(tags) + len(new_tags) > _MAX_TAGS:
                break
            tags += new_tags
        j += 1
    for chunk in range(0, max(len(params), 1), _MAX_PARAMS):
        client.log_batch(
            run_id,
            metrics=metrics if chunk == 0 else [],
            params=params[chunk : chunk + _MAX_PARAMS],
            tags=tags if chunk == 0 else [],
        )
    return j


def _send_one(client: Any, run_id: str, ev: LedgerEvent) -> None:
    """An artifact, or the run's status: running again (`qualify resume`) or its end, with the
    time it ended."""
    if ev.kind == EventKind.END and ev.data == REOPENED:
        client.update_run(run_id, status=REOPENED)
    elif ev.kind == EventKind.END:
        client.set_terminated(run_id, status=ev.data, end_time=ev.time_ms)
    elif Path(ev.data).exists():
        client.log_artifact(run_id, str(ev.data))


def unsent_ledgers(root: Path) -> list[Path]:
    """The ledger folders under `root` holding events MLflow does not have yet (past their
    cursor): what `make sync` would still send."""
    out = []
    for ledger in sorted(Path(root).rglob(LedgerDir.LEDGER)):
        with open(ledger, "rb") as f:
            lines = f.read().count(b"\n")
        if lines > LedgerDir(ledger.parent).synced():
            out.append(ledger.parent)
    return out


def sync_ledgers(root: Path, uri: str | None, experiment: str, final_status: Any = None) -> tuple[int, int]:
    """Replay every ledger under `root` (a sweep folder or one point) to the URI it recorded
    (`uri`, when given, instead), parents before their children: (synced, still failing).
    `final_status(folder)` -> FINISHED | FAILED | None: the status a run ends with once its
    ledger is replayed (from the point's outcome), None to leave it as the ledger says."""
    ok = failed = 0
    ledgers = sorted(Path(root).rglob(LedgerDir.LEDGER), key=lambda p: (len(p.parts), str(p)))
    for ledger in ledgers:
        folder = ledger.parent
        meta = LedgerDir(folder).read_meta()
        target = uri or meta.get("uri")
        if not target:
            log.error("%s: no tracking URI recorded; pass --tracking-uri", folder)
            failed += 1
            continue
        tracker = Tracker(
            target,
            meta.get("experiment", experiment),
            folder,
            run_name=meta.get("run_name", folder.name),
            parent_run_id=meta.get("parent_run_id"),
            parent_dir=Path(meta["parent_dir"]) if meta.get("parent_dir") else None,
            background=False,
        )
        tracker._ledger.close()  # its constructor already replayed what MLflow lacked
        status = final_status(folder) if final_status is not None else None
        if not tracker.last_error and status and tracker.run_id:
            try:
                if tracker.client().get_run(tracker.run_id).info.status != status:
                    tracker.client().set_terminated(tracker.run_id, status=status)
            except Exception as e:
                tracker.last_error = f"{type(e).__name__}: {e}"
        if tracker.last_error:
            log.error("%s: %s", folder, tracker.last_error)
            failed += 1
        else:
            ok += 1
    return ok, failed
