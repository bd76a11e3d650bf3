"""The cost of telemetry to the step loop, measured side by side in one run (issue #17: goal
>= 0.99):

  pipeline job tokens/s with telemetry on  /  with telemetry.enabled=false

Each variant is a real 2-rank gloo run of the pipeline on this machine, with the fake NVML
(tests/support/fake_nvml.py, 2 GPUs) so the sampler does its per-GPU NVML queries as well as psutil's
host queries, every `--interval` seconds. The variants are interleaved over several rounds
(on, off, on, off, ...) and each is summarised by the median over rounds, so a noisy neighbour
hits both alike. Both variants measure the straggler score (it is not telemetry's cost).
Run: .venv/bin/python -m benchmarks.bench_telemetry [--rounds 3 --steps 60 --interval 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from benchmarks.bench_overhead import MODEL
from tests.support.helpers import launch_ranks, write_spec

ROOT = Path(__file__).resolve().parent.parent

FAKE = {"SQ_NVML_MODULE": "tests.support.fake_nvml", "SQ_FAKE_NVML_GPUS": "2", "PYTHONPATH": str(ROOT)}


def tokens_per_s(tmp: Path, uri: str, steps: int, telemetry: bool, interval: float, tag: str) -> float:
    point = tmp / tag
    overrides = [
        *MODEL,
        f"train.steps={steps}",
        f"telemetry.enabled={str(telemetry).lower()}",
        f"telemetry.interval_s={interval}",
    ]
    spec = write_spec(tmp, point, overrides, uri, tag)
    results = launch_ranks(spec, timeout=900, env=FAKE)
    outcome = json.loads((point / "outcome.json").read_text())
    assert outcome["outcome"] == "accepted", (outcome, results[0].stdout[-2000:])
    return float(outcome["metrics"]["perf/tokens_per_s"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--interval", type=float, default=1.0, help="telemetry.interval_s of the 'on' runs")
    args = ap.parse_args()
    results: dict[str, list[float]] = {"telemetry_on": [], "telemetry_off": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        uri = f"sqlite:///{tmp / 'mlruns.db'}"
        for r in range(args.rounds):
            for name, on in (
                (("telemetry_on", True), ("telemetry_off", False))
                if r % 2 == 0
                else (
                    ("telemetry_off", False),
                    ("telemetry_on", True),
                )
            ):
                results[name].append(tokens_per_s(tmp, uri, args.steps, on, args.interval, f"{name}{r}"))
            print(
                f"round {r + 1}: " + "  ".join(f"{k}={v[-1]:.0f} tok/s" for k, v in results.items()),
                flush=True,
            )
    med = {k: statistics.median(v) for k, v in results.items()}
    print()
    print(
        f"model: {' '.join(MODEL[1:8])}; 2 ranks, gloo, {args.steps} steps, median of {args.rounds} rounds, "
        f"sampling every {args.interval:g} s (fake NVML, 2 GPUs, + psutil)"
    )
    for k, v in med.items():
        print(f"  {k:<14} {v:>10.0f} tokens/s")
    print(f"telemetry: on / off = {med['telemetry_on'] / med['telemetry_off']:.3f}  (goal >= 0.99)")


if __name__ == "__main__":
    main()
