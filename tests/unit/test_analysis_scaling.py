"""Scaling series in the analysis: a simulated pair of candidates, a faster GPU on a slower fabric
and a slower GPU on a faster one, measured at 4 and 8 GPUs; linear scaling ranks them one way,
the fitted model the other at 256 GPUs, and the report says where the ranking changes."""

from __future__ import annotations

import math

import pytest

from analysis.projection import Target, project_candidate
from analysis.runs import RunRecord
from analysis.scaling import fit_series, ranking_change
from pipeline.contract.outcome import Outcome
from pipeline.measure.comm import bus_factor
from pipeline.tracking import keys as K

PSI = 2e9  # bytes of a 1B-parameter model in bf16
CALLS = 4  # DeepSpeed's bucket messages per collective
TOKENS_PER_STEP_PER_GPU = 4 * 4096


def _op_time(op: str, n: int, alpha: float, beta: float) -> float:
    """By hand, ring (Thakur et al. 2005): all-reduce 2(n-1) steps of S/n bytes per message,
    all-gather n-1; CALLS messages of PSI / CALLS bytes each."""
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    return CALLS * steps * alpha + steps * PSI / n * beta


def _point(candidate: str, n: int, compute: float, alpha: float, beta: float) -> RunRecord:
    """A run as the job logs it: ZeRO-2 as DeepSpeed issues it (all-reduce + all-gather of PSI)."""
    t_ar, t_ag = _op_time("all_reduce", n, alpha, beta), _op_time("all_gather", n, alpha, beta)
    step = compute + 0.1 + 0.02 + t_ar + t_ag  # + the optimizer step, the skew
    metrics = {
        K.PERF_TIMED_STEP_S: step,
        K.PERF_COMPUTE_S: compute,
        K.PERF_OPTIMIZER_S: 0.1,
        K.COMM_EXPOSED_S: t_ar + t_ag + 0.02,  # + waits for late ranks, not transfers
        K.COMM_SKEW_S: 0.02,
        K.PERF_TOKENS_PER_S: TOKENS_PER_STEP_PER_GPU * n / step,
        K.CKPT_STALL_S: 5.0,
        K.TIME_STARTUP_S: 60.0,
        K.ATTEMPTS: 1.0,
    }
    for op, t, factor in (("all_reduce", t_ar, 2 * (n - 1) / n), ("all_gather", t_ag, (n - 1) / n)):
        metrics[K.comm_step_op_bytes(op)] = PSI
        metrics[K.comm_step_op_calls(op)] = CALLS
        metrics[K.comm_step_op_busbw(op)] = PSI * factor / t / 1e9
    tags = {
        K.TAG_OUTCOME: Outcome.ACCEPTED,
        K.TAG_GPUS: str(n),
        K.TAG_CANDIDATE: f"{candidate}-1x{n}",  # the size is part of the candidate
        K.TAG_SERIES: f"sweep/{candidate}",  # and not of its series
    }
    return RunRecord(f"{candidate}-{n}", "p", "FINISHED", 0, tags, {}, metrics)


FAST_GPU = dict(compute=1.0, alpha=100e-6, beta=1 / 12.5e9)  # slower fabric
FAST_NET = dict(compute=1.25, alpha=10e-6, beta=1 / 25e9)  # slower GPU


def _runs(name: str, spec: dict, sizes: tuple[int, ...] = (4, 8)) -> list[RunRecord]:
    return [_point(name, n, **spec) for n in sizes]


def test_the_fit_recovers_the_fabric_and_the_points() -> None:
    s = fit_series("h100", _runs("h100", FAST_GPU))
    assert s is not None and s.fit is not None and s.model is not None
    assert s.fit.alpha_s == pytest.approx(100e-6, rel=1e-6)
    assert s.fit.busbw == pytest.approx(12.5e9, rel=1e-6)
    assert all(abs(r) < 1e-9 for r in s.residuals.values())
    assert [p.gpus for p in s.points] == [4, 8]
    # efficiency at 8 GPUs by hand: (step - exposed) / step
    comm8 = _op_time("all_reduce", 8, 100e-6, 1 / 12.5e9) + _op_time("all_gather", 8, 100e-6, 1 / 12.5e9)
    assert s.points[1].efficiency == pytest.approx(1.12 / (1.12 + comm8))
    assert s.model.efficiency(8) == pytest.approx(s.points[1].efficiency)


