"""The communication model calibrated on a link of known speed (docs/design.md, "Projection"):
gloo ranks in network namespaces made here, each rank's egress shaped by tc tbf; the fit on 2
and 3 ranks recovers the imposed rate and predicts 4 ranks (held out: twice the
smallest fitted, past the largest). Needs root: skips with
the reason elsewhere, except under CI=true, where it fails."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support import link


def _need_namespaces() -> None:
    why = link.why_not()
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must calibrate on an emulated link: {why}")
    pytest.skip(why)


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def test_namespaces_are_removed_on_failure() -> None:
    _need_namespaces()
    with pytest.raises(RuntimeError, match="boom"), link.emulated_link(2, 100, prefix="sqlinkfail") as made:
        assert made.ns(0) in _namespaces() and made.hub in _namespaces()
        raise RuntimeError("boom")
    assert "sqlinkfail" not in _namespaces()


@pytest.mark.timed  # transfer times on a shaped link: niced beside the suite's load, a rank that
# waits for a core stretches them (a held-out error of 13% once, against a bound of 10%)
def test_fit_recovers_the_imposed_rate_and_predicts_held_out_ranks() -> None:
    _need_namespaces()
    cal = link.measure(rate_mbit=200, ranks=4, fit_ranks=(2, 3), reps=5)
    assert {r["ranks"] for r in cal.rows} == {2, 3, 4}
    # the payload rate is 95.6% of the shaped frames' rate: the fit is expected near it
    assert cal.bandwidth_error < 0.10, (cal.fit.busbw, cal.payload_bytes_s)
    assert cal.raw_bandwidth_error < 0.15, (cal.fit.busbw, cal.imposed_bytes_s)
    assert cal.fit.busbw < cal.imposed_bytes_s * 1.02
    assert cal.heldout_error < 0.10, [(r, cal.predicted_s(r)) for r in cal.heldout]
    assert "sqlink" not in _namespaces()
