"""data=chat end to end (issue #45): a local sweep over a chat jsonl with a skewed length
distribution (many short answers, a long tail) runs `data.packing=pad,pack` to outcomes, every
count read back through MLflow. The run's loss-bearing tokens equal an independent count of the
assistant tokens (each answer as the template writes it, encoded by the plain tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.tracking import keys as K
from tests.support.chat_fixtures import (
    as_format,
    assistant_tokens,
    chat_tokenizer,
    skewed_conversations,
    write_jsonl,
)
from tests.support.helpers import point_runs, qualify


@pytest.mark.slow
def test_a_chat_sweep_pads_and_packs_to_outcomes_with_its_counts(tmp_path: Path) -> None:
    tok = chat_tokenizer(tmp_path, "chatml")
    convs = skewed_conversations(160, seed=4, tail_words=40, system_every=5)
    path = write_jsonl(tmp_path / "data" / "chat.jsonl", [as_format(c, "sharegpt") for c in convs])
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    res = qualify(
        [
            "sweep",
            "--sweep",
            "smoke",
            "--launcher",
            "local",
            f"runs_dir={tmp_path / 'runs'}",
            f"tracking.uri={uri}",
            "data=chat",
            f"data.path={path}",
            f"data.tokenizer={tok}",
            "data.num_workers=0",
            "model.vocab_size=384",
            "model.seq_len=320",
            "train.steps=8",
            "train.eval_every=4",
            "data.packing=pad,pack",
        ],  # fmt: skip
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    runs = {r.data.params["data.packing"]: r for r in point_runs(uri)}
    assert sorted(runs) == ["pack", "pad"]
    n_eval = max(1, int(len(convs) * 0.1))
    independent = assistant_tokens(tok, "chatml", convs[: len(convs) - n_eval])
    for packing, r in runs.items():
        m = r.data.metrics
        assert r.data.tags[K.TAG_OUTCOME] in ("accepted", "failed"), r.data.tags
        assert m[K.DATA_TRUNCATED] == m[K.DATA_DROPPED_UNTRAINED] == 0
        assert m[K.DATA_SAMPLES] == len(convs) - n_eval and m[K.DATA_EVAL_SAMPLES] == n_eval
        assert m[K.DATA_LOSS_TOKENS] == independent, packing
        assert 0 < m[K.DATA_LOSS_TOKENS_PER_S] < m[K.DATA_REAL_TOKENS_PER_S] <= m[K.PERF_TOKENS_PER_S]
        assert m[K.DATA_REAL_TOKENS_PER_S] / m[K.PERF_TOKENS_PER_S] == pytest.approx(
            m[K.DATA_PADDING_EFFICIENCY]
        )
        assert float(r.data.params[f"{K.PARAM_DATA_LENGTHS}answer_max"]) > 5 * float(
            r.data.params[f"{K.PARAM_DATA_LENGTHS}answer_p50"]
        ), "a long tail"
    pad, pack = runs["pad"].data.metrics, runs["pack"].data.metrics
    assert pack[K.DATA_PADDING_EFFICIENCY] > pad[K.DATA_PADDING_EFFICIENCY]
    assert pack[K.DATA_PACK_FILL] > 0.8 and K.DATA_PACK_FILL not in pad
    assert pack[K.EVAL_FIRST_LOSS] == pytest.approx(pad[K.EVAL_FIRST_LOSS], rel=1e-5), (
        "the same weights score the same held-out loss padded or packed"
    )
    # the report sets padding against packing on the partition, and plots the lengths
    from analysis.report import report_main

    out = tmp_path / "report"
    sweep_id = runs["pad"].data.tags[K.TAG_SWEEP_ID]
    assert report_main(["--tracking-uri", uri, "--out", str(out), "--sweep", sweep_id]) == 0
    md = (out / "report.md").read_text()
    assert "Chat data: padding vs packing, lengths" in md
    row = next(line for line in md.splitlines() if line.startswith("| local |") and "-chat |" in line)
    cells = [c.strip() for c in row.split("|")]
    pad_cost, pack_cost = (float(x) for x in cells[6].split(" / "))
    assert float(cells[7]) == pytest.approx(pack_cost / pad_cost, rel=1e-2)
    assert (out / "plots" / "chat_lengths.png").is_file() or "chat_lengths" in md
