"""`qualify`: the commands the Makefile wraps. Thin: parse, call one function, print."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.config.schema import LAUNCHERS, ConfigError
from pipeline.contract.outcome import Reason
from pipeline.home import RUNS_DIR
from pipeline.sched import SchedulerError, scheduler_for
from pipeline.tracking import keys as K


def cmd_sweep(args: argparse.Namespace) -> int:
    from pipeline.submit.sweep import submit

    planned = _plan_sweep(args)
    if isinstance(planned, int):
        return planned
    pl, max_repeats = planned

    def on_result(entry: Any, result: dict[str, Any]) -> None:
        extra = f" ({result.get('reason')}: {result.get('detail')})" if result.get("reason") else ""
        print(f"  {entry.point_id}: {result.get('outcome')}{extra}", flush=True)
        for note in result.get("notes") or []:  # e.g. a resume that skipped checkpoints
            print(f"    {note}", flush=True)

    try:
        m = submit(pl, on_result=on_result, on_progress=_print_progress)
    except ConfigError as e:  # the tracking server refuses the credentials: found before anything is written
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the points without an outcome were ended `interrupted`
        print(f"\n[sweep] interrupted: {interrupted_line(pl.manifest)}", file=sys.stderr, flush=True)
        return 130
    if max_repeats and (code := _later_rounds(pl, m, max_repeats, on_result)) is not None:
        return code
    if scheduler_for(pl.launcher).keeps_jobs:  # Slurm runs them whether anyone waits or not
        # a group per cluster it runs on (-M), where the sweep spans several
        groups = sorted({f"{p.slurm_cluster}:{p.group}" if p.slurm_cluster else p.group for p in m.points})
        print(f"submitted {len(m.points)} points in {len(groups)} job array(s): " + ", ".join(groups))
        print(f"sweep id: {m.sweep_id}   watch it: make status SWEEP={m.sweep_id}")
        if not (args.wait or pl.points[0].cfg.launcher.wait):
            return 0
    return _wait_and_summarise(pl, m)


def _plan_sweep(args: argparse.Namespace) -> tuple[Any, int] | int:
    """The sweep planned and its estimate said, with the most repeats a candidate may get
    (sweep.adaptive; 0 otherwise); exit 2 on a bad config, before anything is written."""
    from pipeline.submit.adaptive import first_round
    from pipeline.submit.estimate import sweep_estimate
    from pipeline.submit.sweep import plan

    max_repeats = 0
    try:
        pl = plan(args.sweep, args.overrides, launcher_kind=args.launcher)
        if pl.points[0].cfg.sweep.adaptive:
            pl, max_repeats = first_round(pl, args.sweep, args.overrides, args.launcher, plan)
            print(
                f"[adaptive] round 1: one repeat of every point; at most {max_repeats} per candidate",
                flush=True,
            )
        print(sweep_estimate(pl.points), flush=True)  # raises ConfigError over sweep.budget_*
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"launcher: {pl.launcher} ({pl.why})", flush=True)
    for note in pl.notes:
        print(note, flush=True)
    print(
        f"sweep {pl.manifest.sweep_id}: {len(pl.points)} points of preset '{args.sweep}' -> {pl.sweep_dir}",
        flush=True,
    )
    return pl, max_repeats


def _later_rounds(pl: Any, m: Any, max_repeats: int, on_result: Any) -> int | None:
    """After an adaptive sweep's round 1: on Slurm, its controller job queued (the rounds go on
    there); locally, the rounds run here. An exit code to end with, or None to go on."""
    from pipeline.submit.adaptive import rounds_line, run_rounds

    if scheduler_for(pl.launcher).keeps_jobs:  # Slurm: controller jobs run the rounds
        from pipeline.submit.controller import begin

        try:
            ctl = begin(pl.sweep_dir, pl.points, max_repeats)
        except SchedulerError as e:
            print(
                f"error: round 1 is queued, but its controller job was refused: {e}. The rounds go on "
                f"once it is queued: make resume SWEEP={m.sweep_id}",
                file=sys.stderr,
            )
            return 1
        print(
            f"[adaptive] controller job {ctl} plans round 2 once round 1's jobs ended; the rounds go on in "
            "Slurm (each submits the next), nothing here waits for them",
            flush=True,
        )
        return None
    try:
        print(rounds_line(run_rounds(pl.sweep_dir, max_repeats, on_result, _print_progress)), flush=True)
    except KeyboardInterrupt:
        print(f"\n[sweep] interrupted: {interrupted_line(pl.manifest)}", file=sys.stderr, flush=True)
        return 130
    return None


def _wait_and_summarise(pl: Any, m: Any) -> int:
    """Follow a submitted sweep to its end (local runs always; Slurm with --wait), then print
    the summary table and where its runs are."""
    from pipeline.submit.status import PointState, summary_table, watch
    from pipeline.submit.sweep import resubmit_unhealthy

    try:
        states: list[PointState] = watch(pl.sweep_dir, follow=True, interval_s=5.0, out=_Quiet())
        while scheduler_for(pl.launcher).keeps_jobs and resubmit_unhealthy(pl):  # launcher.exclude_unhealthy
            states = watch(pl.sweep_dir, follow=True, interval_s=5.0, out=_Quiet())
        while _rounds_go_on(pl.sweep_dir):  # an adaptive Slurm sweep: its controllers submit more rounds
            time.sleep(5.0)
            states = watch(pl.sweep_dir, follow=True, interval_s=5.0, out=_Quiet())
        for line in _adaptive_lines(pl.sweep_dir):
            print(line)
    except KeyboardInterrupt:  # Slurm runs the jobs whether anyone waits for them or not
        print(
            f"\n[sweep] stopped waiting; sweep {m.sweep_id} goes on in Slurm: make status SWEEP={m.sweep_id}",
            file=sys.stderr,
            flush=True,
        )
        return 130
    print()
    print(summary_table(states))
    print()
    if m.parent_run_id:
        print(f"MLflow: {m.tracking_uri} (experiment '{m.experiment}', parent run {m.parent_run_id})")
        _say_unsent(pl.sweep_dir, m.sweep_id)
        url, why = ui_url(m)
        print(
            f"browse it: make ui   (then open {url or 'http://127.0.0.1:5000'})" + (f"; {why}" if why else "")
        )
    else:
        print(
            f"MLflow: {m.tracking_uri} did not answer; every run is kept in its ledger. "
            f"Once it answers: make sync SWEEP={m.sweep_id}"
        )
    return 0


def _say_unsent(sweep_dir: Path, sweep_id: str) -> None:
    """MLflow answered when the sweep started but stopped partway: the job logs said so, the
    summary must too, with the command that sends what is missing."""
    from pipeline.tracking.ledger import unsent_ledgers

    unsent = unsent_ledgers(sweep_dir)
    if unsent:
        print(
            f"[tracking] MLflow stopped answering during the sweep: {len(unsent)} run(s) have events only in "
            f"their ledgers under {sweep_dir}. Replay them once it answers: make sync SWEEP={sweep_id}"
        )


def _print_progress(line: str) -> None:
    print(f"    {line}", flush=True)


def interrupted_line(m: Any) -> str:
    """The one line Ctrl-C leaves on stderr: what became of the sweep's points."""
    from pipeline.submit.status import read_outcome

    ended = [read_outcome(p) or {} for p in m.points]
    cut = sum(o.get("reason") == Reason.INTERRUPTED for o in ended)
    return (
        f"sweep {m.sweep_id}: {cut} of {len(m.points)} point(s) ended failed ({Reason.INTERRUPTED}), "
        f"their MLflow runs and the parent KILLED; the table: qualify status --sweep {m.sweep_id}"
    )


