"""`qualify fit`: the memory model for every point of a sweep, nothing submitted. Per point the
breakdown per term on the device and the host, the peak, headroom and verdict, the largest
micro-batch predicted to fit with 15% and 30% headroom, and the advice."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pipeline.config.compose import compose_sweep
from pipeline.config.validate import memory_query
from pipeline.measure.memory import (
    GIB,
    HEADROOM_FITS,
    HEADROOM_TIGHT,
    advice,
    estimate,
    largest_micro_batch,
)

TIERS = (("A100-80GB", 80 * GIB), ("H200", 141 * GIB), ("B200", 180 * GIB))


def fit_points(sweep: str, overrides: Sequence[str]) -> list[dict[str, Any]]:
    out = []
    for p in compose_sweep(sweep, list(overrides)):
        q = memory_query(p.cfg)
        e = estimate(q)
        out.append(
            {
                "point": p.point_id,
                "overrides": list(p.overrides),
                "terms": [
                    {
                        "name": t.name,
                        "device_bytes": t.device_bytes,
                        "host_bytes": t.host_bytes,
                        "source": t.source,
                    }
                    for t in e.terms
                ],
                "model_states_device_bytes": e.model_states.device_bytes,
                "model_states_host_bytes": e.model_states.cpu_bytes,
                "steady_bytes": e.steady_bytes,
                "init_bytes": e.init_bytes,
                "total_bytes": e.total_bytes,
                "capacity_bytes": e.capacity_bytes,
                "headroom_frac": e.headroom_frac,
                "verdict": e.verdict,
                "host_bytes_per_node": e.host_bytes_per_node,
                "host_capacity_bytes": e.host_capacity_bytes,
                "host_verdict": e.host_verdict,
                "overall": e.overall,
                "micro_batch": q.micro_batch,
                "largest_micro_batch_15": largest_micro_batch(q, HEADROOM_TIGHT),
                "largest_micro_batch_30": largest_micro_batch(q, HEADROOM_FITS),
                "notes": list(e.reasons),
                "advice": advice(q, TIERS, now=e),
            }
        )
    return out


def render(rows: Sequence[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        host = (
            f"{r['host_bytes_per_node'] / 1e9:.1f} GB of {r['host_capacity_bytes'] / 1e9:.0f} GB ({r['host_verdict']})"
            if r["host_capacity_bytes"]
            else f"{r['host_bytes_per_node'] / 1e9:.1f} GB (node memory not set)"
        )
        lines.append(f"{r['point']}: {' '.join(r['overrides'])}")
        lines.append(f"  {'term':<18}{'device GiB':>12}{'host GiB':>10}  source")
        for t in r["terms"]:
            lines.append(
                f"  {t['name']:<18}{t['device_bytes'] / GIB:>12.2f}{t['host_bytes'] / GIB:>10.2f}  {t['source']}"
            )
        lines.append(
            f"  device peak {r['total_bytes'] / GIB:.2f} GiB of {r['capacity_bytes'] / GIB:.1f} GiB "
            f"(steady {r['steady_bytes'] / GIB:.2f}, start-up {r['init_bytes'] / GIB:.2f}), headroom "
            f"{r['headroom_frac']:.0%}: {r['verdict']}; host per node {host}; overall {r['overall']}"
        )
        lines.append(
            f"  micro-batch {r['micro_batch']}; largest predicted to fit: {r['largest_micro_batch_15']} "
            f"(15% headroom), {r['largest_micro_batch_30']} (30%)"
        )
        lines += [f"  note: {n}" for n in r["notes"]] + [f"  advice: {a}" for a in r["advice"]]
    return "\n".join(lines)


def main(sweep: str, overrides: Sequence[str], as_json: bool) -> str:
    rows = fit_points(sweep, overrides)
    return json.dumps(rows, indent=1) if as_json else render(rows)
