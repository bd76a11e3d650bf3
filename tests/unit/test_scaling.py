"""The communication model: ZeRO volumes per stage against the ZeRO paper's, the alpha-beta fit
against known alpha and beta, and a pair of candidates whose ranking flips with scale."""

from __future__ import annotations

import random

import pytest

from pipeline.measure.scaling import (
    AlphaBeta,
    Collective,
    StepModel,
    Timing,
    crossover,
    fit_alpha_beta,
    one_size_band,
    wire_bytes_per_rank,
    zero_collectives,
)

PSI = 1e9  # bytes of parameters (and of gradients, same dtype)


@pytest.mark.parametrize(
    ("stage", "volume"),
    # ZeRO paper, section 7.2: data parallel 2 Psi, P_os+g 2 Psi, P_os+g+p 3 Psi per rank; on a
    # ring each Psi is (n-1)/n of the buffer (nccl-tests' bus factor): 8 ranks -> 7/8 Psi each
    [(0, 2 * PSI * 7 / 8), (1, 2 * PSI * 7 / 8), (2, 2 * PSI * 7 / 8), (3, 3 * PSI * 7 / 8)],
)
def test_zero_volumes_per_stage_match_the_paper(stage: int, volume: float) -> None:
    assert wire_bytes_per_rank(zero_collectives(stage, PSI), 8) == pytest.approx(volume)


def test_zero_collectives_are_the_documented_ones() -> None:
    assert [c.op for c in zero_collectives(0, PSI)] == ["all_reduce"]
    assert [(c.op, c.phase) for c in zero_collectives(2, PSI)] == [
        ("reduce_scatter", "backward"),
        ("all_gather", "after step"),
    ]
    assert [(c.op, c.phase) for c in zero_collectives(3, PSI)] == [
        ("all_gather", "forward"),
        ("all_gather", "backward"),
        ("reduce_scatter", "backward"),
    ]
    assert wire_bytes_per_rank(zero_collectives(3, PSI), 1) == 0.0  # one rank moves nothing


@pytest.mark.parametrize("bad", [4, -1, "2", None])
def test_bad_stage(bad: object) -> None:
    with pytest.raises(ValueError, match="ZeRO stage"):
        zero_collectives(bad, PSI)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_bytes(bad: float) -> None:
    with pytest.raises(ValueError, match="bytes"):
        zero_collectives(1, bad)


def _ring(op: str, size: float, n: int, alpha: float, beta: float) -> float:
    """By hand (Thakur et al. 2005): ring all-reduce 2(n-1) steps of S/n bytes each, all-gather
    and reduce-scatter n-1 steps of S/n bytes each."""
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    return steps * alpha + steps * (size / n) * beta


def test_fit_recovers_alpha_and_beta_within_2_percent() -> None:
    alpha, beta = 25e-6, 1 / 40e9  # 25 us per step, 40 GB/s bus bandwidth
    rng = random.Random(7)
    timings = [
        Timing(op, size, n, _ring(op, size, n, alpha, beta) * (1 + rng.uniform(-0.01, 0.01)))
        for op in ("all_reduce", "all_gather", "reduce_scatter")
        for size in (2**20, 2**22, 2**24, 2**26, 2**28)
        for n in (2, 4, 8, 16)
    ]
    fit = fit_alpha_beta(timings)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.02)
    assert fit.beta_s_per_byte == pytest.approx(beta, rel=0.02)
    # unweighted (a series' per-step totals): the same within 2% here too
    plain = fit_alpha_beta(timings, relative=False)
    assert plain.alpha_s == pytest.approx(alpha, rel=0.02)
    assert plain.beta_s_per_byte == pytest.approx(beta, rel=0.02)
    assert fit.busbw == pytest.approx(40e9, rel=0.02)
    assert fit.samples == len(timings)
    # residuals are the noise: about 1% of each time (the fit moves a little with it)
    assert all(abs(r) <= 0.02 * t.seconds for r, t in zip(fit.residuals, timings, strict=True))


