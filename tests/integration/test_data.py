"""The data path (issue #12): token files and text tokenized into them, the DataLoader's batches
(deterministic per seed and across resumes), the held-out split, bad input refused before
submission, the target eval loss as the acceptance rule, and real runs on a token file.

Every file is made here: a corpus from text that ships with Python, a tokenizer trained on it
with `tokenizers`, token files written with numpy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.config.schema import AcceptConfig, ConfigError, DataConfig
from pipeline.config.validate import point_problems
from pipeline.contract.outcome import Outcome, Reason
from pipeline.data.tokenfile import DataError, max_token_id, open_token_file, open_tokenizer, tokenize_text
from pipeline.job.drills import DrillVerdict
from pipeline.job.results import decide, target_metrics
from pipeline.tracking import keys as K
from pipeline.train.data import DataSource, StepSampler
from tests.support.data_fixtures import learnable_tokens, stdlib_corpus, train_tokenizer, write_tokens
from tests.support.helpers import REPO, compose, qualify


@pytest.fixture(scope="module")
def text_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("text")
    corpus = stdlib_corpus(root / "corpus")
    return corpus, train_tokenizer(corpus, root / "tokenizer", vocab_size=512)


# --- token files and text ------------------------------------------------------------------
def test_text_is_tokenized_once_into_a_cache_named_by_its_inputs(text_data: tuple[Path, Path]) -> None:
    corpus, tok_dir = text_data
    cfg = DataConfig(kind="text", path=str(corpus), tokenizer=str(tok_dir))
    tf = tokenize_text(cfg)
    assert tf.path.parent == corpus.parent / ".sq-cache" and tf.dtype == "uint16"
    tok = open_tokenizer(tok_dir)
    ids = [int(i) for i in tf.array()[:200]]
    assert tok.load().decode(ids).startswith("The Zen of Python, by Tim Peters")
    assert tok.eos_id is not None and int(np.count_nonzero(tf.array() == tok.eos_id)) == len(
        corpus.read_text().splitlines()
    ), "one eos token after each jsonl document"
    assert max_token_id(tf) < tok.vocab_size
    mtime = tf.path.stat().st_mtime_ns
    assert tokenize_text(cfg).path == tf.path and tf.path.stat().st_mtime_ns == mtime, "reused, not redone"
    assert not list(tf.path.parent.glob(".*.tmp")), "no temporary file left behind"
    with pytest.raises(DataError, match="corpus.jsonl:1 has no string field data.text_key='body'"):
        tokenize_text(DataConfig(kind="text", path=str(corpus), tokenizer=str(tok_dir), text_key="body"))


def test_a_folder_of_plain_text_is_tokenized_whole(tmp_path: Path, text_data: tuple[Path, Path]) -> None:
    """Plain-text files are read in order, cut only at line ends, with no separator added."""
    _, tok_dir = text_data
    folder = tmp_path / "texts"
    folder.mkdir()
    license_text = (Path(os.__file__).parent / "LICENSE.txt").read_text()  # the stdlib's own license
    (folder / "a.txt").write_text(license_text)
    (folder / "b.txt").write_text("Beautiful is better than ugly.\n")
    tf = tokenize_text(DataConfig(kind="text", path=str(folder), tokenizer=str(tok_dir)))
    assert tf.path.parent == folder / ".sq-cache"
    decoded = open_tokenizer(tok_dir).load().decode([int(i) for i in tf.array()])
    assert decoded == license_text + "Beautiful is better than ugly.\n"


def test_token_file_size_must_be_a_multiple_of_its_width(tmp_path: Path) -> None:
    path = tmp_path / "odd.bin"
    path.write_bytes(b"\x01\x00\x02")
    with pytest.raises(DataError, match="not a multiple of data.dtype=uint16"):
        open_token_file(path, "uint16", 0.1)
    assert (
        open_token_file(write_tokens(tmp_path / "u32.bin", np.arange(10), "uint32"), "uint32", 0.1).n_tokens
        == 10
    )


# --- batches -------------------------------------------------------------------------------
def _batches(
    src: DataSource, first: int, last: int, rank: int = 0, world: int = 2
) -> dict[int, torch.Tensor]:
    it = src.batches(StepSampler(first, last, rank, world, world, grad_accum=2))
    out = {}
    for step in range(first, last + 1):
        out[step] = torch.cat([torch.cat(it.next()[0], 1) for _ in range(2)])
    it.close()
    return out


def test_batches_are_the_same_after_a_resume_with_or_without_workers(tmp_path: Path) -> None:
    """A run resumed after step 5 reads exactly the batches of the uninterrupted run, whatever
    the worker count; another seed or another rank reads other windows; every window is a
    slice of the training part of the file."""
    tokens = learnable_tokens(tmp_path / "t.bin", 20_000)

    def source(workers: int, seed: int = 1) -> DataSource:
        cfg = DataConfig(kind="tokens", path=str(tokens), num_workers=workers)
        return DataSource(cfg, 256, 16, seed, micro_batch=3, pin=False)

    full = _batches(source(0), 1, 10)
    resumed = _batches(source(2), 6, 10)
    assert all(torch.equal(full[s], resumed[s]) for s in range(6, 11))
    assert not torch.equal(_batches(source(0, seed=2), 1, 1)[1], full[1])
    assert not torch.equal(_batches(source(0), 1, 1, rank=1)[1], full[1])
    arr = np.fromfile(tokens, dtype=np.uint16)
    n_train = len(arr) - int(len(arr) * 0.1)
    x, y = source(0).eval_set()
    assert torch.equal(x[0], torch.from_numpy(arr[n_train : n_train + 16].astype(np.int64)))
    assert torch.equal(y[:, :-1], x[:, 1:])


def test_fewer_ranks_read_the_micro_batches_of_the_original_ranks() -> None:
    """The reshape drill: 1 rank with twice the accumulation reads, per step, the keys the 2
    original ranks read, in rank order; so the global batch is unchanged."""
    two = [list(StepSampler(3, 4, r, 2, 2, grad_accum=1)) for r in range(2)]
    one = list(StepSampler(3, 4, 0, 1, 2, grad_accum=2))
    assert one == [two[0][0], two[1][0], two[0][1], two[1][1]] == [(3, 0, 0), (3, 0, 1), (4, 0, 0), (4, 0, 1)]
    assert len(StepSampler(11, 20, 0, 2, 2, 3)) == 30 and not list(StepSampler(21, 20, 0, 2, 2, 3))


def test_the_synthetic_task_counts_over_its_alphabet_capped_at_the_vocabulary() -> None:
    from pipeline.train.data import SyntheticTask

    x, y = SyntheticTask(50_000, 64, 3, alphabet=32).batch(1, 0, 0, 16)
    assert int(torch.cat([x, y], 1).max()) < 32, "a large vocabulary counts over the alphabet only"
    assert torch.equal(y, (x + 7) % 32), "the next token is a fixed function of the current one"
    x, y = SyntheticTask(20, 64, 3, alphabet=32).batch(1, 0, 0, 16)
    assert torch.equal(y, (x + 7) % 20) and len(x.unique()) == 20, "capped at a vocabulary below it"
    with pytest.raises(ConfigError, match="data.alphabet"):
        DataConfig(alphabet=1)


def test_the_read_probe_reports_tokens_and_bytes(tmp_path: Path) -> None:
    tokens = learnable_tokens(tmp_path / "t.bin", 20_000)
    src = DataSource(DataConfig(kind="tokens", path=str(tokens), num_workers=0), 256, 16, 1, 4, pin=False)
    probe = src.probe(first_step=100, batches=8, rank=0, world=1, grad_accum=1)
    assert probe is not None and probe.tokens_per_s > 0
    assert probe.mb_per_s == pytest.approx(probe.tokens_per_s * 17 / 16 * 2 / 1e6)  # uint16, +1 token a row
    synthetic = DataSource(DataConfig(), 256, 16, 1, 4, pin=False).probe(100, 8, 0, 1, 1)
    assert synthetic is not None and synthetic.mb_per_s is None, "nothing is read: no MB/s"


# --- bad input -------------------------------------------------------------------------------
def _problems(overrides: list[str]) -> str:
    return " | ".join(point_problems(compose(overrides)))


def test_bad_data_is_refused_with_the_key_and_what_is_allowed(
    tmp_path: Path, text_data: tuple[Path, Path]
) -> None:
    corpus, tok_dir = text_data
    short = write_tokens(tmp_path / "short.bin", np.arange(100) % 256)
    beyond = write_tokens(tmp_path / "beyond.bin", np.arange(5000) % 300)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x00" * 4001)
    cases = {
        "no such token file": ["data=tokens", f"data.path={tmp_path / 'nope.bin'}"],
        "not a multiple of data.dtype=uint16": ["data=tokens", f"data.path={odd}"],
        "shorter than one sequence of model.seq_len + 1 = 65": ["data=tokens", f"data.path={short}"],
        "holds token id 299, beyond the model's vocabulary (model.vocab_size=256": [
            "data=tokens",
            f"data.path={beyond}",
        ],
        "has no tokenizer.json": ["data=text", f"data.path={corpus}", f"data.tokenizer={tmp_path}"],
        "does not exist: give a local folder": [
            "data=text",
            f"data.path={corpus}",
            f"data.tokenizer={tmp_path / 'x'}",
        ],
        "has 512 tokens, more than the model's embedding (model.vocab_size=256)": [
            "data=text",
            f"data.path={corpus}",
            f"data.tokenizer={tok_dir}",
        ],
        "data.path='/no/corpus' does not exist": [
            "data=text",
            "data.path=/no/corpus",
            f"data.tokenizer={tok_dir}",
            "model.vocab_size=512",
        ],
    }
    for expected, overrides in cases.items():
        assert expected in _problems(overrides), (expected, _problems(overrides))
    eval_short = write_tokens(tmp_path / "evalshort.bin", np.arange(600) % 256)  # 60 held out < 65
    assert "its evaluation split has 60 tokens" in _problems(["data=tokens", f"data.path={eval_short}"])
    assert _problems(["data=tokens", f"data.path={beyond}", "model.vocab_size=512"]) == ""


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["data=tokens"],
            "Invalid value for 'data.path': None. Allowed: a file or folder path with data=tokens",
        ),
        (["accept.target_eval_loss=0"], "'accept.target_eval_loss': 0.0. Allowed: a positive number"),
        (["accept.target_eval_loss=-1", "accept.relative=false"], "Allowed: a positive number"),
        (["accept.target_eval_loss=1.5"], "a fraction 0 < x < 1 of the first evaluation's loss"),
        (["data.kind=csv"], "'data.kind': 'csv'. Allowed: synthetic | tokens | text"),
        (["train.eval_every=-1"], "'train.eval_every': -1"),
    ],
)
def test_bad_data_settings_fail_at_composition(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError, match=None) as e:
        compose(overrides)
    assert expected in str(e.value), str(e.value)


def test_cli_refuses_bad_data_with_exit_2_and_submits_nothing(tmp_path: Path) -> None:
    res = qualify(
        [
            "sweep",
            "--sweep",
            "smoke",
            "--launcher",
            "local",
            f"runs_dir={tmp_path / 'runs'}",
            "data=tokens",
            f"data.path={tmp_path / 'missing.bin'}",
            f"tracking.uri=sqlite:///{tmp_path / 'db'}",
        ],
        timeout=300,
    )
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "no such token file" in res.stderr + res.stdout
    assert not list((tmp_path / "runs").glob("*/points/*")), "nothing was submitted"


def test_login_node_checks_do_not_import_torch() -> None:
    code = "import sys, pipeline.config.validate, pipeline.data.tokenfile; assert 'torch' not in sys.modules"
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )


# --- the quality target ---------------------------------------------------------------------
def test_target_metrics_are_those_of_the_first_evaluation_at_or_below_it() -> None:
    evals = {0: 5.5, 10: 5.1, 20: 4.8, 30: 4.0}
    m = target_metrics(evals, AcceptConfig(0.9, relative=True).target(evals[0]), 0.5, 4, 2.0)
    assert m[K.TARGET_EVAL_LOSS] == pytest.approx(4.95) and m[K.TARGET_STEPS] == 20
    assert m[K.TARGET_TIME_S] == 10.0 and m[K.TARGET_GPU_HOURS] == pytest.approx(40 / 3600)
    assert m[K.TARGET_USD] == pytest.approx(2 * 40 / 3600)
    assert AcceptConfig(3.0, relative=False).target(5.5) == 3.0
    missed = target_metrics(evals, 3.0, 0.5, 4, None)
    assert missed == {K.TARGET_EVAL_LOSS: 3.0}, "not reached: no steps, time or cost (absent, not 0)"
    assert K.TARGET_USD not in target_metrics(evals, 5.0, 0.5, 4, None), "no price: no cost"


class _Res:
    def __init__(self, evals: dict[int, float]) -> None:
        self.end_step, self.roundtrips, self.eval_losses = 30, [], evals


def test_real_data_is_accepted_on_the_target_and_fails_with_its_own_reason() -> None:
    evals = {0: 5.5, 30: 4.0}
    ok = DrillVerdict(True)
    reached = {**target_metrics(evals, 4.5, 0.1, 2, None), K.TRAIN_LOSS_BOUND: 1.0, K.TRAIN_FINAL_LOSS: 4.0}
    out = decide(_Res(evals), 30, reached, True, ok, quality="target")
    assert out.outcome == Outcome.ACCEPTED and "reached eval loss 4.5000 at step 30" in out.detail
    missed = {**target_metrics(evals, 3.0, 0.1, 2, None), K.TRAIN_LOSS_BOUND: 9.0, K.TRAIN_FINAL_LOSS: 4.0}
    out = decide(_Res(evals), 30, missed, True, ok, quality="target")
    assert out.reason == Reason.TARGET_NOT_REACHED and "best 4.0000" in out.detail
    assert decide(_Res(evals), 30, missed, True, ok, quality="loss_bound").outcome == Outcome.ACCEPTED
    assert decide(_Res(evals), 30, reached, True, ok, quality="loss_bound").reason == Reason.LOSS_BOUND


# --- real runs ---------------------------------------------------------------------------------
def test_report_shows_cost_to_target_eval_curves_and_data_wait(tmp_path: Path) -> None:
    """A fake sweep whose first run logged the data path and its evaluations: the report has
    the cost to target next to the cost per successful checkpoint, the data table, and the
    eval-curve, cost-to-target and data-wait plots."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from analysis.report import report_main
    from tests.support.analysis_helpers import RunSpec, log_run, start_sweep

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    sweep = start_sweep(uri, "20261130-120000-da7a")
    client = MlflowClient(tracking_uri=uri)
    run_id = log_run(client, sweep, RunSpec("h100"), "h100-data", 1_000)
    log_run(client, sweep, RunSpec("a100"), "a100-synthetic", 2_000)
    evals = {0: 5.5, 10: 4.6, 20: 3.9}
    target = target_metrics(evals, 0.9 * 5.5, 0.25, 4, 2.0)  # reached at step 10: 2.5 s x 4 ranks
    values = {**target, K.EVAL_FIRST_LOSS: 5.5, K.EVAL_FINAL_LOSS: 3.9, K.DATA_WAIT_FRAC: 0.013,
              K.DATA_READ_TOKENS_PER_S: 2.5e6, K.DATA_READ_MB_PER_S: 5.0}  # fmt: skip
    client.log_batch(
        run_id,
        metrics=[Metric(k, v, 0, 0) for k, v in values.items()]
        + [Metric(K.EVAL_LOSS, v, 0, s) for s, v in evals.items()],
    )
    client.set_tag(run_id, K.TAG_DATA, "tokens:/data/train.bin")
    out = tmp_path / "out"
    assert report_main(["--tracking-uri", uri, "--out", str(out), "--sweep", sweep.sweep_id]) == 0
    md = (out / "report.md").read_text()
    candidates = next(
        line for line in md.splitlines() if "cost per successful checkpoint | cost to target" in line
    )
    assert candidates, "cost to target sits next to cost per successful checkpoint"
    row = next(line for line in md.splitlines() if "tokens:/data/train.bin" in line)
    cost = target[K.TARGET_USD]
    assert "5.500 -> 3.900 | 4.950 | 10 | 2.5 |" in row and "1.3%" in row and "2,500,000 | 5" in row, row
    assert f"${cost:.3g}" in row or f"{cost:.4f}" in row, (cost, row)
    assert {p.name for p in (out / "report_plots").glob("*.png")} >= {
        "eval_curves.png",
        "cost_to_target.png",
        "data_wait.png",
    }
