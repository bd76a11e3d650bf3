"""Calibration of the communication model on a link of known speed (docs/design.md, "Projection"):
gloo ranks in network namespaces of their own, each rank's egress shaped by `tc tbf` to a known
rate well below what these CPUs push over TCP; the alpha-beta fit of all-reduces on 2 and 3 ranks
is compared with the imposed rate, and its prediction of 4 ranks (held out of the fit: twice the
smallest fitted size, past the largest) with what they measured. As root:

    .venv/bin/python -m benchmarks.bench_link [--rate-mbit 200] [--ranks 4]

The last line: bandwidth_error=<fraction> heldout_error=<fraction> (goal: each under 0.10);
bandwidth_error is against the imposed rate's TCP payload (95.6% of the frames tbf counts), the
error against the frame rate itself is printed above it.
"""

from __future__ import annotations

import argparse
import sys
import time

from tests.support import link


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rate-mbit", type=float, default=200.0)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    why = link.why_not()
    if why:
        print(f"cannot emulate a link here: {why}", file=sys.stderr)
        raise SystemExit(2)
    t0 = time.perf_counter()
    cal = link.measure(args.rate_mbit, args.ranks, reps=args.reps)
    print(
        f"{'ranks':>5} {'size MB':>8} {'measured s':>11} {'model s':>9} {'error':>7}  (fit on {cal.fit_ranks})"
    )
    for r in cal.rows:
        pred = cal.predicted_s(r)
        tag = "fit" if r["ranks"] in cal.fit_ranks else "held out"
        err = (pred - r["seconds"]) / r["seconds"]
        print(
            f"{r['ranks']:>5} {r['size'] / 1e6:>8.3f} {r['seconds']:>11.4f} {pred:>9.4f} {err:>+7.1%}  {tag}"
        )
    imposed = cal.imposed_bytes_s
    print(
        f"imposed {args.rate_mbit:g} Mbit/s = {imposed / 1e6:.2f} MB/s on each rank's egress (tc tbf, Ethernet frames); "
        f"TCP payload at MTU 1500 is {link.TCP_EFFICIENCY:.1%} of it ({imposed * link.TCP_EFFICIENCY / 1e6:.2f} MB/s); "
        f"fitted bus bandwidth {cal.fit.busbw / 1e6:.2f} MB/s, alpha {cal.fit.alpha_s * 1e6:.0f} us a step"
        + (f" ({cal.fit.bound} held at 0)" if cal.fit.bound else "")
    )
    print(
        f"fitted vs the payload rate: {cal.bandwidth_error:.1%} off; vs the imposed frame rate: "
        f"{cal.raw_bandwidth_error:.1%} (TCP/IP/Ethernet headers: {1 - link.TCP_EFFICIENCY:.1%})"
    )
    print(f"no latency imposed (netem is not in this kernel); {time.perf_counter() - t0:.1f} s in all")
    print(f"bandwidth_error={cal.bandwidth_error:.3f} heldout_error={cal.heldout_error:.3f}")


if __name__ == "__main__":
    main()
