"""The data path's cost, measured side by side in one run (issue #12: goals <= 0.02 and >= 0.98):

  data wait share of step time with data=tokens (a token file on local disk, default workers)
  pipeline tokens/s with data=tokens  /  with data=synthetic     (same model, same ds_config)

Each variant is a real 2-rank gloo job through the pipeline's entry. The variants are
interleaved over rounds (synthetic, tokens, synthetic, tokens, ...) and each is summarised by
the median over rounds, so a noisy neighbour hits both alike. The token file is written here
(counting runs, the synthetic task's rule, so both learn alike).
Run: .venv/bin/python -m benchmarks.bench_data [--rounds 3 --steps 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from benchmarks.bench_overhead import MODEL
from tests.support.data_fixtures import learnable_tokens
from tests.support.helpers import launch_ranks, write_spec


def run(tmp: Path, uri: str, steps: int, data: list[str], tag: str) -> dict[str, float]:
    point = tmp / tag
    spec = write_spec(tmp, point, [*MODEL, f"train.steps={steps}", "tracking.enabled=false", *data], uri, tag)
    results = launch_ranks(spec, timeout=900)
    outcome = json.loads((point / "outcome.json").read_text())
    assert outcome["outcome"] == "accepted", (outcome, results[0].stdout[-2000:])
    return {k: float(v) for k, v in outcome["metrics"].items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    vocab = int(next(o for o in MODEL if o.startswith("model.vocab_size=")).split("=")[1])
    keys = ("perf/tokens_per_s", "data/wait_frac", "data/read_tokens_per_s", "data/read_mb_per_s")
    results: dict[str, dict[str, list[float]]] = {"synthetic": {}, "tokens": {}}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        uri = f"sqlite:///{tmp / 'mlruns.db'}"
        tokens = learnable_tokens(tmp / "train.bin", 2_000_000, vocab=vocab)
        variants = {"synthetic": ["data=synthetic"], "tokens": ["data=tokens", f"data.path={tokens}"]}
        for r in range(args.rounds):
            for name, data in variants.items():
                m = run(tmp, uri, args.steps, data, f"{name}{r}")
                for k in keys:
                    if k in m:
                        results[name].setdefault(k, []).append(m[k])
            print(
                f"round {r + 1}: "
                + "  ".join(
                    f"{n}: {v['perf/tokens_per_s'][-1]:.0f} tok/s, wait {v['data/wait_frac'][-1]:.2%}"
                    for n, v in results.items()
                ),
                flush=True,
            )
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in results.items()}
    print()
    print(f"model: {' '.join(MODEL[1:8])}; 2 ranks, gloo, {args.steps} steps, median of {args.rounds} rounds")
    for n, v in med.items():
        read = f"{v['data/read_tokens_per_s']:.3g} tok/s" + (
            f", {v['data/read_mb_per_s']:.3g} MB/s" if "data/read_mb_per_s" in v else ""
        )
        print(
            f"  {n:<10} {v['perf/tokens_per_s']:>8.0f} tokens/s  data wait {v['data/wait_frac']:.2%}  loader {read}"
        )
    print(f"data wait share, data=tokens:          {med['tokens']['data/wait_frac']:.4f}  (goal <= 0.02)")
    ratio = med["tokens"]["perf/tokens_per_s"] / med["synthetic"]["perf/tokens_per_s"]
    print(f"tokens/s, data=tokens / synthetic:     {ratio:.3f}  (goal >= 0.98)")


if __name__ == "__main__":
    main()
