"""Harness overhead, measured side by side in one run (issue: goal >= 0.98 and >= 0.99):

  pipeline job tokens/s  /  bare DeepSpeed loop tokens/s      (same model, ds_config, data)
  pipeline job tokens/s with MLflow logging  /  with tracking.enabled=false

Each variant is a real 2-rank gloo run on this machine. The variants are interleaved over
several rounds (A B C, A B C, ...) and each is summarised by the median over rounds, so a
noisy neighbour hits all of them alike. Run: .venv/bin/python -m benchmarks.bench_overhead
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from tests.support.helpers import PY, launch_ranks, write_spec

MODEL = [
    "model=tiny",
    "model.hidden=256",
    "model.n_layers=4",
    "model.n_heads=8",
    "model.n_kv_heads=8",
    "model.ffn_hidden=688",
    "model.vocab_size=2048",
    "model.seq_len=128",
    "precision=fp32",
    "parallelism=zero2",
    "drill=none",
    "train.warmup_steps=5",
    "train.measure_comm=false",
    "train.measure_ceiling=false",
]


def pipeline_tokens_per_s(tmp: Path, uri: str, steps: int, tracking: bool, tag: str) -> float:
    point = tmp / tag
    spec = write_spec(
        tmp, point, [*MODEL, f"train.steps={steps}", f"tracking.enabled={str(tracking).lower()}"], uri, tag
    )
    results = launch_ranks(spec, timeout=900)
    outcome = json.loads((point / "outcome.json").read_text())
    assert outcome["outcome"] == "accepted", (outcome, results[0].stdout[-2000:])
    return float(outcome["metrics"]["perf/tokens_per_s"])


def bare_tokens_per_s(tmp: Path, uri: str, steps: int, tag: str) -> float:
    spec = write_spec(tmp, tmp / tag, [*MODEL, f"train.steps={steps}"], uri, tag)
    results = launch_ranks(spec, timeout=900, command=[PY, "-m", "benchmarks.bare_loop"])
    outs = [r.stdout for r in results]
    line = next(ln for ln in outs[0].splitlines() if ln.startswith("BARE "))
    return float(json.loads(line[5:])["tokens_per_s"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    results: dict[str, list[float]] = {"bare": [], "pipeline": [], "pipeline_no_mlflow": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        uri = f"sqlite:///{tmp / 'mlruns.db'}"
        for r in range(args.rounds):
            results["bare"].append(bare_tokens_per_s(tmp, uri, args.steps, f"bare{r}"))
            results["pipeline"].append(pipeline_tokens_per_s(tmp, uri, args.steps, True, f"pipe{r}"))
            results["pipeline_no_mlflow"].append(
                pipeline_tokens_per_s(tmp, uri, args.steps, False, f"nomlf{r}")
            )
            print(
                f"round {r + 1}: " + "  ".join(f"{k}={v[-1]:.0f} tok/s" for k, v in results.items()),
                flush=True,
            )
    med = {k: statistics.median(v) for k, v in results.items()}
    print()
    print(f"model: {' '.join(MODEL[1:8])}; 2 ranks, gloo, {args.steps} steps, median of {args.rounds} rounds")
    for k, v in med.items():
        print(f"  {k:<20} {v:>10.0f} tokens/s")
    harness = med["pipeline"] / med["bare"]
    logging = med["pipeline"] / med["pipeline_no_mlflow"]
    print(f"harness overhead: pipeline / bare DeepSpeed = {harness:.3f}  (goal >= 0.98)")
    print(f"MLflow logging:   on / off                 = {logging:.3f}  (goal >= 0.99)")


if __name__ == "__main__":
    main()
