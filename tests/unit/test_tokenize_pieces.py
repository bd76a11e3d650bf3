"""Issue 47, case 7: text is tokenized in bounded pieces (a 50 MB single-line jsonl grew the
login node to 18.5 GB). A document longer than PIECE_CHARS is cut where a run of whitespace
starts, so its pieces tokenize as the whole does (the reference: the tokenizer's own encode of
the whole document); a line with no whitespace is cut hard at the limit and loses nothing; a
jsonl line over MAX_LINE_CHARS is refused with file:line; no temporary file is left behind on a
failure, nor by a killed process. The memory itself: benchmarks/bench_tokenize.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.config.schema import DataConfig
from pipeline.data import tokenfile
from pipeline.data.tokenfile import PIECE_CHARS, DataError, _documents, open_tokenizer, tokenize_text
from tests.support.data_fixtures import stdlib_corpus, train_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("tok")
    corpus = stdlib_corpus(root / "corpus", max_files=4)
    text = "\n".join(json.loads(line)["text"] for line in corpus.read_text().splitlines())
    return train_tokenizer(corpus, root / "tok", vocab_size=300), text


def _long(text: str, n: int) -> str:
    return (text * (n // len(text) + 1))[:n]


def test_a_long_document_is_cut_where_whitespace_starts_and_tokenizes_as_the_whole(
    tok: tuple[Path, str], tmp_path: Path
) -> None:
    folder, text = tok
    doc = _long(text, PIECE_CHARS + 12345)
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"text": doc}) + "\n")
    pieces = list(_documents([path], "text"))
    assert len(pieces) == 2 and all(len(p) <= PIECE_CHARS for p, _ in pieces)
    assert [ends for _, ends in pieces] == [False, True], "the document ends once"
    assert "".join(p for p, _ in pieces) == doc
    assert all(p[0].isspace() for p, _ in pieces[1:]) and not any(p[-1].isspace() for p, _ in pieces[:-1])
    encoder = open_tokenizer(folder).load()
    whole = encoder.encode(doc, add_special_tokens=False).ids
    tf = tokenize_text(DataConfig(kind="text", path=str(path), tokenizer=str(folder)))
    eos = open_tokenizer(folder).eos_id
    assert [int(i) for i in tf.array()] == [*whole, eos]


def test_text_without_whitespace_is_cut_hard_and_loses_nothing(tok: tuple[Path, str], tmp_path: Path) -> None:
    folder, _ = tok
    blob = "x" * (PIECE_CHARS + 7) + "y" * PIECE_CHARS
    (tmp_path / "t").mkdir()
    path = tmp_path / "t" / "blob.txt"
    path.write_text(blob)
    pieces = list(_documents([path], "text"))
    assert [len(p) for p, _ in pieces] == [PIECE_CHARS, PIECE_CHARS, 7] and pieces[-1][1]
    tf = tokenize_text(DataConfig(kind="text", path=str(path), tokenizer=str(folder)))
    assert open_tokenizer(folder).load().decode([int(i) for i in tf.array()]) == blob


def test_a_plain_text_line_longer_than_a_piece_comes_in_pieces(tok: tuple[Path, str], tmp_path: Path) -> None:
    folder, text = tok
    line = _long(text.replace("\n", " "), PIECE_CHARS + 5000)
    path = tmp_path / "line.txt"
    path.write_text("first line\n" + line + "\nlast line\n")
    pieces = list(_documents([path], "text"))
    assert max(len(p) for p, _ in pieces) <= PIECE_CHARS and len(pieces) >= 2
    assert "".join(p for p, _ in pieces) == path.read_text()
    encoder = open_tokenizer(folder).load()
    assert (
        sum((encoder.encode(p, add_special_tokens=False).ids for p, _ in pieces), [])
        == encoder.encode(path.read_text(), add_special_tokens=False).ids
    )


def test_each_encode_call_sees_a_bounded_batch(
    tok: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real encoder, watched: no call gets more than BATCH_CHARS (+ the last piece) characters."""
    folder, text = tok
    monkeypatch.setattr(tokenfile, "BATCH_CHARS", 300_000)
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": _long(text, PIECE_CHARS + 1000)}) + "\n" for _ in range(3)))
    seen: list[int] = []
    load = tokenfile.Tokenizer.load

    def watched(self: Any) -> Any:
        real = load(self)

        class Watch:
            def encode_batch(self, docs: list[str], **kw: Any) -> Any:
                seen.append(sum(map(len, docs)))
                return real.encode_batch(docs, **kw)

        return Watch()

    monkeypatch.setattr(tokenfile.Tokenizer, "load", watched)
    tf = tokenize_text(DataConfig(kind="text", path=str(path), tokenizer=str(folder)))
    assert sum(seen) == 3 * (PIECE_CHARS + 1000) and len(seen) >= 2
    assert max(seen) < 300_000 + PIECE_CHARS
    assert int(np.count_nonzero(tf.array() == open_tokenizer(folder).eos_id)) == 3


def test_a_line_over_the_stated_size_is_refused_naming_it(
    tok: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, _ = tok
    monkeypatch.setattr(tokenfile, "MAX_LINE_CHARS", 1 << 20)
    (tmp_path / "c").mkdir()
    path = tmp_path / "c" / "big.jsonl"
    path.write_text('{"text": "ok"}\n' + json.dumps({"text": "a " * (1 << 20)}) + "\n")
    with pytest.raises(DataError, match=r"big.jsonl:2 is a line of more than 1 Mi characters"):
        tokenize_text(DataConfig(kind="text", path=str(path), tokenizer=str(folder)))
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["big.jsonl"], (
        "no cache folder, no temporary"
    )


def test_no_temporary_file_is_left_by_a_failure_or_a_killed_process(
    tok: tuple[Path, str], tmp_path: Path
) -> None:
    folder, text = tok
    (tmp_path / "c").mkdir()
    path = tmp_path / "c" / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": text[:1000]}) + "\n" for _ in range(300)) + "{broken\n")
    cfg = DataConfig(kind="text", path=str(path), tokenizer=str(folder))
    with pytest.raises(DataError, match=r"docs.jsonl:301 is not a JSON line"):
        tokenize_text(cfg)
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["docs.jsonl"]
    path.write_text(path.read_text().replace("{broken\n", ""))
    out = tokenfile.text_cache_path(path, [path], open_tokenizer(folder), "text")
    out.parent.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (out.parent / f".{out.name}.{dead.pid}.tmp").write_bytes(b"half")  # a process killed mid-write
    assert tokenize_text(cfg).path == out
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]