def test_fit_residual_shows_the_outlier() -> None:
    alpha, beta = 10e-6, 1 / 10e9
    timings = [
        Timing("all_gather", s, n, _ring("all_gather", s, n, alpha, beta))
        for s in (2**20, 2**24)
        for n in (2, 4)
    ]
    timings.append(Timing("all_gather", 2**22, 4, 3 * _ring("all_gather", 2**22, 4, alpha, beta)))
    fit = fit_alpha_beta(timings)
    worst = max(range(len(timings)), key=lambda i: abs(fit.residuals[i]))
    assert worst == len(timings) - 1
    assert fit.sigma_s(1.0, 0.0) > 0  # a misfit has an uncertainty


def test_fit_needs_two_settings() -> None:
    with pytest.raises(ValueError, match="cannot be told apart"):
        fit_alpha_beta([Timing("all_reduce", 2**24, 2, 0.01)] * 3)
    with pytest.raises(ValueError, match="seconds"):
        fit_alpha_beta([Timing("all_reduce", 2**24, 2, 0.0), Timing("all_reduce", 2**20, 4, 0.1)])


def _candidate(compute_s: float, alpha: float, busbw: float) -> StepModel:
    exact = AlphaBeta(alpha, 1 / busbw, ((0.0, 0.0), (0.0, 0.0)), (), 0)
    return StepModel(compute_s, zero_collectives(2, 2 * 1.3e9), exact)  # llama-1b-ish, bf16


def test_faster_gpu_on_a_slower_fabric_loses_at_scale() -> None:
    # a: 20% faster compute, a fabric with 10x the latency; b: slower GPU, better fabric
    a = _candidate(1.00, 200e-6, 20e9)
    b = _candidate(1.20, 20e-6, 25e9)
    # at the qualification size (8 GPUs) a is faster: linear scaling would pick a at any size
    assert a.step_s(8) < b.step_s(8)
    assert a.step_s(256) > b.step_s(256)
    n = crossover(a, b, 8, 256)
    assert n is not None and 8 < n <= 256
    # by hand: a's extra latency steps cost 180 us each, a's extra bytes cost per rank
    # 2 x 2.6e9 x (n-1)/n x (1/20e9 - 1/25e9); the crossover is where that outweighs 0.2 s
    steps = lambda m: 2 * 3 * (m - 1)  # noqa: E731 (reduce-scatter + all-gather, 3 buckets of 1e9 B each)
    gap = lambda m: steps(m) * 180e-6 + 2 * 2.6e9 * (m - 1) / m * (1 / 20e9 - 1 / 25e9) - 0.2  # noqa: E731
    assert gap(n - 1) < 0 <= gap(n)
    assert crossover(a, a, 8, 256) is None


def test_bands() -> None:
    a = _candidate(1.0, 50e-6, 20e9)
    lo, hi = one_size_band(a, 64)
    assert lo < a.step_s(64) < hi
    assert hi - a.compute_s == pytest.approx(4 * (lo - a.compute_s))  # comm x 2 vs comm / 2
    assert a.efficiency(64) == pytest.approx(a.compute_s / a.step_s(64))
    assert a.band_s(64) == (a.step_s(64), a.step_s(64))  # an exact fit has no spread
    assert a.comm_s(1) == 0.0 and a.efficiency(1) == 1.0
    with pytest.raises(ValueError):
        StepModel(1.0, (Collective("all_reduce", 1e9, "backward"),), a.fit, bucket_bytes=0).comm_s(4)


def test_deepspeed_volume_of_zero_1_2() -> None:
    # DeepSpeed 0.19 all-reduces ZeRO-1/2's gradients (counted in test_scaling_deepspeed.py):
    # 2 (n-1)/n + (n-1)/n = 3 x 7/8 Psi at 8 ranks, where the paper has 2 x 7/8 Psi
    assert wire_bytes_per_rank(zero_collectives(2, PSI, volume="deepspeed"), 8) == pytest.approx(
        3 * PSI * 7 / 8
    )
    assert zero_collectives(3, PSI, volume="deepspeed") == zero_collectives(3, PSI)
    with pytest.raises(ValueError, match="volume"):
        zero_collectives(2, PSI, volume="nccl")


