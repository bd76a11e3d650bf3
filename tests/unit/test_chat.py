"""data=chat (issue #45): formats to one message list, the loss mask against an independent
count of assistant tokens for three template styles, packing with boundaries (a sample's
logits inside a pack equal its logits alone, every family the tests build), the loss as summed
NLL over the step's loss-bearing tokens, eval loss independent of batching, the cache, and
every bad input refused before anything is submitted (exit 2, one paragraph, file:line).

Every file is made here from text that ships with Python (tests/support/chat_fixtures.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.cli import main
from pipeline.config.schema import DataConfig
from pipeline.data.chat import to_messages
from pipeline.data.chatset import load_chat, tokenize_chat
from pipeline.data.packing import Layout, best_fit_decreasing, step_keys
from pipeline.data.tokenfile import DataError
from pipeline.train.data import ChatBatches
from pipeline.train.model import CausalLM
from tests.support.chat_fixtures import (
    NO_ASSISTANT,
    TEMPLATES,
    as_format,
    assistant_tokens,
    chat_tokenizer,
    skewed_conversations,
    write_jsonl,
)
from tests.support.families import FAMILIES, hf_config
from tests.support.helpers import REPO

CONVS = skewed_conversations(120, seed=1, tail_words=60, system_every=4)


@pytest.fixture(scope="module")
def toks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat")
    return {t: chat_tokenizer(root, t) for t in [*TEMPLATES, None]}  # type: ignore[misc]


def _set(tmp: Path, convs: list[list[dict[str, str]]] = CONVS, fmt: str = "messages") -> Path:
    return write_jsonl(tmp / "data" / "chat.jsonl", [as_format(c, fmt) for c in convs])


def _cfg(path: Path, tok: Path, **kw: object) -> DataConfig:
    return DataConfig(kind="chat", path=str(path), tokenizer=str(tok), **kw)  # type: ignore[arg-type]


# --- formats ----------------------------------------------------------------------------------
def test_every_format_becomes_the_same_message_list() -> None:
    conv = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "Because."},
    ]
    for fmt in ("messages", "sharegpt"):
        rec = as_format(conv, fmt)
        assert to_messages(rec, fmt, "f:1") == conv == to_messages(rec, "auto", "f:1")
    pair = [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because."}]
    for fmt in ("alpaca", "prompt_completion"):
        rec = as_format(conv, fmt)
        assert to_messages(rec, fmt, "f:1") == pair == to_messages(rec, "auto", "f:1")
    alpaca = {"instruction": "Sum", "input": "1 2", "output": "3"}
    assert to_messages(alpaca, "auto", "f:1")[0]["content"] == "Sum\n\n1 2"
    renamed = {"dialog": conv}
    assert to_messages(renamed, "messages", "f:1", messages_field="dialog") == conv


# --- masks ------------------------------------------------------------------------------------
@pytest.mark.parametrize("template", list(TEMPLATES))
def test_loss_tokens_equal_an_independent_count_of_assistant_tokens(
    tmp_path: Path, toks: dict[str, Path], template: str
) -> None:
    """generation: transformers' {% generation %} mask; chatml and system (a default system
    prompt inside the first user turn): the prefix diff. Long enough seq_len: nothing cut."""
    path = _set(tmp_path)
    for train_on, last in (("assistant", False), ("last", True)):
        cd = load_chat(_cfg(path, toks[template], train_on=train_on), 4096)
        assert cd.truncated == cd.dropped_untrained == 0
        counted = int(cd.train.loss_tokens.sum() + cd.eval.loss_tokens.sum())
        assert counted == assistant_tokens(toks[template], template, CONVS, last=last), (template, train_on)
    every = load_chat(_cfg(path, toks[template], train_on="all"), 4096)
    assert int(every.train.loss_tokens.sum() + every.eval.loss_tokens.sum()) == int(
        every.train.positions.sum() + every.eval.positions.sum()
    )


def test_the_mask_travels_as_targets_and_eos_is_trained(tmp_path: Path, toks: dict[str, Path]) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(toks["chatml"] / "tokenizer.json"))
    conv = [[{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because."}]]
    cd = load_chat(_cfg(_set(tmp_path, conv * 3), toks["chatml"]), 64)
    x, y = cd.train.pair(0)
    trained = [int(t) for t in y if t != -100]
    assert tok.decode(trained, skip_special_tokens=False) == "Because.<|im_end|>\n"
    assert trained[-2] == tok.token_to_id("<|im_end|>"), "the end-of-turn token is trained"
    assert np.array_equal(x[1:], cd.train.ids[0][1:-1])


def test_overlong_samples_are_truncated_dropped_or_refused(tmp_path: Path, toks: dict[str, Path]) -> None:
    path = _set(tmp_path)
    full = tokenize_chat(_cfg(path, toks["generation"]))
    seq = int(np.percentile(full.lengths(), 90))
    over = int((full.lengths() > seq + 1).sum())
    assert over > 0
    cut = load_chat(_cfg(path, toks["generation"]), seq)
    assert cut.truncated == over and int(cut.train.positions.max()) == seq
    dropped = load_chat(_cfg(path, toks["generation"], overlong="drop"), seq)
    assert dropped.dropped_overlong == over and len(dropped.train) + len(dropped.eval) == len(full) - over
    with pytest.raises(DataError, match=r"chat\.jsonl:\d+ is \d+ tokens, longer than model.seq_len \+ 1"):
        load_chat(_cfg(path, toks["generation"], overlong="refuse"), seq)


def test_tokenized_once_and_cached_by_content(tmp_path: Path, toks: dict[str, Path]) -> None:
    path = _set(tmp_path)
    cfg = _cfg(path, toks["chatml"])
    tokenize_chat(cfg)
    caches = list((path.parent / ".sq-cache").glob("chat-*.npz"))
    assert len(caches) == 1
    mtime = caches[0].stat().st_mtime_ns
    tokenize_chat(cfg)
    assert caches[0].stat().st_mtime_ns == mtime, "reused, not redone"
    tokenize_chat(replace(cfg, train_on="last"))
    assert len(list((path.parent / ".sq-cache").glob("*.npz"))) == 2, "another mask, another cache"


def test_rendering_on_the_login_node_does_not_import_torch(tmp_path: Path, toks: dict[str, Path]) -> None:
    path = _set(tmp_path, CONVS[:5])
    code = (
        "import sys; from pipeline.config.schema import DataConfig; from pipeline.data.chatset import tokenize_chat; "
        f"tokenize_chat(DataConfig(kind='chat', path={str(path)!r}, tokenizer={str(toks['generation'])!r})); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# --- packing ----------------------------------------------------------------------------------
def test_best_fit_decreasing_against_a_hand_packing() -> None:
    # capacity 10: 7 opens bin A, 6 bin B, 5 bin C, then 4 -> B (room 4, the tightest), 3 -> A,
    # 3 -> C (room 5 -> 2), 2 -> C: {7,3} {6,4} {5,3,2}
    lengths = np.asarray([3, 7, 2, 5, 4, 6, 3])
    bins = best_fit_decreasing(lengths, 10)
    assert sorted(sorted(int(lengths[i]) for i in b) for b in bins) == [[2, 3, 5], [3, 7], [4, 6]]
    assert sorted(i for b in bins for i in b) == list(range(7))
    rng = np.random.default_rng(0)
    skewed = np.concatenate([rng.integers(5, 40, 400), rng.integers(200, 256, 20)])
    packed = best_fit_decreasing(skewed, 256)
    assert all(skewed[b].sum() <= 256 for b in packed)
    assert len(packed) <= int(np.ceil(skewed.sum() / 256)) + 2, "near the lower bound on bins"


def _family_model(family: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(hf_config(family), attn_implementation="sdpa").eval()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_samples_logits_inside_a_pack_equal_its_logits_alone(
    tmp_path: Path, toks: dict[str, Path], family: str
) -> None:
    """Micro-batches of 2 packs as the trainer builds them (position_ids restarting at 0, no
    attention mask, use_cache=False): each sample's logits match a forward of it alone to 1e-5,
    and the packed summed NLL equals the sum of the samples' own."""
    cd = load_chat(_cfg(_set(tmp_path, CONVS[:24]), toks["generation"]), 96)
    lay = Layout(cd.train, "pack", 2, 96, 0, False)
    rows = sorted(lay.bins, key=len)[-2:]  # the bins of most samples
    assert max(len(r) for r in rows) >= 3, "packs of several samples"
    mb = lay.build(rows)
    model = _family_model(family)
    with torch.no_grad():
        packed = model(
            input_ids=torch.as_tensor(mb.tokens),
            position_ids=torch.as_tensor(mb.position_ids),
            use_cache=False,
        ).logits
        alone_nll = 0.0
        for r, row in enumerate(rows):
            at = 0
            for i in row:
                x, y = cd.train.pair(i)
                alone = model(input_ids=torch.as_tensor(x)[None], use_cache=False).logits[0]
                torch.testing.assert_close(packed[r, at : at + len(x)], alone, atol=1e-5, rtol=0)
                alone_nll += float(
                    F.cross_entropy(alone, torch.as_tensor(y), ignore_index=-100, reduction="sum")
                )
                at += len(x)
        lm = CausalLM(model)
        arrays = {k: torch.as_tensor(v) for k, v in mb.arrays().items()}
        assert float(lm(**arrays, denominator=1.0)) == pytest.approx(alone_nll, rel=1e-5)


