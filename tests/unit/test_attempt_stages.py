"""Each stage of the attempt (pipeline.job.runner.Attempt) on its own, with fakes for the
trainer, the tracker and the collectives: fast, one process, no DeepSpeed. The whole attempt
runs for real in test_train_resume, test_drills and test_sweep_local."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.config.schema import Config
from pipeline.contract.outcome import Outcome, Reason
from pipeline.contract.pointdir import PointDir
from pipeline.contract.records import AttemptRecord, Phase, StopReason, StopRecord
from pipeline.contract.spec import PointEnd
from pipeline.job import runner
from pipeline.job.attempt import AttemptContext, AttemptStopped
from pipeline.job.distributed import RankEnv
from pipeline.job.drills import DrillVerdict
from pipeline.job.recorder import Recorder
from pipeline.measure.timeline import Mark
from pipeline.tracking import keys as K
from pipeline.train.checkpoint import tag_for
from pipeline.train.trainer import StopFlag, TrainResult

GIB = 2**30


class FakeTracker:
    def __init__(self) -> None:
        self.metrics: list[tuple[dict[str, float], int | None]] = []
        self.tags: dict[str, Any] = {}

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics.append((dict(metrics), step))

    def set_tags(self, tags: dict[str, Any]) -> None:
        self.tags.update(tags)

    def log_artifact(self, path: Any) -> None:
        pass


def _attempt(tmp_path: Path, cfg: Config | None = None, **ctx: Any) -> runner.Attempt:
    renv = RankEnv(0, 1, 0, "127.0.0.1", 29500, "local", "node0", ["node0"])
    context = AttemptContext(
        spec=SimpleNamespace(config_yaml=""),
        cfg=cfg or Config(),
        renv=renv,
        point=PointDir(tmp_path),
        process_start=time.time() - 30.0,
        stop=StopFlag(),
        recorder=Recorder(FakeTracker()),
        **ctx,
    )
    return runner.Attempt(context)


def _result(steps: int = 8, step_s: float = 0.5, **kw: Any) -> TrainResult:
    return TrainResult(
        start_step=kw.pop("start_step", 0),
        end_step=steps,
        losses={s: 5.0 - 0.25 * s for s in range(1, steps + 1)},
        step_times={s: step_s for s in range(1, steps + 1)},
        **kw,
    )


def _trainer(
    res: TrainResult,
    committed: list[int] = (),
    peers: list[tuple[str, float | None]] = (),  # type: ignore[assignment]
) -> SimpleNamespace:
    """A trainer of rank 0; `peers`: what the other ranks' stop flags hold (signal, time)."""
    return SimpleNamespace(
        comm=SimpleNamespace(gather_obj=lambda mine: [mine, *peers]),
        result=res,
        tokens_per_step=1024,
        step_counts={},  # chat data only
        params=None,
        engine=object(),
        cfg=SimpleNamespace(steps=res.end_step),
        checkpoints=SimpleNamespace(
            saves=[], tags=lambda: [tag_for(s) for s in sorted(committed, reverse=True)]
        ),
        setup=lambda: res,
        train=lambda: res,
        roundtrip=lambda step: SimpleNamespace(verified=True),
    )


# -- run: the one path through the stages -----------------------------------------------------


class Stages:
    """Stand-ins for the stages, recording the order they ran in."""

    def __init__(self, a: runner.Attempt, trainer: Any, train: Any = None, verify: Any = None) -> None:
        self.calls: list[str] = []
        a.prepare = lambda: self._did("prepare")  # type: ignore[method-assign]
        a.probe = lambda: self._did("probe")  # type: ignore[method-assign]
        a.build = lambda: self._did("build", trainer)  # type: ignore[method-assign]
        a.train = lambda t: self._did("train", train)  # type: ignore[method-assign]
        passed = runner.Verified(True, DrillVerdict(True))
        a.verify = lambda t, r: self._did("verify", verify or passed)  # type: ignore[method-assign]
        a.record_results = lambda t: self._did("record")  # type: ignore[method-assign]

    def _did(self, name: str, value: Any = None) -> Any:
        self.calls.append(name)
        return value() if callable(value) else value


def _stopped(phase: Phase) -> Any:
    def stop() -> None:
        raise runner._Stopped(StopRecord(StopReason.PREEMPT, 1.0, 0.0, 4, 4, phase=phase))

    return stop