def test_the_decision_follows_the_model_not_linear_scaling() -> None:
    a, b = _runs("h100", FAST_GPU), _runs("a100", FAST_NET)
    sa, sb = fit_series("h100", a), fit_series("a100", b)
    assert sa is not None and sb is not None and sa.model is not None and sb.model is not None
    # at the measured 8 GPUs the faster GPU has the higher throughput per GPU: linear scaling
    # (the same per-GPU throughput at any size) would pick it at any size and price
    assert sa.points[1].tokens_per_s_per_gpu > sb.points[1].tokens_per_s_per_gpu  # type: ignore[operator]
    target = Target(gpus=256, tokens=1e10)
    pa, pb = project_candidate("h100", a, target, 2.0), project_candidate("a100", b, target, 2.0)
    assert pa.mid is not None and pb.mid is not None
    assert pb.mid.cost_usd < pa.mid.cost_usd  # type: ignore[operator]
    for p in (pa, pb):
        assert "linear scaling assumed" not in str(p.inputs)
        assert "the fitted scaling model" in p.inputs["work_s"][1]
    line = ranking_change(sa, sb, (2.0, 2.0), 256)
    assert line is not None
    assert line.startswith("h100 wins on cost per token at 8 GPUs (measured); at 256 GPUs a100 wins")

    # the crossover by hand: the smallest n where h100's step is no longer the shorter
    def step(spec: dict, n: int) -> float:
        comm = sum(_op_time(op, n, spec["alpha"], spec["beta"]) for op in ("all_reduce", "all_gather"))
        return float(spec["compute"]) + 0.12 + comm

    n = next(n for n in range(8, 257) if step(FAST_GPU, n) >= step(FAST_NET, n))
    assert line.endswith(f"the ranking changes at {n} GPUs (fitted model)")
    assert ranking_change(sa, sb, (2.0, 2.0), 8) is None  # no larger target: nothing to say


def test_one_size_gets_its_bandwidth_and_a_wider_band() -> None:
    one = fit_series("h100", _runs("h100", FAST_GPU, sizes=(8,)))
    two = fit_series("h100", _runs("h100", FAST_GPU))
    assert one is not None and one.model is not None and one.fit is not None and two is not None
    assert one.label == "scaling measured at 1 size"
    assert one.fit.alpha_s == 0.0  # alpha and beta cannot be told apart at one size
    at = one.per_gpu_at(256)
    assert at is not None and at[1] < at[0] < at[2]
    p = project_candidate("h100", _runs("h100", FAST_GPU, sizes=(8,)), Target(gpus=256, tokens=1e10), 2.0)
    assert "scaling measured at 1 size" in p.inputs["tokens_per_s_per_gpu_at_target"][1]


def test_a_run_without_the_split_is_projected_linearly() -> None:
    r = _point("l40s", 8, **FAST_GPU)
    bare = RunRecord(
        "r", "p", "FINISHED", 0, r.tags, {}, {k: v for k, v in r.metrics.items() if "comm/" not in k}
    )
    assert fit_series("l40s", [bare]) is None
    p = project_candidate("l40s", [bare], Target(gpus=256, tokens=1e10), 2.0)
    assert p.inputs["work_s"][1].endswith("linear scaling assumed")


