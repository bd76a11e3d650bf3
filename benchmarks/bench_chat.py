"""Padding against packing on a chat set with a long tail, side by side in one run (issue #45;
goal: the packed/padded ratio of loss-bearing tokens/s reaches >= 0.9 of its ceiling).

The chat set (tests/support/chat_fixtures.py, text that ships with Python): many short answers,
one in ten long, rendered through a ChatML template, the loss on the answers only. Both variants
are real 2-rank gloo jobs through the pipeline's entry, same model, same micro-batch (so the same
worst-case rows: a padded micro-batch may hold the longest sample, a packed one always holds
model.seq_len positions), interleaved over rounds and summarised by the median over rounds.

  data/loss_tokens_per_s of each, and their ratio packed / padded
  data/padding_efficiency of each (real tokens / positions computed)
  the ceiling of the ratio: positions a padded run computes / real tokens = 1 / its efficiency
  (packing can at best stop computing the padding); the ratio as a fraction of that ceiling
Run: .venv/bin/python -m benchmarks.bench_chat [--rounds 3 --steps 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from benchmarks.bench_overhead import MODEL
from tests.support.chat_fixtures import as_format, chat_tokenizer, skewed_conversations, write_jsonl
from tests.support.helpers import launch_ranks, write_spec

KEYS = ("data/loss_tokens_per_s", "data/padding_efficiency", "data/real_tokens_per_s", "perf/tokens_per_s")
SHAPE = ["model.vocab_size=384", "model.seq_len=256", "parallelism.micro_batch=8", "data.num_workers=1"]


def run(tmp: Path, uri: str, steps: int, data: list[str], tag: str) -> dict[str, float]:
    point = tmp / tag
    ovs = [*MODEL, *SHAPE, f"train.steps={steps}", "tracking.enabled=false", *data]
    results = launch_ranks(write_spec(tmp, point, ovs, uri, tag), timeout=1200)
    outcome = json.loads((point / "outcome.json").read_text())
    assert outcome["outcome"] in ("accepted", "failed"), (outcome, results[0].stdout[-2000:])
    return {k: float(v) for k, v in outcome["metrics"].items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--samples", type=int, default=2000)
    args = ap.parse_args()
    results: dict[str, dict[str, list[float]]] = {"pad": {}, "pack": {}}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        uri = f"sqlite:///{tmp / 'mlruns.db'}"
        tok = chat_tokenizer(tmp, "chatml")
        convs = skewed_conversations(args.samples, seed=3, tail_words=120)
        path = write_jsonl(tmp / "data" / "chat.jsonl", [as_format(c, "messages") for c in convs])
        data = ["data=chat", f"data.path={path}", f"data.tokenizer={tok}"]
        for r in range(args.rounds):
            for name in results:
                m = run(tmp, uri, args.steps, [*data, f"data.packing={name}"], f"{name}{r}")
                for k in KEYS:
                    results[name].setdefault(k, []).append(m[k])
            print(
                f"round {r + 1}: "
                + "  ".join(
                    f"{n}: {v['data/loss_tokens_per_s'][-1]:.0f} loss tok/s" for n, v in results.items()
                ),
                flush=True,
            )
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in results.items()}
    print()
    print(
        f"model: {' '.join(MODEL[1:7])} {' '.join(SHAPE)}; 2 ranks, gloo, {args.steps} steps, "
        f"median of {args.rounds} rounds; {args.samples} conversations, one in ten long"
    )
    for n, v in med.items():
        print(
            f"  {n:<5} loss-bearing {v['data/loss_tokens_per_s']:>8.0f} tok/s  real {v['data/real_tokens_per_s']:>8.0f}"
            f"  positions {v['perf/tokens_per_s']:>8.0f}  padding efficiency {v['data/padding_efficiency']:.3f}"
        )
    ratio = med["pack"]["data/loss_tokens_per_s"] / med["pad"]["data/loss_tokens_per_s"]
    ceiling = 1 / med["pad"]["data/padding_efficiency"]
    print(f"loss-bearing tokens/s, packed / padded:  {ratio:.3f}")
    print(f"ceiling (padded positions / real tokens): {ceiling:.3f}")
    print(f"ratio / ceiling:                          {ratio / ceiling:.3f}  (goal >= 0.9)")


if __name__ == "__main__":
    main()
