"""A chat set tokenized once: every conversation of data.path rendered through the chat
template with its loss mask (pipeline.data.render), cached by content hash next to the data
like data=text's token file, then fitted to model.seq_len (`data.overlong`) and split.

The cache (`.sq-cache/chat-<hash>.npz`, written atomically) holds the whole conversations: ids
and mask back to back, their offsets, the prompt length of each and where it came from. The
hash covers each file's path, size and modification time, the tokenizer's files, the template,
data.format, data.messages_field and data.train_on. The seq_len fit is redone on load (cheap), so
points of other sequence lengths share the cache.

A sample of L tokens trains on L - 1 positions: inputs ids[:-1], targets ids[1:] where the mask
is set (else -100). Its loss-bearing tokens are the set mask bits of ids[1:]. A sample with
none (no assistant turn, or truncated before its answer) is dropped and counted.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from pipeline.data.chat import chat_files, conversations
from pipeline.data.tokenfile import CACHE_DIR, DataError, open_tokenizer
from pipeline.files import write_atomic
from pipeline.measure.kinds import CHAT_FORMATS

CACHE_VERSION = 1


class ChatSection(Protocol):
    """What this module reads of a point's data section (pipeline.config.schema.DataConfig)."""

    path: str | None
    tokenizer: str | None
    format: str
    messages_field: str | None
    chat_template: str | None
    train_on: str
    overlong: str
    eval_frac: float


@dataclass(frozen=True)
class Tokenized:
    """Every conversation rendered, whole (before the seq_len fit)."""

    ids: np.ndarray  # int32, back to back
    mask: np.ndarray  # bool, the trained tokens
    offsets: np.ndarray  # int64, n + 1
    prompt: np.ndarray  # int64, tokens before the first trained one
    where: tuple[str, ...]  # file:line of each
    vocab_size: int

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass(frozen=True)
class Samples:
    """The samples of one split, fitted to seq_len: the input/target pairs the batches take."""

    ids: tuple[np.ndarray, ...]
    mask: tuple[np.ndarray, ...]
    where: tuple[str, ...]

    @functools.cached_property
    def positions(self) -> np.ndarray:
        """Positions each sample computes (its length - 1)."""
        return np.asarray([len(i) - 1 for i in self.ids], dtype=np.int64)

    @functools.cached_property
    def loss_tokens(self) -> np.ndarray:
        return np.asarray([int(m[1:].sum()) for m in self.mask], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ids)

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        ids, mask = self.ids[i], self.mask[i]
        return ids[:-1], np.where(mask[1:], ids[1:], -100)


@dataclass(frozen=True)
class ChatData:
    """A chat set fitted to seq_len and split (the training head, the held-out tail)."""

    train: Samples
    eval: Samples
    truncated: int  # samples cut to seq_len + 1 tokens (data.overlong=truncate)
    dropped_overlong: int  # samples longer than that, dropped (data.overlong=drop)
    dropped_untrained: int  # samples with no loss-bearing token, dropped
    prompt_lengths: np.ndarray  # per kept sample, before the fit
    answer_lengths: np.ndarray  # per kept sample: trained tokens before the fit
    vocab_size: int
    longest: tuple[int, str] = (0, "")  # the longest kept sample's positions, file:line


def _digest(files: list[Path], folder: Path, template: str, data: ChatSection) -> str:
    h = hashlib.sha256(
        f"chat v{CACHE_VERSION} {data.format} {data.messages_field} {data.train_on}\0{template}".encode()
    )
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        p = folder / name
        if p.is_file():
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


def _render_all(files: list[Path], template: str, data: ChatSection) -> Tokenized:
    from pipeline.data.render import has_generation_markers, load_tokenizer, render

    assert data.tokenizer
    tok = load_tokenizer(data.tokenizer, template)
    markers = has_generation_markers(template)
    ids, masks, prompts, wheres = [], [], [], []
    for where, msgs in conversations(files, data.format, data.messages_field):
        i, m, p = render(tok, msgs, data.train_on, markers, where)
        ids.append(i)
        masks.append(m)
        prompts.append(p)
        wheres.append(where)
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(i) for i in ids])
    return Tokenized(
        np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32),
        np.concatenate(masks) if masks else np.zeros(0, np.bool_),
        offsets,
        np.asarray(prompts, dtype=np.int64),
        tuple(wheres),
        len(tok),
    )


def _save(path: Path, t: Tokenized) -> None:
    buf = io.BytesIO()
    np.savez(
        buf, ids=t.ids, mask=t.mask, offsets=t.offsets, prompt=t.prompt,
        where=np.asarray(json.dumps(t.where)), vocab=np.asarray(t.vocab_size),
    )  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, buf.getvalue())


def _load(path: Path) -> Tokenized:
    with np.load(path) as z:
        return Tokenized(
            z["ids"],
            z["mask"],
            z["offsets"],
            z["prompt"],
            tuple(json.loads(str(z["where"]))),
            int(z["vocab"]),
        )


def chat_cache_path(data: ChatSection) -> tuple[Path, list[Path], str]:
    """(cache file, the set's files, the template) of a chat section; refuses what is missing."""
    from pipeline.data.render import template_of

    assert data.path and data.tokenizer
    path = Path(data.path).expanduser()
    if not path.exists():
        raise DataError(f"data.path={data.path!r} does not exist: give a .jsonl file or a folder of them.")
    if data.format not in CHAT_FORMATS:
        raise DataError(f"data.format={data.format!r}; allowed: {' | '.join(CHAT_FORMATS)}.")
    open_tokenizer(data.tokenizer)  # refuses a folder without tokenizer.json
    files = chat_files(path)
    if not files:
        raise DataError(f"data.path={data.path!r} holds no .jsonl files.")
    template = template_of(data.tokenizer, data.chat_template)
    folder = path if path.is_dir() else path.parent
    stem = "chat" if path.is_dir() else f"{path.stem}-chat"
    digest = _digest(files, Path(data.tokenizer).expanduser(), template, data)
    return folder / CACHE_DIR / f"{stem}-{digest}.npz", files, template