def test_the_report_section_shows_each_series_and_the_change() -> None:
    from types import SimpleNamespace

    from analysis import plots
    from analysis.scaling import scaling_section
    from pipeline.measure.cost import Price

    price = Price(2.0, "2026-11-01", "illustrative")
    rows = [  # as the report builds them: one row per candidate, i.e. per size
        SimpleNamespace(candidate=r.candidate, runs=[r], model="llama-1b", method="full", price=price)
        for c, spec in (("h100", FAST_GPU), ("a100", FAST_NET))
        for r in _runs(c, spec)
    ]
    # the projection of each row uses its whole series (both sizes)
    from analysis.projection import project_rows

    for _, p in project_rows(rows, Target(gpus=256, tokens=1e10)):
        assert "scaling measured at 2 sizes (4, 8 GPUs)" in p.inputs["tokens_per_s_per_gpu_at_target"][1]
    ranked = [p.candidate for _, p in project_rows(rows, Target(gpus=256, tokens=1e10))]
    assert ranked[0].startswith("a100") and ranked[-1].startswith("h100")
    blocks, notes = scaling_section(rows, 256)
    (table,) = [b for b in blocks if isinstance(b, plots.Table)]
    assert [r[1] for r in table.rows] == ["4", "8", "256 (target)"] * 2
    assert table.rows[2][5] == "scaling measured at 2 sizes (4, 8 GPUs)"
    (plot,) = [b for b in blocks if isinstance(b, plots.Plot)]
    assert plot.png and plot.png.startswith(b"\x89PNG")
    assert len(notes) == 1 and "a100 wins" in notes[0]
    assert scaling_section(
        [SimpleNamespace(candidate="x", runs=[], model="m", method="full", price=None)], 8
    ) == ([], [])


def test_nodes_make_candidates_of_one_series() -> None:
    from pipeline.config.resolved import candidate_name, series_name
    from tests.support.helpers import compose

    one, two = compose(["parallelism.nodes=1"]), compose(["parallelism.nodes=2"])
    assert candidate_name(one) != candidate_name(two)
    assert series_name(one) == series_name(two) == candidate_name(one).replace("-1x2-", "-")


def test_the_bucket_probe_separates_alpha_from_beta_at_one_size() -> None:
    """One size whose step collectives cannot separate alpha from beta (all-reduce and all-gather
    in CALLS messages of PSI / CALLS each), plus the probe's all-gather at the whole partition
    (ZeRO-1/2's real message, one call of PSI: by hand 7 alpha + 7/8 PSI beta at 8 ranks): the fit
    recovers alpha and beta."""
    alpha, beta = FAST_GPU["alpha"], FAST_GPU["beta"]
    run = _point("h100", 8, **FAST_GPU)
    t = 7 * alpha + 7 / 8 * PSI * beta
    run.metrics[K.comm_bucket_op_bytes("all_gather")] = PSI
    run.metrics[K.comm_bucket_op_busbw("all_gather")] = PSI * 7 / 8 / t / 1e9
    s = fit_series("h100", [run])
    assert s is not None and s.fit is not None
    assert s.fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert s.fit.busbw == pytest.approx(1 / beta, rel=1e-6)
    assert s.fit.samples == 3  # the step's two collectives and the probe's message
    assert s.label == "scaling measured at 1 size"
    # the probe's message is a point of the fit, not a collective of the step
    assert len(s.points[0].collectives) == 2 * CALLS


def _with(run: RunRecord, params: dict[str, str], **metrics: float) -> RunRecord:
    return RunRecord(run.run_id, run.name, run.status, 0, run.tags, params, {**run.metrics, **metrics})


