"""Files the data tests make: a corpus from text that ships with Python, a BPE tokenizer trained
on it with `tokenizers`, and token files. Nothing is downloaded."""

from __future__ import annotations

import codecs
import contextlib
import io
import json
import sysconfig
from pathlib import Path

import numpy as np

EOS = "</s>"


def stdlib_corpus(folder: Path, max_files: int = 15) -> Path:
    """A jsonl corpus: the Zen of Python (the `this` module) and the docstrings-and-code of
    stdlib modules, one document a file."""
    with contextlib.redirect_stdout(io.StringIO()):  # `this` prints the Zen on import
        import this
    docs = [codecs.decode(this.s, "rot13")]
    lib = Path(sysconfig.get_paths()["stdlib"])
    for p in sorted(lib.glob("*.py"))[:max_files]:
        docs.append(p.read_text(encoding="utf-8", errors="replace"))
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "corpus.jsonl"
    out.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return out


def train_tokenizer(corpus: Path, folder: Path, vocab_size: int = 512) -> Path:
    """A BPE tokenizer trained on `corpus`, saved as save_pretrained would (tokenizer.json and
    tokenizer_config.json naming its eos token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    tok.train_from_iterator(texts, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "unk_token": "<unk>"}))
    return folder


def write_tokens(path: Path, ids: np.ndarray, dtype: str = "uint16") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.asarray(ids, dtype=dtype).tofile(path)
    return path


def learnable_tokens(path: Path, n: int, vocab: int = 256, seed: int = 0) -> Path:
    """A token file a tiny model learns within 20 steps: runs that count up by 7 modulo the
    vocabulary from random starts (the synthetic task's rule, written as a file)."""
    rng = np.random.default_rng(seed)
    out, left = [], n
    while left > 0:
        k = min(left, int(rng.integers(50, 400)))
        out.append((int(rng.integers(0, vocab)) + 7 * np.arange(k)) % vocab)
        left -= k
    return write_tokens(path, np.concatenate(out))