class _Quiet:
    """A stream that swallows the live table (the summary is printed instead)."""

    def write(self, _: str) -> None:
        pass

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def cmd_status(args: argparse.Namespace) -> int:
    from pipeline.submit.manifest import runs_root, sweep_dir_for
    from pipeline.submit.status import FINAL, summary_table, watch

    try:
        sweep_dir = sweep_dir_for(runs_root(args.runs_dir), args.sweep)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.interval < 1:
        print(
            f"error: --interval={args.interval:g} is below 1 s; each poll asks Slurm (sacct, squeue) "
            "once for the whole sweep, and its watchers share the answer: use 1 s or more "
            "(default 30 s).",
            file=sys.stderr,
        )
        return 2
    if args.json:
        return _status_json(sweep_dir, args)
    states = watch(sweep_dir, follow=args.follow, interval_s=args.interval)
    for line in _adaptive_lines(sweep_dir):
        print(line)
    if all(s.state in FINAL for s in states):
        print()
        print(summary_table(states))
    return 0


def _status_json(sweep_dir: Path, args: argparse.Namespace) -> int:
    """`qualify status --json`: the table's content as one JSON document on stdout (with
    --follow, once every point has ended); keys in docs/design.md, "Status for scripts"."""
    import io
    import json

    from pipeline.submit.manifest import Manifest
    from pipeline.submit.status import watch
    from pipeline.submit.statusdoc import status_document

    states = watch(sweep_dir, follow=args.follow, interval_s=args.interval, out=io.StringIO())
    doc = status_document(Manifest.read(sweep_dir), states)
    doc["adaptive"] = _adaptive_lines(sweep_dir)
    print(json.dumps(doc, indent=1, sort_keys=True))
    return 0