def test_a_series_whose_compute_changes_is_refused_not_absorbed() -> None:
    """The local 1x2 / 1x4 series on 2 cores: 4 ranks doubled compute per rank. The model keeps
    each size's compute (its own points within 10%: here exactly), and refuses to extrapolate."""
    cv = {K.PERF_STEP_CV: 0.05}
    runs = [
        _with(_point("cpu", 2, 1.0, **{k: FAST_GPU[k] for k in ("alpha", "beta")}), {"parallelism.gpus_per_node": "2", "partition.gpu_type": "cpu"}, **cv),
        _with(_point("cpu", 4, 2.1, **{k: FAST_GPU[k] for k in ("alpha", "beta")}), {"parallelism.gpus_per_node": "4", "partition.gpu_type": "cpu"}, **cv),
    ]  # fmt: skip
    s = fit_series("cpu", runs)
    assert s is not None and s.model is not None
    for pt in s.points:  # each measured point from its own compute: within 10%
        assert abs(s.residuals[pt.gpus]) / pt.step_s < 0.10
    assert (
        s.beyond == 4
        and "compute per rank changed from 1.12 s at 2 GPUs to 2.22 s at 4 GPUs (+98%)" in s.refused
    )
    assert "A series that would fit" in s.refused
    assert s.per_gpu_at(64) is None and s.per_gpu_at(4) is not None
    proj = project_candidate("cpu", runs, Target(gpus=64, tokens=1e10), 2.0)
    assert proj.inputs["do_not_extrapolate_beyond_gpus"][0] == 4
    assert "linear scaling assumed (the scaling series refused" in proj.inputs["work_s"][1]
    assert "tokens_per_s_per_gpu_at_target" not in proj.inputs


def test_one_node_measured_takes_the_network_from_the_datasheet_as_assumed() -> None:
    params = {"parallelism.gpus_per_node": "8", "partition.gpu_type": "h100"}
    runs = [_with(r, params) for r in _runs("h100", FAST_GPU)]  # 4 and 8 GPUs, one node each
    s = fit_series("h100", runs)
    assert s is not None and s.links is not None and s.links.inter is not None
    assert s.links.inter.busbw == pytest.approx(0.8 * 8 * 400e9 / 8)  # 8 x 400 Gb/s at 80%
    assert any("inter-node level from the h100 datasheet, assumed" in a for a in s.assumed)
    assert s.per_gpu_at(256) is not None
    p = project_candidate("h100", runs, Target(gpus=256, tokens=1e10), 2.0)
    assert "h100 datasheet, assumed" in p.inputs["scaling_assumed"][1]
    assert "compute per rank at 4, 8 GPUs" in p.inputs["scaling_measured"][1]
    # the partition's own NICs win over the datasheet
    own = [_with(r, {**params, "partition.nics_per_node": "4", "partition.nic_gbps": "200"}) for r in runs]
    s = fit_series("h100", own)
    assert s is not None and s.links is not None and s.links.inter is not None
    assert s.links.inter.busbw == pytest.approx(0.8 * 4 * 200e9 / 8)
    # a CPU partition has no network figure: not past one node
    cpu = [_with(r, {"parallelism.gpus_per_node": "8", "partition.gpu_type": "cpu"}) for r in runs]
    s = fit_series("cpu", cpu)
    assert s is not None and s.beyond == 8 and "do not extrapolate beyond 8 GPUs (one node)" in s.refused


def test_size_classes_split_the_buckets_from_the_small_calls() -> None:
    from analysis.scaling import size_classes

    # two 427,264-byte buckets and the loss's 8-byte all-reduce: not three calls of 284,845
    assert size_classes(2 * 427_264 + 8, 3, 427_264) == ((427_264, 2), (8.0, 1))
    assert size_classes(3 * 1000, 3, 1000) == ((1000.0, 3),)  # all buckets: one class
    assert size_classes(900, 3, None) == ((300.0, 3),)  # no bucket logged: the mean


def test_the_exposed_share_is_what_the_timed_step_lost() -> None:
    from analysis.scaling import exposed_share

    def run(timed: float, p50: float, cv: float) -> RunRecord:
        return RunRecord(
            "r",
            "p",
            "FINISHED",
            0,
            {},
            {},
            {K.PERF_TIMED_STEP_S: timed, K.PERF_STEP_P50_S: p50, K.PERF_STEP_CV: cv},
        )

    # a GPU: the timer synchronized around 0.5 s of collectives and the step lost 0.3 s of overlap
    assert exposed_share([run(1.3, 1.0, 0.02)], 0.5) == pytest.approx(1 - 0.3 / 0.5)
    # gloo blocks anyway: the timed step no slower than the untimed ones (the local series here)
    assert exposed_share([run(0.0231, 0.0255, 0.13)], 0.0028) == 1.0
    assert exposed_share([run(1.01, 1.0, 0.02)], 0.5) == 1.0  # within 2 x CV: noise
    assert exposed_share([run(1.0, math.nan, 0.0)], 0.5) is None