# --- the loss and the counts ------------------------------------------------------------------
def test_the_step_loss_is_summed_nll_over_all_loss_tokens_not_a_mean_of_means(
    tmp_path: Path, toks: dict[str, Path]
) -> None:
    """Two micro-batches x two ranks with different loss-token counts: the mean DeepSpeed takes
    of the losses the trainer computes (each NLL / (count / (grad_accum x ranks))) equals the
    cross-entropy of every target of the step at once, and differs from a mean of means."""
    cd = load_chat(_cfg(_set(tmp_path), toks["chatml"]), 128)
    chat = ChatBatches(cd, "pad", 3, 128, seed=5, group=False)
    model = CausalLM(_family_model("llama"))
    keys = step_keys(7, grad_accum=2, world=2, data_world=2)
    count = chat.step_counts(7, 2, 2, 2)
    assert count.loss == sum(int((chat[k]["targets"] != -100).sum()) for k in keys)
    with torch.no_grad():
        losses, means, logits_all, targets_all = [], [], [], []
        for k in keys:
            b = {n: torch.as_tensor(v) for n, v in chat[k].items()}
            losses.append(float(model(**b, denominator=count.loss / 4)))
            logits = model.inner(input_ids=b["tokens"], attention_mask=b["attention_mask"]).logits
            logits_all.append(logits.reshape(-1, logits.size(-1)))
            targets_all.append(b["targets"].reshape(-1))
            means.append(float(F.cross_entropy(logits_all[-1], targets_all[-1], ignore_index=-100)))
        whole = float(F.cross_entropy(torch.cat(logits_all), torch.cat(targets_all), ignore_index=-100))
    assert sum(losses) / 4 == pytest.approx(whole, rel=1e-5)
    assert abs(sum(means) / 4 - whole) > 1e-4, "the case separates the two definitions"


