"""The micro-batch search inside one allocation against running each power-of-two micro-batch as
its own point (issue #13), measured side by side in one run:

  search: one 2-rank job, search.micro_batch=true, under a real per-rank memory limit
          (partition.gpu_mem_gib on CPU): doubling then bisection, one engine per trial, then the
          point's own steps at the found size
  points: one 2-rank job per power-of-two micro-batch the search doubled through, each with the
          same steps per size (process start, DeepSpeed init and MLflow run paid per point)

Prints both wall times and points / search (the search must be faster, > 1) although it also
bisects to the exact boundary, which the points do not. Run: .venv/bin/python -m benchmarks.bench_search
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from tests.support.helpers import launch_ranks, write_spec

BASE = [
    "model=tiny",
    "model.vocab_size=8192",
    "model.seq_len=256",
    "precision=fp32",
    "parallelism=zero2",
    "drill=none",
    "train.steps=2",
    "train.warmup_steps=1",
    "train.loss_bound_frac=1.0",
    "train.measure_comm=false",
    "train.measure_ceiling=false",
    "partition.gpu_mem_gib=3",
]
SEARCH = ["search.micro_batch=true", "search.start=8", "search.cap=64", "search.steps=2"]


def timed(tmp: Path, name: str, overrides: list[str]) -> float:
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    spec = write_spec(tmp, tmp / name, overrides, uri, name)
    t0 = time.perf_counter()
    out = launch_ranks(spec, timeout=1200)
    wall = time.perf_counter() - t0
    if any(p.returncode not in (0, 1) for p in out):
        raise SystemExit(f"{name} failed:\n{out[0].stdout[-3000:]}")
    return wall


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        search_s = timed(tmp, "search", BASE + SEARCH)
        res = json.loads((tmp / "search" / "search.json").read_text())
        sizes = [t["micro_batch"] for t in res["trials"]]
        doubled = [b for b in sizes if b >= 8 and (b & (b - 1)) == 0]
        print(f"search: found micro-batch {res['micro_batch']} in {len(sizes)} trials {sizes}")
        print(f"search job wall: {search_s:.1f} s (of which the search {res['wall_s']:.1f} s)")
        points_s = 0.0
        for b in doubled:
            s = timed(tmp, f"mb{b}", [*BASE, f"parallelism.micro_batch={b}"])
            points_s += s
            print(f"  point micro-batch {b}: {s:.1f} s")
        print(f"points (one job per power of two {doubled}): {points_s:.1f} s")
        print(f"ratio points / search: {points_s / search_s:.2f} (> 1: the search is faster)")


if __name__ == "__main__":
    main()
