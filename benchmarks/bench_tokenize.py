"""Memory of tokenizing text on the login node (issue 47, case 7: a 50 MB single-line jsonl grew
the login node to 18.5 GB and was OOM-killed). Goal: peak RSS under 2 GB whatever the input.

Side by side in one run, each in a fresh child process (its own peak, ru_maxrss of the child):
  a corpus of ordinary documents (the stdlib's modules, one a line)      the reference
  one jsonl line of SIZE MB (the same text, one document)                 tokenized in pieces
  one plain-text line of SIZE MB (no line break at all)                    read and tokenized in pieces
and each one's seconds and tokens. The tokenizer is a BPE trained on the stdlib corpus
(tests/support/data_fixtures.py). The child also checks that no temporary file is left.
Run: .venv/bin/python -m benchmarks.bench_tokenize [--mb 50]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.data_fixtures import stdlib_corpus, train_tokenizer

GOAL_BYTES = 2 << 30
CHILD = """
import json, resource, sys, time
from pathlib import Path
from pipeline.config.schema import DataConfig
from pipeline.data.tokenfile import tokenize_text
path, tok = sys.argv[1], sys.argv[2]
t = time.perf_counter()
tf = tokenize_text(DataConfig(kind="text", path=path, tokenizer=tok))
left = [p.name for p in tf.path.parent.glob(".*.tmp")]
print(json.dumps({"s": time.perf_counter() - t, "tokens": tf.n_tokens, "tmp_left": left,
                  "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def measure(path: Path, tok: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(tok)], capture_output=True, text=True, timeout=3600
    )
    if done.returncode:
        raise SystemExit(f"{path.name}: exit {done.returncode}\n{done.stderr[-3000:]}")
    out: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    assert not out["tmp_left"], out
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=50, help="size of the one long line, MB")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        corpus = stdlib_corpus(tmp / "corpus", max_files=40)
        tok = train_tokenizer(corpus, tmp / "tok", vocab_size=512)
        docs = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
        text = "\n".join(docs)
        long = (text * (args.mb * 1_000_000 // len(text) + 1))[: args.mb * 1_000_000]
        (tmp / "one_line").mkdir()
        one_line = tmp / "one_line" / "line.jsonl"
        one_line.write_text(json.dumps({"text": long}) + "\n")
        (tmp / "plain").mkdir()
        plain = tmp / "plain" / "line.txt"
        plain.write_text(long.replace("\n", " "))
        rows = {
            "ordinary corpus": (corpus, corpus.stat().st_size),
            f"one jsonl line of {args.mb} MB": (one_line, one_line.stat().st_size),
            f"one plain-text line of {args.mb} MB": (plain, plain.stat().st_size),
        }
        print(f"{'input':<32}{'MB':>8}{'peak RSS MiB':>14}{'seconds':>10}{'tokens':>12}")
        worst = 0.0
        for name, (path, size) in rows.items():
            t = time.perf_counter()
            m = measure(path, tok)
            peak = m["peak_kib"] * 1024
            worst = max(worst, peak)
            print(
                f"{name:<32}{size / 1e6:>8.1f}{peak / 2**20:>14.0f}{time.perf_counter() - t:>10.1f}{m['tokens']:>12}"
            )
        print(f"goal: peak RSS < {GOAL_BYTES / 2**30:.0f} GiB: {'met' if worst < GOAL_BYTES else 'MISSED'}")


if __name__ == "__main__":
    main()