@functools.lru_cache(maxsize=8)
def _tokenized_at(cache: Path, files: tuple[Path, ...], template: str, data: ChatSection) -> Tokenized:
    if cache.is_file():
        return _load(cache)
    t = _render_all(list(files), template, data)
    _save(cache, t)
    return t


def tokenize_chat(data: ChatSection) -> Tokenized:
    """The whole set rendered and masked: from the cache, or rendered now and cached."""
    cache, files, template = chat_cache_path(data)
    return _tokenized_at(cache, tuple(files), template, _Key.of(data))


@dataclass(frozen=True)
class _Key:
    """The fields the rendering reads, hashable (an lru_cache key)."""

    path: str | None
    tokenizer: str | None
    format: str
    messages_field: str | None
    chat_template: str | None
    train_on: str
    overlong: str
    eval_frac: float

    @classmethod
    def of(cls, d: ChatSection) -> _Key:
        return cls(
            d.path,
            d.tokenizer,
            d.format,
            d.messages_field,
            d.chat_template,
            d.train_on,
            d.overlong,
            d.eval_frac,
        )


def _fit_one(t: Tokenized, i: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    a, b = int(t.offsets[i]), int(t.offsets[i + 1])
    b = min(b, a + window)
    return t.ids[a:b].astype(np.int64), t.mask[a:b]


def fit_to(t: Tokenized, seq_len: int, overlong: str, eval_frac: float) -> ChatData:
    """The set fitted to seq_len positions a sample (seq_len + 1 tokens) and split: the last
    eval_frac of the kept samples (at least one) is held out. Refuses an overlong sample with
    data.overlong=refuse, naming it."""
    window = seq_len + 1
    lengths = t.lengths()
    ids, masks, wheres, prompts, answers = [], [], [], [], []
    truncated = dropped_long = untrained = 0
    for i in range(len(t)):
        if lengths[i] > window:
            if overlong == "refuse":
                raise DataError(
                    f"data.path: {t.where[i]} is {lengths[i]} tokens, longer than model.seq_len + 1 = {window} "
                    "(data.overlong=refuse); set data.overlong=truncate or drop, or a longer model.seq_len."
                )
            if overlong == "drop":
                dropped_long += 1
                continue
            truncated += 1
        x, m = _fit_one(t, i, window)
        if not m[1:].any():
            untrained += 1
            continue
        a, b = int(t.offsets[i]), int(t.offsets[i + 1])
        ids.append(x)
        masks.append(m)
        wheres.append(t.where[i])
        prompts.append(int(t.prompt[i]))
        answers.append(int(t.mask[a:b].sum()))
    n_eval = max(1, int(len(ids) * eval_frac)) if len(ids) > 1 else 0
    cut = len(ids) - n_eval
    train = Samples(tuple(ids[:cut]), tuple(masks[:cut]), tuple(wheres[:cut]))
    held = Samples(tuple(ids[cut:]), tuple(masks[cut:]), tuple(wheres[cut:]))
    longest = (0, "")
    if len(ids):
        j = int(np.argmax([len(x) for x in ids]))
        longest = (len(ids[j]) - 1, wheres[j])
    return ChatData(
        train, held, truncated, dropped_long, untrained,
        np.asarray(prompts, dtype=np.int64), np.asarray(answers, dtype=np.int64), t.vocab_size, longest,
    )  # fmt: skip


def load_chat(data: ChatSection, seq_len: int) -> ChatData:
    return fit_to(tokenize_chat(data), seq_len, data.overlong, data.eval_frac)


def chat_problems(data: ChatSection, vocab: int, seq_len: int) -> list[str]:
    """What makes a chat set unusable (empty: fine); tokenizes it into its cache on the way."""
    try:
        cd = load_chat(data, seq_len)
    except DataError as e:
        return [str(e).rstrip(".")]
    if cd.vocab_size > vocab:
        return [
            f"data.tokenizer={data.tokenizer!r} has {cd.vocab_size} tokens, more than the model's embedding "
            f"(model.vocab_size={vocab}): use the model's own tokenizer or a model with a larger vocabulary"
        ]
    kept = len(cd.train) + len(cd.eval)
    if len(cd.train) == 0:
        return [
            f"data.path={data.path!r}: no sample left to train on after filtering ({kept} kept; "
            f"{cd.dropped_untrained} without a loss-bearing token, {cd.dropped_overlong} overlong dropped): the set is "
            "empty, every conversation lacks an assistant answer (data.train_on), or data.overlong=drop removed them"
        ]
    if int(cd.eval.loss_tokens.sum()) == 0:
        return [
            f"data.path={data.path!r}: the held-out split (the last data.eval_frac={data.eval_frac} of "
            f"{kept} samples) has no loss-bearing token: eval loss would be undefined; raise data.eval_frac "
            "or add samples"
        ]
    return []


def length_stats(cd: ChatData) -> dict[str, float]:
    """p50/p95/max of prompt and answer lengths (tokens, before the seq_len fit) of the kept samples."""
    out: dict[str, float] = {}
    for name, arr in (("prompt", cd.prompt_lengths), ("answer", cd.answer_lengths)):
        if len(arr):
            out[f"{name}_p50"] = float(np.percentile(arr, 50))
            out[f"{name}_p95"] = float(np.percentile(arr, 95))
            out[f"{name}_max"] = float(arr.max())
    return out