def test_step_counts_match_the_batches_built(tmp_path: Path, toks: dict[str, Path]) -> None:
    cd = load_chat(_cfg(_set(tmp_path), toks["system"]), 128)
    for packing, group in (("pad", False), ("pad", True), ("pack", False)):
        chat = ChatBatches(cd, packing, 4, 128, seed=1, group=group)
        keys = step_keys(3, 2, 1, 1)
        built = [chat[k] for k in keys]
        c = chat.step_counts(3, 2, 1, 1)
        assert c.positions == sum(b["tokens"].size for b in built)
        assert c.loss == sum(int((b["targets"] != -100).sum()) for b in built)
        if packing == "pad":
            real = sum(int(b["attention_mask"].sum()) for b in built)
        else:  # the samples' own lengths, from the rows each key draws
            real = sum(len(cd.train.pair(i)[0]) for k in keys for row in chat.train.rows_of(k) for i in row)
        assert c.real == real, packing
        assert chat[keys[0]]["tokens"].shape == built[0]["tokens"].shape, "a pure function of the key"
        assert all(np.array_equal(chat[k]["tokens"], b["tokens"]) for k, b in zip(keys, built, strict=True))


def test_eval_loss_is_independent_of_batching_and_packing(tmp_path: Path, toks: dict[str, Path]) -> None:
    cd = load_chat(_cfg(_set(tmp_path, CONVS[:60]), toks["generation"], eval_frac=0.3), 128)
    model = CausalLM(_family_model("qwen2"))
    values = []
    for packing, mb in (("pad", 1), ("pad", 5), ("pack", 2)):
        nll = count = 0.0
        with torch.no_grad():
            for b in ChatBatches(cd, packing, mb, 128, 0, False).eval_batches():
                nll += float(model(**b, denominator=1.0))
                count += int((b["targets"] != -100).sum())
        values.append(nll / count)
    assert count == int(cd.eval.loss_tokens.sum())
    assert values == pytest.approx([values[0]] * 3, rel=1e-5)