def test_the_overlap_bound_is_stated_where_backward_cannot_hide_it() -> None:
    from analysis.scaling import overlap_bound

    # 8 GPUs measured with 60% of the communication hidden; at 4096 GPUs the communication to
    # hide is more than the backward pass (2/3 of compute)
    runs = [
        _with(r, {}, **{K.PERF_STEP_P50_S: r.metrics[K.PERF_TIMED_STEP_S] - 0.6 * (r.metrics[K.COMM_EXPOSED_S] - 0.02), K.PERF_STEP_CV: 0.001})
        for r in _runs("h100", dict(compute=1.0, alpha=100e-6, beta=1 / 12.5e9))
    ]  # fmt: skip
    s = fit_series("h100", runs)
    assert s is not None and s.model is not None
    assert dict(s.points[-1].shares)["all_reduce"] == pytest.approx(0.4)
    assert overlap_bound(s, 8) is None
    line = overlap_bound(s, 4096)
    assert line is not None and "the backward pass holds 0.667 s" in line


def test_one_node_and_two_nodes_fit_each_level_apart() -> None:
    """1x2 and 2x2 (parallelism.gpus_per_node=2), plus 4x2: each point's all-reduce and
    all-gather timed as the hierarchical collective costs them by hand, on an intra-node link
    of 20 us / 100 GB/s and a node network of 200 us / 10 GB/s; the fit recovers both levels, and
    a one-level fit of the same points would not."""
    intra, inter = (20e-6, 1 / 100e9), (200e-6, 1 / 10e9)

    def hier(op: str, n: int, size: float = PSI / CALLS, calls: int = CALLS) -> float:  # g = 2
        g = 2
        m = n // g
        k = 2 if op == "all_reduce" else 1
        t = k * (g - 1) * intra[0] + k * (g - 1) / g * size * intra[1]
        if m > 1:
            t += k * (m - 1) * inter[0] + k * (m - 1) / m * size * inter[1]
        return calls * t

    runs = []
    for n in (2, 4, 8):
        base = _point("h100", n, 1.0, 1e-6, 1e-12)
        metrics = dict(base.metrics)
        for op in ("all_reduce", "all_gather"):
            metrics[K.comm_step_op_busbw(op)] = PSI * bus_factor(n, op) / hier(op, n) / 1e9
        metrics[K.COMM_EXPOSED_S] = hier("all_reduce", n) + hier("all_gather", n) + 0.02
        metrics[K.PERF_TIMED_STEP_S] = 1.0 + 0.1 + metrics[K.COMM_EXPOSED_S]
        # the probe's all-gather of the whole partition (one call of PSI): a second message size
        metrics[K.comm_bucket_op_bytes("all_gather")] = PSI
        metrics[K.comm_bucket_op_busbw("all_gather")] = (
            PSI * bus_factor(n, "all_gather") / hier("all_gather", n, PSI, 1) / 1e9
        )
        runs.append(_with(RunRecord(base.run_id, base.name, base.status, 0, base.tags, {}, metrics), {"parallelism.gpus_per_node": "2", "partition.gpu_type": "h100"}))  # fmt: skip
    s = fit_series("h100", runs)
    assert s is not None and s.links is not None and s.links.inter is not None and s.fit is not None
    assert s.fit.alpha_s == pytest.approx(intra[0], rel=1e-6) and s.fit.busbw == pytest.approx(
        1 / intra[1], rel=1e-6
    )
    assert s.links.inter.alpha_s == pytest.approx(inter[0], rel=1e-6)
    assert s.links.inter.busbw == pytest.approx(1 / inter[1], rel=1e-6)
    assert "intra-node and inter-node alpha/beta, fitted apart (2 GPUs a node)" in s.measured
    assert s.assumed == [a for a in s.assumed if "datasheet" not in a]  # the network was measured
    assert all(abs(r) < 1e-9 for r in s.residuals.values())