def test_an_early_ending_skips_the_trainer_and_keeps_the_attempts_times(tmp_path: Path) -> None:
    a = _attempt(tmp_path)
    stages = Stages(a, trainer=None)
    a.probe = lambda: PointEnd(Outcome.FAILED, Reason.CRASH, "a node failed the gate")  # type: ignore[method-assign]
    ending = a.run()
    assert isinstance(ending, PointEnd) and ending.detail == "a node failed the gate"
    assert stages.calls == ["prepare"]  # no build, no record stage: there is no trainer
    assert a.record is not None and a.record.ranks == 1 and (a.record.allocated_s or 0.0) >= 30.0


@pytest.mark.parametrize("where", ["train", "verify"])
def test_a_stop_goes_through_the_record_stage_once(tmp_path: Path, where: str) -> None:
    a = _attempt(tmp_path)
    phase = Phase.TRAIN if where == "train" else Phase.REFERENCE
    kw = {where: _stopped(phase)}
    stages = Stages(a, _trainer(_result()), **kw)
    ending = a.run()
    assert isinstance(ending, StopRecord) and ending.phase == phase
    assert stages.calls.count("record") == 1 and stages.calls[-1] == "record"
    assert ("verify" in stages.calls) is (where == "verify")


def test_an_outcome_is_decided_after_the_record_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _attempt(tmp_path)
    stages = Stages(a, _trainer(_result()))
    seen: list[list[str]] = []

    def decide(*args: Any) -> PointEnd:
        seen.append(list(stages.calls))
        return PointEnd(Outcome.ACCEPTED, "", "")

    monkeypatch.setattr(runner, "decide", decide)
    assert a.run().outcome == Outcome.ACCEPTED
    assert seen == [["prepare", "probe", "build", "train", "verify", "record"]]


def test_execute_turns_a_stop_into_a_requeue_and_a_dead_peer_into_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _attempt(tmp_path)
    stop = StopRecord(StopReason.TIMEOUT, 1.0, 0.0, 4, 4)
    monkeypatch.setattr(runner.Attempt, "run", lambda self: stop)
    with pytest.raises(AttemptStopped) as info:
        runner.execute(a.ctx)
    assert info.value.stop is stop and info.value.record.ranks == 1

    def peer_dies(self: runner.Attempt) -> None:
        self.trainer = _trainer(_result(), committed=[4])  # type: ignore[assignment]
        import torch.distributed as dist  # the library's own type: its origin, not its words, counts

        raise dist.DistNetworkError("[gloo] Connection closed by peer")

    monkeypatch.setattr(runner.Attempt, "run", peer_dies)
    with pytest.raises(AttemptStopped) as info:
        runner.execute(a.ctx)
    assert info.value.stop.reason == StopReason.PEER_FAILURE and info.value.stop.saved_step == 4


# -- prepare, probe, build -----------------------------------------------------------------------