def _rounds_go_on(sweep_dir: Path) -> bool:
    """An adaptive Slurm sweep whose rounds have neither ended nor stopped, nor lost their
    controller (a failed one waits for `qualify resume`)."""
    from pipeline.submit.controller import RoundsState, is_adaptive, rounds_state
    from pipeline.submit.manifest import Manifest

    if not is_adaptive(sweep_dir):
        return False
    sched = scheduler_for(Manifest.read(sweep_dir).launcher)
    return rounds_state(sweep_dir, sched) == RoundsState.GOING_ON


def _adaptive_lines(sweep_dir: Path) -> list[str]:
    """An adaptive Slurm sweep's rounds and controller (nothing for any other sweep)."""
    from pipeline.submit.controller import is_adaptive, status_lines
    from pipeline.submit.manifest import Manifest

    if not is_adaptive(sweep_dir):
        return []
    return status_lines(sweep_dir, scheduler_for(Manifest.read(sweep_dir).launcher))


def _sweep_dir(args: argparse.Namespace) -> Path | None:
    """The sweep folder named by --sweep (default the latest), or None after a one-line error."""
    from pipeline.submit.manifest import runs_root, sweep_dir_for

    try:
        return sweep_dir_for(runs_root(args.runs_dir), args.sweep)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return None