# --- bad input (item 7): exit 2, one paragraph, file and line, nothing submitted --------------
def _refused(tmp: Path, capsys: pytest.CaptureFixture[str], data: list[str], expected: str) -> str:
    runs = tmp / "runs"
    args = [
        "sweep",
        "--sweep",
        "smoke",
        "--launcher",
        "local",
        f"runs_dir={runs}",
        f"tracking.uri=sqlite:///{tmp / 'm.db'}",
    ]
    rc = main([*args, "data=chat", "model.vocab_size=384", "model.seq_len=128", *data])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and "\n\n" not in err.strip(), err
    assert expected in err, (expected, err)
    assert not runs.exists() and not (tmp / "m.db").exists(), "nothing written, nothing submitted"
    return err


@pytest.fixture
def nothing_submitted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the sweep gets as far as submitting or creating an MLflow run."""
    import pipeline.submit.manifest
    import pipeline.submit.sweep

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("bad input reached submission")

    monkeypatch.setattr(pipeline.submit.sweep, "submit", refuse)
    monkeypatch.setattr(pipeline.submit.sweep, "create_parent_run", refuse)
    monkeypatch.setattr(pipeline.submit.manifest, "create_parent_run", refuse)


@pytest.mark.usefixtures("nothing_submitted")
def test_every_bad_chat_input_is_refused_naming_file_and_line(
    tmp_path: Path, toks: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    gen = toks["generation"]
    lines = [json.dumps(as_format(c, "messages")) for c in CONVS[:6]]
    bad = tmp_path / "in"
    cases = {
        "invalid JSON": (["{not json", "chat.jsonl:3 is not a JSON line"], {}),
        "no field": (['{"text": "hello"}', "chat.jsonl:3 has none of the fields of data.format=auto"], {}),
        "unknown role": (
            [
                '{"messages": [{"role": "robot", "content": "x"}]}',
                "chat.jsonl:3: messages[0] has the unknown role 'robot'",
            ],
            {},
        ),
    }
    for name, ((line, expected), _) in cases.items():
        path = write_jsonl(bad / name / "chat.jsonl", [])
        path.write_text("\n".join([*lines[:2], line, *lines[2:]]) + "\n")
        _refused(tmp_path, capsys, [f"data.path={path}", f"data.tokenizer={gen}"], expected)
    good = _set(bad / "good")
    _refused(tmp_path, capsys, [f"data.path={good}", f"data.tokenizer={toks[None]}"], "has no chat template")
    no_asst = bad / "no_asst.jinja"
    no_asst.write_text(NO_ASSISTANT)
    _refused(
        tmp_path, capsys, [f"data.path={good}", f"data.tokenizer={gen}", f"data.chat_template={no_asst}"],
        "chat.jsonl:1: the chat template renders no assistant token",
    )  # fmt: skip
    questions = [[m for m in c if m["role"] != "assistant"] for c in CONVS[:8]]
    empty = _set(bad / "empty", questions)
    _refused(tmp_path, capsys, [f"data.path={empty}", f"data.tokenizer={gen}"], "no sample left to train on")
    # one trainable conversation: everything held out (at least one sample) leaves none to score
    held = _set(bad / "held", [*questions, CONVS[0]])
    _refused(tmp_path, capsys, [f"data.path={held}", f"data.tokenizer={gen}"], "the held-out split")


# --- the memory fit sees the data ------------------------------------------------------------
@pytest.mark.usefixtures("nothing_submitted")
def test_the_fit_refuses_a_partition_that_holds_the_median_but_not_the_longest_sample(
    tmp_path: Path, toks: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """One long conversation at line 37 among short ones: a padded micro-batch may hold it. The
    capacity is set between the memory model's figure at the median length and at the longest
    (the memory model is tested elsewhere); the refusal names line 37, exit 2, nothing run."""
    from pipeline.config.validate import memory_query
    from pipeline.measure.memory import estimate
    from tests.support.helpers import compose

    convs = [c for c in CONVS if sum(len(m["content"]) for m in c) < 200][:60]
    long = [
        {"role": "user", "content": "Explain?"},
        {"role": "assistant", "content": "Now is better than never. " * 30},
    ]
    path = _set(tmp_path / "fit", [*convs[:36], long, *convs[36:]])
    data = ["data=chat", f"data.path={path}", f"data.tokenizer={toks['chatml']}", "model.vocab_size=384"]
    shape = ["model.seq_len=512", "parallelism.micro_batch=64", "parallelism=zero0"]
    q = memory_query(compose([*data, *shape]))
    lengths = tokenize_chat(_cfg(path, toks["chatml"])).lengths() - 1
    assert int(np.argmax(lengths)) == 36 and q.seq_len == int(lengths.max()), "a padded row holds the longest"
    at_median, at_longest = (
        estimate(replace(q, seq_len=int(s))).total_bytes for s in (np.median(lengths), q.seq_len)
    )
    capacity_gib = (at_median + at_longest) / 2 / 0.85 / 2**30
    err = _refused(
        tmp_path,
        capsys,
        [*data, *shape, f"partition.gpu_mem_gib={capacity_gib:.4f}"],
        "chat.jsonl:37, the longest sample",
    )
    assert "the median sample" in err and "data.packing=pack" in err
    packed = compose([*data, *shape, "data.packing=pack"])
    assert memory_query(packed).seq_len == 512, "packed: the pack length sets the rows"


def test_chat_batches_are_the_same_after_a_resume_with_or_without_workers(
    tmp_path: Path, toks: dict[str, Path]
) -> None:
    """Every chat micro-batch is a function of (seed, step, micro, rank): a loader resumed after
    step 2 with a worker reads the batches of the uninterrupted run without one."""
    from pipeline.train.data import DataSource, StepSampler

    path = _set(tmp_path, CONVS[:40])

    def read(workers: int, first: int) -> list[dict[str, torch.Tensor]]:
        cfg = _cfg(path, toks["chatml"], packing="pack", num_workers=workers)
        src = DataSource(cfg, 384, 128, seed=3, micro_batch=2, pin=False)
        it = src.batches(StepSampler(first, 4, 0, 1, 1, grad_accum=2))
        out = [it.next()[0] for _ in range((4 - first + 1) * 2)]
        it.close()
        return out  # type: ignore[return-value]

    full, resumed = read(0, 1), read(1, 3)
    for a, b in zip(full[4:], resumed, strict=True):
        assert a.keys() == b.keys() == {"tokens", "targets", "position_ids"}
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(full[0]["tokens"], full[2]["tokens"]), "another step, other packs"