def test_prepare_ends_a_run_that_does_not_fit_before_the_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipeline.job.distributed as distributed

    est = SimpleNamespace(
        verdict="does_not_fit",
        total_bytes=90 * GIB,
        capacity_bytes=80 * GIB,
        headroom_frac=-0.125,
        activations_bytes=40 * GIB,
        logits_bytes=10 * GIB,
        model_states=SimpleNamespace(device_bytes=40 * GIB),
    )
    monkeypatch.setattr(runner, "import_deepspeed", lambda logs: None)
    monkeypatch.setattr(runner.torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(distributed, "device_for", lambda local_rank: "cuda")
    monkeypatch.setattr(runner, "memory_estimate", lambda cfg, on_gpu: est)
    monkeypatch.setattr(distributed, "init_process_group", pytest.fail)
    a = _attempt(tmp_path)
    ending = a.prepare()
    assert ending is not None and ending.reason == Reason.DOES_NOT_FIT
    assert "estimated 90.0 GiB per device of 80.0 GiB" in ending.detail
    assert a.metrics[K.MEM_ESTIMATE_TENSORS_GIB] == 90.0  # 40 + 40 + 10 GiB of tensors
    assert a.recorder.tracker.tags[K.TAG_MEM_VERDICT] == "does_not_fit"


def test_probe_logs_the_ceiling_and_hands_it_to_the_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _attempt(tmp_path)
    gated: list[tuple[Any, ...]] = []
    monkeypatch.setattr(runner, "measure_matmul_tflops", lambda device, dtype: 12.5)
    monkeypatch.setattr(a.observer, "gate", lambda *args: gated.append(args))
    assert a.probe() is None
    assert a.metrics[K.PERF_CEILING_TFLOPS] == 12.5
    assert gated == [("cpu", 12.5, None)]  # one rank: no collective bandwidth to measure
    assert a.recorder.tracker.tags[K.TAG_PROBES] == "measured"
    record = a.point.read_probes()
    assert record is not None and record["metrics"] == {K.PERF_CEILING_TFLOPS: 12.5}


def test_a_restart_after_a_preemption_reuses_the_probes_a_peer_failure_measures_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 0 measures and records; attempt 1, preempted on the same node, logs the recorded
    figures without a matmul; after a peer failure it measures again."""
    from pipeline.contract.records import StopReason, StopRecord

    monkeypatch.setattr(runner, "measure_matmul_tflops", lambda device, dtype: 12.5)
    first = _attempt(tmp_path)
    monkeypatch.setattr(first.observer, "gate", lambda *args: None)
    first.probe()
    prior = [runner.attempt_record(time.time() - 60, 1)]

    def restart(reason: StopReason) -> runner.Attempt:
        stop = StopRecord(
            reason=reason, signal_time=time.time() - 20, exit_time=0.0, stop_step=4, saved_step=4
        )
        a = _attempt(tmp_path, prior=tuple(prior), prev_stop=stop)
        monkeypatch.setattr(a.observer, "gate", lambda *args: gated.append(args))
        return a

    gated: list[tuple[Any, ...]] = []
    monkeypatch.setattr(runner, "measure_matmul_tflops", lambda device, dtype: pytest.fail("measured again"))
    again = restart(StopReason.PREEMPT)
    assert again.probe() is None
    assert again.metrics[K.PERF_CEILING_TFLOPS] == 12.5 and gated == [("cpu", 12.5, None)]
    assert again.recorder.tracker.tags[K.TAG_PROBES].startswith("reused from attempt 0, ")
    monkeypatch.setattr(runner, "measure_matmul_tflops", lambda device, dtype: 11.0)
    failed = restart(StopReason.PEER_FAILURE)
    failed.probe()
    assert failed.metrics[K.PERF_CEILING_TFLOPS] == 11.0
    assert failed.recorder.tracker.tags[K.TAG_PROBES] == "measured"
    assert failed.point.read_probes()["attempt"] == 1  # type: ignore[index]


def test_build_gives_the_trainer_the_drills_hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = Config()
    cfg.drill.checkpoint = dataclasses.replace(cfg.drill.checkpoint, enabled=True, at_step=3)
    built: dict[str, Any] = {}
    fake = SimpleNamespace(
        data=SimpleNamespace(token_file=None, chat=None, probe=lambda *a: None), ds_config={"zero": 2}
    )

    def trainer(*args: Any, **kw: Any) -> Any:
        built.update(kw)
        return fake

    monkeypatch.setattr(runner, "Trainer", trainer)
    monkeypatch.setattr(runner, "run_dir_checkpoints", lambda *a: "checkpoints")
    a = _attempt(tmp_path, cfg)
    assert a.build() is fake
    assert [type(h).__name__ for h in built["hooks"]] == ["CheckpointDrill"]
    assert built["hooks"][0].at_step == 3 and built["stop"] is a.ctx.stop
    assert a.point.ds_config.read_text().strip().startswith("{")


# -- train, verify -------------------------------------------------------------------------------


def test_train_stops_with_what_was_committed(tmp_path: Path) -> None:
    a = _attempt(tmp_path)
    res = _result(steps=7, stopped=True)
    a.ctx.stop.set("SIGTERM")
    with pytest.raises(runner._Stopped) as info:
        a.train(_trainer(res, committed=[4, 7]))  # type: ignore[arg-type]
    stop = info.value.record
    assert (stop.reason, stop.stop_step, stop.saved_step, stop.trigger) == ("terminated", 7, 7, "SIGTERM")
    assert stop.attempt == 0 and stop.phase == "train" and not stop.drill_fired


def test_a_rank_stopped_by_its_peers_records_their_signal(tmp_path: Path) -> None:
    """Rank 0 stops at a step boundary on rank 1's flag before its own copy of the time-out
    warning arrives (a warm rank's signal is forwarded by its client, one rank after the other:
    the local time-out drill once ended drill_failed for want of a signal): the stop names the
    signal rank 1 got, at its time."""
    a = _attempt(tmp_path)
    assert not a.ctx.stop.is_set()
    res = _result(steps=7, stopped=True)
    at = a.ctx.process_start + 3.0
    with pytest.raises(runner._Stopped) as info:
        a.train(_trainer(res, committed=[7], peers=[("SIGUSR2", at)]))  # type: ignore[arg-type]
    stop = info.value.record
    assert (stop.trigger, stop.signal_time, stop.stop_step, stop.saved_step) == ("SIGUSR2", at, 7, 7)


@pytest.mark.parametrize("start_step", [0, 6])
def test_a_drill_takes_the_run_over_and_verifies_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start_step: int
) -> None:
    """A hook that raises HandOver hands the rest of the run to its drill (the runner names
    none), and an attempt resuming past the drill's step hands over at once; the verify stage
    asks the same drill about what its hand-over returned."""
    from pipeline.job import drills

    seen: list[tuple[str, Any]] = []
    real = drills.BY_NAME["reshape"]
    spec = dataclasses.replace(
        real.spec,
        hand_over_after=lambda cfg: 5,
        hand_over=lambda attempt, trainer: seen.append(("hand_over", trainer)) or "resumed",
        verify_hand_over=lambda attempt, trainer, result: seen.append(("verify", result)) or "verdict",
    )
    taker = drills.Drill(spec)
    monkeypatch.setattr(drills, "DRILLS", tuple(taker if d is real else d for d in drills.DRILLS))
    monkeypatch.setattr(drills, "BY_NAME", {**drills.BY_NAME, "reshape": taker})
    cfg = Config()
    cfg.drill.reshape = dataclasses.replace(cfg.drill.reshape, enabled=True)
    a = _attempt(tmp_path, cfg)
    trainer = _trainer(_result(start_step=start_step))

    def train() -> None:
        assert start_step == 0, "an attempt past the drill's step must not train"
        raise drills.HandOver("reshape")

    trainer.train = train
    handed = a.train(trainer)  # type: ignore[arg-type]
    assert handed is not None and handed.drill is taker and handed.result == "resumed"
    assert a.verify(trainer, handed) == "verdict"  # type: ignore[arg-type]
    assert seen == [("hand_over", trainer), ("verify", "resumed")]


def test_train_keeps_the_states_held_for_the_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeline.train.memstate as memstate

    monkeypatch.setattr(memstate, "state_bytes", lambda engine: {"params": 10, "optimizer": 20, "grads": 5})
    a = _attempt(tmp_path)
    a.startup["import_s"] = 1.5
    assert a.train(_trainer(_result(startup={"model_build_s": 2.0}))) is None  # type: ignore[arg-type]
    assert a.held_states == 30.0  # parameters + optimizer, not the gradients
    # the start-up in parts, one point per attempt at its index (the first: 0)
    assert ({K.STARTUP_IMPORT_S: 1.5, K.STARTUP_MODEL_BUILD_S: 2.0}, 0) in a.recorder.tracker.metrics


def test_verify_round_trips_the_final_checkpoint(tmp_path: Path) -> None:
    a = _attempt(tmp_path)
    verified = a.verify(_trainer(_result()), None)  # type: ignore[arg-type]
    assert verified == runner.Verified(True, DrillVerdict(True))


def test_verify_fails_a_drill_without_evidence(tmp_path: Path) -> None:
    cfg = Config()
    cfg.drill.preempt = dataclasses.replace(cfg.drill.preempt, enabled=True)
    a = _attempt(tmp_path, cfg)
    verified = a.verify(_trainer(_result()), None)  # type: ignore[arg-type]
    assert isinstance(verified, runner.Verified) and not verified.drills.ok
    assert "no evidence of a stop of the run by a preemption signal" in verified.drills.detail


# -- record ------------------------------------------------------------------------------------


def _recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **ctx: Any
) -> tuple[runner.Attempt, list[dict]]:
    import pipeline.job.observe as observe

    reduced: list[dict] = []

    def max_over_ranks(values: dict[str, float]) -> dict[str, float]:
        reduced.append(dict(values))
        return dict(values)

    monkeypatch.setattr(runner, "_max_over_ranks", max_over_ranks)
    monkeypatch.setattr(observe, "_gather", lambda obj: [obj])
    monkeypatch.setattr(runner, "peak_memory_gib", lambda device: {"rss": 4.0})
    a = _attempt(tmp_path, **ctx)
    a.metrics.update({K.MEM_CAPACITY_GIB: 16.0, K.MEM_ESTIMATE_TENSORS_GIB: 2.0})
    return a, reduced


def test_record_agrees_once_then_derives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, reduced = _recording(tmp_path, monkeypatch)
    a.held_states = 3.0 * GIB
    a.record_results(_trainer(_result(steps=8, step_s=0.5)))  # type: ignore[arg-type]
    assert reduced == [{"peak.rss": 4.0, "wait": 0.0, "states": 3.0 * GIB}]  # one max over ranks
    m = a.metrics
    assert m[K.PERF_TOKENS_PER_S] == 2048.0  # 1024 tokens per step / 0.5 s
    assert m[K.TRAIN_FINAL_LOSS] == pytest.approx(3.25)  # steps 6-8: (3.5 + 3.25 + 3.0) / 3
    assert m[K.MEM_HEADROOM_FRAC] == pytest.approx(0.75)  # 1 - 4 / 16 GiB (RSS on a CPU)
    assert m[K.MEM_STATES_MEASURED_GIB] == 3.0
    assert K.PERF_MFU not in m  # a CPU has no datasheet peak
    assert a.record is not None and a.record.end_step == 8 and a.record.lost_s is None


def test_record_measures_the_restart_after_a_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prev = StopRecord(StopReason.PREEMPT, signal_time=1000.0, exit_time=1002.0, stop_step=6, saved_step=4)
    a, _ = _recording(tmp_path, monkeypatch, prior=(AttemptRecord(saves=2, verified=0),), prev_stop=prev)
    start = a.ctx.process_start
    marks = {Mark.ENGINE_READY: start + 5.0, Mark.LOAD_DONE: start + 6.0, Mark.FIRST_STEP_DONE: start + 7.5}
    a.record_results(_trainer(_result(steps=8, start_step=4, timeline=marks)))  # type: ignore[arg-type]
    restart = {k: v for m, step in a.recorder.tracker.metrics if step == 1 for k, v in m.items()}
    assert restart[K.RESTART_START_TO_READY_S] == pytest.approx(5.0)
    assert restart[K.RESTART_LOAD_S] == pytest.approx(1.0) and restart[
        K.RESTART_FIRST_STEP_S
    ] == pytest.approx(1.5)
    assert restart[K.RESTART_LOST_STEPS] == 2  # steps 5 and 6 were done twice
    assert a.record is not None and a.record.lost_s == pytest.approx(1.0)  # 2 steps x 0.5 s
    assert a.metrics[K.CKPT_SAVES] == 2  # the earlier attempt's saves, none in this one


def test_a_resume_that_skipped_checkpoints_says_so_in_the_tags_and_the_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47, case 8, the runner's part: the checkpoint manager's sentence (every checkpoint
    skipped, or a fallback) becomes the run's tag as soon as the engine is set up, and a note of
    the outcome, which `qualify sweep` and `qualify resume` print under the point."""
    note = "no valid checkpoint: 2 skipped (step00000006, step00000003); the run trained from step 0"
    a = _attempt(tmp_path)
    a.ctx.stop.set("SIGTERM")  # the attempt stops at once: the tag is set before anything trains
    with pytest.raises(runner._Stopped):
        a.train(_trainer(_result(steps=7, stopped=True, resume_note=note), committed=[7]))  # type: ignore[arg-type]
    assert a.ctx.recorder.tracker.tags[K.TAG_RESUME_NOTE] == note
    monkeypatch.setattr(runner, "decide", lambda *args: PointEnd(Outcome.ACCEPTED, "", ""))
    a = _attempt(tmp_path)
    Stages(a, _trainer(_result(resume_note=note)))
    end = a.run()
    assert isinstance(end, PointEnd) and end.notes == [note]
    quiet = _attempt(tmp_path / "q")
    Stages(quiet, _trainer(_result()))
    assert quiet.run().notes == []  # nothing skipped: nothing said
