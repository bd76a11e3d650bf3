"""Two levels of fabric, overlap and compute per size (pipeline/measure/fabric.py) against hand
computations."""

from __future__ import annotations

import math

import pytest

from pipeline.measure.fabric import (
    DATASHEETS,
    FabricModel,
    TwoLevel,
    band,
    compute_change,
    exposure,
    fit_two_level,
    level_terms,
    sheet_levels,
)
from pipeline.measure.scaling import AlphaBeta, Collective, Timing

INTRA = (20e-6, 1 / 100e9)  # alpha s a step, beta s a byte
INTER = (200e-6, 1 / 10e9)


def _by_hand(op: str, size: float, n: int, g: int) -> float:
    """Hierarchical cost by hand (the docstring's phases)."""
    if n <= g:
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        wire = size * (2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n)
        return steps * INTRA[0] + wire * INTRA[1]
    m = n // g
    if op == "all_reduce":
        return (
            2 * (g - 1) * INTRA[0]
            + 2 * (g - 1) / g * size * INTRA[1]
            + 2 * (m - 1) * INTER[0]
            + 2 * (m - 1) / m * size * INTER[1]
        )
    return (
        (g - 1) * INTRA[0]
        + (g - 1) / g * size * INTRA[1]
        + (m - 1) * INTER[0]
        + (m - 1) / m * size * INTER[1]
    )


def test_level_terms_one_node_is_the_flat_ring_and_one_gpu_a_node_is_all_network() -> None:
    assert level_terms("all_reduce", 8e6, 4, 8) == ((6, 2 * 3 / 4 * 8e6), (0.0, 0.0))
    # g = 1: the intra-node phases vanish, the inter-node ring is the flat ring of n nodes
    (ai, bi), (ae, be) = level_terms("all_reduce", 8e6, 4, 1)
    assert (ai, bi) == (0, 0) and (ae, be) == (6, 2 * 3 / 4 * 8e6)
    (ai, bi), (ae, be) = level_terms("all_gather", 8e6, 16, 4)
    assert (ai, bi, ae, be) == (3, 3 / 4 * 8e6, 3, 3 / 4 * 8e6)


def test_two_levels_are_fitted_apart() -> None:
    timings = []
    for n in (2, 4, 8, 16):  # g = 4: 2 and 4 ranks one node, 8 and 16 two and four nodes
        for op, size, calls in (("all_reduce", 64e6, 4), ("all_gather", 16e6, 1), ("all_reduce", 8e6, 2)):
            timings.append(Timing(op, size * calls, n, calls * _by_hand(op, size, n, 4), calls))
    links = fit_two_level(timings, 4)
    assert links.inter is not None
    assert links.intra.alpha_s == pytest.approx(INTRA[0], rel=1e-6)
    assert links.intra.busbw == pytest.approx(1 / INTRA[1], rel=1e-6)
    assert links.inter.alpha_s == pytest.approx(INTER[0], rel=1e-6)
    assert links.inter.busbw == pytest.approx(1 / INTER[1], rel=1e-6)
    assert links.time_s("all_reduce", 64e6, 64) == pytest.approx(_by_hand("all_reduce", 64e6, 64, 4))
    # a single level over the same timings cannot tell them apart: its residuals are not 0
    flat = fit_two_level(timings, 0)
    assert flat.inter is None and max(abs(r) for r in flat.intra.residuals) > 1e-4


def test_one_size_at_one_level_holds_alpha_at_zero_with_a_note() -> None:
    t = [Timing("all_reduce", 8e6, 2, 0.01, 4)]
    links = fit_two_level(t, 2)
    assert links.intra.alpha_s == 0 and links.intra.busbw == pytest.approx(8e6 / 0.01)
    assert any("alpha held at 0" in n for n in links.notes)


def test_exposure_hides_the_measured_share_up_to_the_window() -> None:
    e = exposure({"all_reduce": 1.0, "all_gather": 0.5}, {"all_reduce": 0.25}, window_s=10.0)
    assert e.comm_s == 1.5 and e.hide_wanted_s == 0.75 and e.exposed_s == pytest.approx(0.75)
    assert not e.capped
    e = exposure({"all_reduce": 4.0}, {"all_reduce": 0.25}, window_s=1.0)
    assert e.capped and e.exposed_s == pytest.approx(3.0)  # 3 s to hide, 1 s of backward
    assert exposure({"all_reduce": 1.0}, {}, 5.0).exposed_s == 1.0  # not measured: none hidden


def test_the_model_keeps_each_measured_sizes_compute() -> None:
    links = TwoLevel(AlphaBeta(0.0, 1e-9, ((0, 0), (0, 0)), (), 0), None, 0)
    m = FabricModel(2.0, ((Collective("all_reduce", 1e6, "measured"), 3),), links, compute_at=((2, 1.0),))
    comm = 3 * 1e6 * 2 * (4 - 1) / 4 * 1e-9
    assert m.step_s(2) == pytest.approx(1.0 + 3 * 1e6 * 1e-9)
    assert m.step_s(4) == pytest.approx(2.0 + comm)
    assert m.efficiency(4) == pytest.approx(2.0 / (2.0 + comm))


def test_compute_change_beyond_the_noise_is_named() -> None:
    # the local series: 4 ranks on 2 cores doubled compute per rank; each step's CV 5%
    line = compute_change([(2, 0.021, 0.05), (4, 0.043, 0.05)])
    assert line is not None and "0.021 s at 2 GPUs to 0.043 s at 4 GPUs (+105%)" in line
    assert "+/-14%" in line  # 2 x sqrt(0.05^2 + 0.05^2)
    assert compute_change([(2, 0.021, 0.05), (4, 0.022, 0.05)]) is None  # +5%: noise
    # no noise logged: 10% assumed, and said so
    line = compute_change([(4, 1.0, None), (8, 1.4, None)])
    assert line is not None and "assumed" in line


def test_the_band_names_its_dominant_input() -> None:
    b = band(lambda x: x["a"] + 10 * x["b"], {"a": 1.0, "b": 1.0}, {"a": (0.5, 2.0), "b": (0.8, 1.2)})
    assert b.mid == 11.0 and b.dominant == "b"
    assert b.high == pytest.approx(11 + math.hypot(1.0, 2.0)) and b.low == pytest.approx(
        11 - math.hypot(0.5, 2.0)
    )
    assert sum(b.shares.values()) == pytest.approx(1.0)


def test_the_datasheet_levels() -> None:
    h100 = DATASHEETS["h100"]
    assert h100.network_bytes_s == 400e9  # 8 x 400 Gb/s
    levels = sheet_levels(h100, 1.0, 1.0)
    assert levels.intra.busbw == pytest.approx(450e9) and levels.inter is not None
    assert levels.inter.busbw == pytest.approx(400e9) and levels.gpus_per_node == 8