def test_split_step_by_hand() -> None:
    from pipeline.job.commsplit import step_metrics
    from pipeline.train.commtimer import CommCounts, split_step

    counts = CommCounts()
    counts.add("all_reduce", 4_000_000, 4, 0.02, skew_s=0.005)  # wire 4e6 x 2 x 3/4 = 6e6 bytes
    counts.add("all_gather", 4_000_000, 4, 0.01)  # wire 4e6 x 3/4 = 3e6 bytes
    # step 1.0 s, data wait 0.05 s, engine.step 0.11 s of which 0.01 s in its all-gather
    s = split_step(1.0, 0.05, 0.11, 0.01, counts)
    assert (s.exposed_s, s.optimizer_s) == pytest.approx((0.035, 0.10))  # transfers + skew
    assert s.compute_s == pytest.approx(1.0 - 0.035 - 0.10 - 0.05)
    m = step_metrics(s, 4)
    assert m["comm/skew_s"] == 0.005
    assert m["comm/step_wire_bytes"] == pytest.approx(9e6)
    assert m["comm/step_busbw_gbps"] == pytest.approx(9e6 / 0.03 / 1e9)
    assert m["comm/step_all_reduce_busbw_gbps"] == pytest.approx(6e6 / 0.02 / 1e9)
    assert m["comm/step_calls"] == 2
    # one rank: nothing on the wire, no bandwidth
    assert "comm/step_busbw_gbps" not in step_metrics(split_step(1.0, 0.0, 0.1, 0.0, CommCounts()), 1)


def test_a_negative_parameter_is_held_at_zero() -> None:
    # latency only (tiny messages), with noise that would make the free fit's beta negative;
    # alpha by hand: sum(u) / sum(u^2) x 50 us, u = 1/1.05, 1/0.95, 1 -> 49.83 us
    timings = [
        Timing("all_reduce", 1000, 2, 2 * 50e-6 * 1.05),
        Timing("all_reduce", 4000, 2, 2 * 50e-6 * 0.95),
        Timing("all_reduce", 1000, 4, 4 * 50e-6),  # under 1 MiB: a tree, 2 ceil(log2 4) = 4 steps
    ]
    fit = fit_alpha_beta(timings)
    assert fit.bound == "beta" and fit.beta_s_per_byte == 0.0 and fit.busbw == float("inf")
    assert fit.alpha_s == pytest.approx(49.83e-6, rel=1e-3)
    assert (
        fit_alpha_beta([Timing("all_gather", s, 4, 3 * 5e-6 + s * 0.75 / 1e9) for s in (2**20, 2**24)]).bound
        == ""
    )


def test_the_report_says_a_bandwidth_the_fit_did_not_resolve() -> None:
    """A fit whose per-byte time was held at 0 has no bandwidth (1 / 0): the report says so in
    words, never "inf GB/s" (a report line showed that once); a resolved one in GB/s."""
    from analysis.scaling import bandwidth_text

    flat = fit_alpha_beta(
        [Timing("all_reduce", s, 2, 2 * 50e-6 * k) for s, k in ((1000, 1.05), (4000, 0.95))]
    )
    assert (
        flat.bound == "beta" and "not resolved" in bandwidth_text(flat) and "inf" not in bandwidth_text(flat)
    )
    assert "not resolved" in bandwidth_text(None)
    # 40 GB/s by construction: 0.75 of the message per byte time on 4 ranks (the ring's (n-1)/n)
    sloped = fit_alpha_beta([Timing("all_gather", s, 4, 3 * 5e-6 + s * 0.75 / 40e9) for s in (2**20, 2**24)])
    assert bandwidth_text(sloped) == "40 GB/s"