def cmd_cancel(args: argparse.Namespace) -> int:
    from pipeline.submit.control import cancel_sweep

    sweep_dir = _sweep_dir(args)
    if sweep_dir is None:
        return 2
    try:
        res = cancel_sweep(sweep_dir)
    except SchedulerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not res.cancelled_jobs and not res.cancelled_points:
        print(f"sweep {sweep_dir.name}: nothing left to cancel")
        return 0
    print(
        f"sweep {sweep_dir.name}: cancelled {len(res.cancelled_jobs)} job(s); "
        f"{len(res.cancelled_points)} point(s) ended {Reason.CANCELLED}"
        + ("; the parent run is closed" if res.closed else "")
    )
    print(f"run them again from their checkpoints: make resume SWEEP={sweep_dir.name}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from pipeline.submit.control import RESUMABLE, reopen, resumable
    from pipeline.submit.sweep import resume

    only = [r.strip() for r in args.only.split(",") if r.strip()] if args.only else list(RESUMABLE)
    reasons = {r.value for r in Reason}
    unknown = sorted(set(only) - reasons)
    if unknown:
        print(
            f"error: --only {','.join(unknown)}: not a reason a point ends with; one or more of "
            f"{', '.join(sorted(reasons))}, comma-separated.",
            file=sys.stderr,
        )
        return 2
    sweep_dir = _sweep_dir(args)
    if sweep_dir is None:
        return 2
    chosen = resumable(sweep_dir, only)
    if not chosen:
        rounds = _resume_rounds(sweep_dir)
        if rounds:
            print(f"sweep {sweep_dir.name}: {rounds}")
            return 0
        print(f"sweep {sweep_dir.name}: no point to resume (reasons: {', '.join(only)})")
        return 0
    reopen(sweep_dir, chosen)
    print(
        f"sweep {sweep_dir.name}: resuming {len(chosen)} point(s): " + ", ".join(e.point_id for e in chosen)
    )

    def on_result(entry: Any, result: dict[str, Any]) -> None:
        print(
            f"  {entry.point_id}: {result.get('outcome')} {result.get('reason') or ''}".rstrip(), flush=True
        )
        for note in result.get("notes") or []:  # a resume that fell back, or found no valid checkpoint
            print(f"    {note}", flush=True)

    try:
        m = resume(sweep_dir, chosen, on_result, on_progress=_print_progress)
    except KeyboardInterrupt:  # as a sweep's Ctrl-C: the points without an outcome ended `interrupted`
        from pipeline.submit.manifest import Manifest

        print(
            f"\n[resume] interrupted: {interrupted_line(Manifest.read(sweep_dir))}",
            file=sys.stderr,
            flush=True,
        )
        return 130
    if scheduler_for(m.launcher).keeps_jobs:
        rounds = _resume_rounds(sweep_dir)
        if rounds:
            print(f"sweep {sweep_dir.name}: {rounds}")
        print(f"watch it: make status SWEEP={m.sweep_id}")
    return 0


def _resume_rounds(sweep_dir: Path) -> str | None:
    """An adaptive Slurm sweep's rounds go on (pipeline.submit.controller.resume_rounds)."""
    from pipeline.submit.controller import resume_rounds
    from pipeline.submit.manifest import Manifest

    return resume_rounds(sweep_dir, scheduler_for(Manifest.read(sweep_dir).launcher))


DEFAULT_UI = "http://127.0.0.1:5000"


def ui_url(m: Any, base: str = DEFAULT_UI) -> tuple[str | None, str]:
    """The sweep's runs table in the MLflow UI at `base` (its view stored on the experiment,
    pipeline/tracking/view.py), or (None, why not)."""
    from pipeline.tracking.store import unreachable
    from pipeline.tracking.view import publish_runs_view, runs_view_url

    problem = unreachable(m.tracking_uri)
    if problem:
        return None, f"MLflow: {problem}"
    try:
        experiment_id = publish_runs_view(m.tracking_uri, m.experiment, m.sweep_id)
    except Exception as e:  # the UI opens anyway, on MLflow's own landing page
        return None, f"could not store the sweep's view in MLflow ({type(e).__name__}: {str(e)[:200]})"
    return runs_view_url(base, experiment_id, m.sweep_id), ""


def cmd_ui_url(args: argparse.Namespace) -> int:
    """Print the URL of a sweep's runs table (its child runs, the decision's columns)."""
    import re

    from pipeline.submit.manifest import Manifest, runs_root, sweep_dir_for

    if not args.port.isdigit() or not re.fullmatch(r"[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]", args.host):
        print(
            f"error: --host {args.host!r} --port {args.port!r} do not make a URL: a host name, an IPv4 "
            "address or a bracketed IPv6 address, and a port number.",
            file=sys.stderr,
        )
        return 2
    base = f"http://{args.host}:{args.port}"
    try:
        m = Manifest.read(sweep_dir_for(runs_root(args.runs_dir), args.sweep))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    url, why = ui_url(m, base)
    if url is None:
        print(f"sweep {m.sweep_id}: {why}", file=sys.stderr)
        return 1
    print(f"sweep {m.sweep_id}, its runs with the decision's columns: {url}")
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    """Replay ledgers to the URI each one recorded (or --tracking-uri), then end every run
    whose point has an outcome with FINISHED or FAILED."""
    from pipeline.contract.sweepdir import SweepDir
    from pipeline.submit.manifest import Manifest, runs_root, sweep_dir_for
    from pipeline.submit.status import final_status
    from pipeline.tracking.ledger import LedgerDir, sync_ledgers
    from pipeline.tracking.redact import adopt_credentials
    from pipeline.tracking.store import bound_http_requests

    bound_http_requests()
    if args.path:
        path = Path(args.path)
    else:
        try:
            path = sweep_dir_for(runs_root(args.runs_dir), args.sweep)
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if not path.exists():
        print(f"error: no such folder: {path}", file=sys.stderr)
        return 2
    uri = adopt_credentials(args.tracking_uri) if args.tracking_uri else None
    ok, failed = sync_ledgers(path, uri, args.experiment, final_status=final_status)
    parent_id = LedgerDir(SweepDir(path).parent_ledger).read_run_id()
    if SweepDir(path).manifest.exists() and parent_id:  # the parent exists now: say so
        m = Manifest.read(path)
        if not m.parent_run_id:
            m.parent_run_id = parent_id
            m.write(path)
    print(f"synced {ok} ledger(s) under {path}, {failed} still failing")
    return 1 if failed else 0


def cmd_export(args: argparse.Namespace) -> int:
    """One sweep's runs, metric histories, artifacts and ledgers into a bundle folder."""
    from pipeline.submit.manifest import runs_root
    from pipeline.tracking.redact import adopt_credentials
    from pipeline.tracking.store import bound_http_requests, resolve_uri
    from pipeline.tracking.transfer import TransferError, export_sweep

    bound_http_requests()
    uri = resolve_uri(adopt_credentials(args.tracking_uri) if args.tracking_uri else None)
    try:
        done = export_sweep(
            uri, args.experiment, args.sweep, runs_root(args.runs_dir) / args.sweep, Path(args.out)
        )
    except TransferError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in done.notes:
        print(f"note: {note}")
    print(
        f"exported sweep {done.sweep_id}: {done.runs} run(s), {done.values} metric value(s), "
        f"{done.artifacts} artifact file(s), {done.ledgers} ledger(s) -> {args.out}"
    )
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """A bundle's runs into this store; the runs already there (by origin run id) are left."""
    from pipeline.tracking.redact import adopt_credentials
    from pipeline.tracking.store import bound_http_requests, resolve_uri
    from pipeline.tracking.transfer import TransferError, import_bundle

    bound_http_requests()
    uri = resolve_uri(adopt_credentials(args.tracking_uri) if args.tracking_uri else None)
    try:
        done = import_bundle(Path(args.bundle), uri, args.experiment)
    except TransferError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    redone = f", {done.redone} left incomplete by an earlier import redone" if done.redone else ""
    print(
        f"imported sweep {done.sweep_id} into experiment {done.experiment_id}: {done.imported} run(s) added, "
        f"{done.already} already there{redone}"
    )
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from pipeline.config.compose import compose_sweep
    from pipeline.submit.estimate import show_estimate
    from pipeline.submit.fit import main as fit_main

    try:
        print(fit_main(args.sweep, args.overrides, args.json))
        print(
            show_estimate(compose_sweep(args.sweep, args.overrides)),
            file=sys.stderr if args.json else sys.stdout,
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from pipeline.home import conf_dir

    if args.keys:
        from pipeline.config.keys import all_keys, format_keys

        print(format_keys(all_keys()))
        return 0

    for group in sorted(p for p in conf_dir().iterdir() if p.is_dir()):
        options = sorted(f.stem for f in group.glob("*.yaml"))
        print(f"{group.name:<12} {' '.join(options)}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from pipeline.config.compose import compose_sweep

    try:
        points = compose_sweep(args.sweep, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from pipeline.submit.estimate import show_estimate
    from pipeline.submit.sweep import without_secrets

    for p in map(without_secrets, points):
        print(f"# {p.point_id}: {' '.join(p.overrides)}")
        if args.full:
            print(p.yaml)
    print(show_estimate(points))
    return 0


def _sweep_folder_args(p: argparse.ArgumentParser) -> None:
    """--sweep and --runs-dir: the commands that act on a sweep folder already written."""
    p.add_argument("--sweep", default=None, help="sweep id (default: the latest)")
    p.add_argument("--runs-dir", default=RUNS_DIR)


def _add_planning(sub: Any) -> None:
    """The commands that compose a sweep preset without submitting it: show, fit."""
    p = sub.add_parser("show", help="print the points a sweep would run (nothing is submitted)")
    p.add_argument("--sweep", default="default")
    p.add_argument("--full", action="store_true", help="print each resolved config")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "fit", help="memory per term, verdict and largest micro-batch per point (nothing submitted)"
    )
    p.add_argument("--sweep", default=os.environ.get("SWEEP") or "default")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(func=cmd_fit)


def _add_sweep_folder(sub: Any) -> None:
    """The commands on a sweep that was submitted: status, cancel, resume, ui-url."""
    p = sub.add_parser("status", help="table of a sweep's points by state and partition")
    _sweep_folder_args(p)
    p.add_argument("--follow", action="store_true", help="redraw until every point has ended")
    p.add_argument(
        "--interval",
        type=float,
        default=30.0,
        help="--follow: seconds between polls (>= 1); Slurm is asked at most this often per sweep",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the table's content as one JSON document (one object per point and per partition; "
        "keys in docs/design.md, 'Status for scripts'); with --follow, once every point has ended",
    )
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("cancel", help="cancel what still runs of a sweep (its points end cancelled)")
    _sweep_folder_args(p)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("resume", help="run again the points that ended for reasons outside the candidate")
    _sweep_folder_args(p)
    p.add_argument(
        "--only",
        default=None,
        help="comma-separated reasons to resume (default: interrupted,cancelled,node_unhealthy,"
        "preempt_cancelled,tool_error,disk_full)",
    )
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("ui-url", help="the MLflow UI's URL of a sweep's runs table (make ui prints it)")
    _sweep_folder_args(p)
    p.add_argument("--host", default="127.0.0.1", help="where the UI listens")
    p.add_argument("--port", default="5000")
    p.set_defaults(func=cmd_ui_url)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qualify", description="Qualify Slurm GPU partitions for LLM fine-tuning."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sweep", help="validate and submit a sweep preset (Hydra overrides after it)")
    p.add_argument("--sweep", default=os.environ.get("SWEEP") or "default", help="preset in conf/sweep/")
    p.add_argument("--launcher", choices=LAUNCHERS, default=None)
    p.add_argument("--wait", action="store_true", help="Slurm: wait for the end and print the summary")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. precision=fp32 train.steps=30")
    p.set_defaults(func=cmd_sweep)

    _add_sweep_folder(sub)
    _add_planning(sub)
    p = sub.add_parser("list", help="the options of every config group (--keys: every key)")
    p.add_argument("--keys", action="store_true", help="every config key with its type, default and doc")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("sync", help="replay ledgers kept while MLflow was unreachable")
    p.add_argument("path", nargs="?", help="a sweep folder (runs/<id>) or one point's folder")
    p.add_argument("--sweep", default=None, help="sweep id, instead of a path (default: the latest)")
    p.add_argument("--runs-dir", default=RUNS_DIR)
    p.add_argument(
        "--tracking-uri", default=None, help="default: the URI each ledger recorded (its tracker.json)"
    )
    p.add_argument("--experiment", default=K.EXPERIMENT)
    p.set_defaults(func=cmd_sync)

    p = sub.add_parser(
        "export", help="one sweep's runs, histories, artifacts and ledgers into a bundle folder"
    )
    p.add_argument("--sweep", required=True, help="the sweep id")
    p.add_argument("--out", required=True, help="the bundle folder to write (new or empty)")
    p.add_argument("--runs-dir", default=RUNS_DIR, help="where the sweep's folder (its ledgers) is")
    p.add_argument(
        "--tracking-uri", default=None, help="default: env MLFLOW_TRACKING_URI, else the project's SQLite"
    )
    p.add_argument("--experiment", default=K.EXPERIMENT)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("import", help="a bundle's runs into this store (twice adds nothing)")
    p.add_argument("bundle", help="a folder `qualify export` wrote")
    p.add_argument(
        "--tracking-uri", default=None, help="default: env MLFLOW_TRACKING_URI, else the project's SQLite"
    )
    p.add_argument("--experiment", default=None, help="default: the experiment the bundle came from")
    p.set_defaults(func=cmd_import)

    for name, text in (
        ("report", "decision record of a sweep, HTML + Markdown (qualify report --help)"),
        ("baseline", "references from a sweep's accepted runs (qualify baseline --help)"),
        ("discover", "write conf/partition stubs from this cluster (qualify discover --help)"),
        ("launch", "the winner's production job: runs/<sweep>/launch/<candidate>/ (qualify launch --help)"),
    ):
        sub.add_parser(name, help=text, add_help=False)  # listed here, parsed by their own main
    return parser


FORWARDED = {
    "report": ("analysis.report", "report_main"),
    "baseline": ("analysis.baseline", "baseline_main"),
    "discover": ("pipeline.submit.discover", "discover_main"),
    "launch": ("analysis.launch", "launch_main"),
}


ARGS_FROM_ENV = "--args-from-env"


def expand_env_args(argv: list[str]) -> list[str]:
    """`--args-from-env NAME` is replaced by the words of the environment variable NAME, split
    as a shell splits words (quotes group, backslashes escape) but with nothing expanded or
    run: `$HOME` and backticks stay as typed. The Makefile passes ARGS this way."""
    import shlex

    out: list[str] = []
    it = iter(argv)
    for a in it:
        if a == ARGS_FROM_ENV or a.startswith(ARGS_FROM_ENV + "="):
            name = a.partition("=")[2] or next(it, "")
            try:
                out += shlex.split(os.environ.get(name, ""))
            except ValueError as e:  # an unclosed quote
                raise ConfigError(
                    f"Cannot split {name}={os.environ.get(name, '')!r} into arguments: {e}. "
                    "Quote the whole value for make in single quotes and each value with spaces "
                    "inside it in double quotes, e.g. make sweep ARGS='train.lr=1e-4 \"partition.setup=[a b]\"'."
                ) from None
        else:
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at the interpreter's exit, where a closed reader is a traceback
        return code
    except BrokenPipeError:  # `qualify status | head -1`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)  # the interpreter's last flush must not fail too
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # as a shell reports a command ended by SIGPIPE


def _main(argv: list[str] | None) -> int:
    from pipeline import logs

    logs.setup()
    if os.environ.get("SQ_INTERRUPTIBLE") == "1":  # started by scripts/interruptible.sh (make), whose
        # shell ignores SIGINT so that make stays silent: Ctrl-C is this command's again
        import signal

        signal.signal(signal.SIGINT, signal.default_int_handler)
    argv = sys.argv[1:] if argv is None else argv
    try:
        argv = expand_env_args(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if argv and argv[0] in FORWARDED:  # their own parsers take every option after the name
        import importlib

        module, func = FORWARDED[argv[0]]
        main_of = getattr(importlib.import_module(module), func)
        if argv[0] == "report":  # the report asks the partitions' queues through the scheduler here
            from pipeline.submit.availability import ask_start

            return int(main_of(argv[1:], ask=ask_start))
        if argv[0] == "launch":  # the measurements through MLflow there, the files written here
            from pipeline.submit.launch import write_launch

            return int(main_of(argv[1:], write=write_launch))
        return int(main_of(argv[1:]))
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:  # Ctrl-C anywhere else: one line, no traceback, the shell's code
        print(f"\n[{args.command}] interrupted", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
