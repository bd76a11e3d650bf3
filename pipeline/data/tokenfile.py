"""Token files (the flat binary format of nanoGPT and Megatron: token ids back to back, uint16
or uint32), their checks, and text tokenized once into one. No torch: the login node runs these
checks (and the tokenization) before anything is submitted; the job opens the same file.

A text corpus is tokenized into `.sq-cache/` next to the data, named by a hash of its inputs
(each corpus file's path, size and modification time, the tokenizer's files, the jsonl key),
written to a temporary name and renamed, so points that start at once never see half a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TextIO

import numpy as np

CACHE_DIR = ".sq-cache"
CACHE_VERSION = 2  # bump when the tokenization below changes what it writes
TEXT_SUFFIXES = (".jsonl", ".txt", ".text", ".md")
PIECE_CHARS = 1 << 18
"""The most characters one encode call sees (256 Ki): a longer document is tokenized in pieces."""
BATCH_CHARS = 1 << 22
"""The most characters of one encode_batch call (4 Mi), and at most BATCH_DOCS pieces."""
BATCH_DOCS = 256
MAX_LINE_CHARS = 1 << 27
"""The longest jsonl line read (128 Mi characters: it is parsed whole); a longer one is refused."""
_SCAN_CHUNK = 1 << 24  # tokens per chunk when scanning a file for its largest id
_max_ids: dict[tuple[str, int, int], int] = {}  # (path, size, mtime_ns) -> largest id, this process


class DataError(ValueError):
    """The data cannot be read as configured (the login node reports it as bad input, exit 2)."""


class DataSection(Protocol):
    """What this module reads of a point's data section (pipeline.config.schema.DataConfig)."""

    kind: str
    path: str | None
    tokenizer: str | None
    text_key: str
    dtype: str
    eval_frac: float


FINGERPRINT_BLOCKS, FINGERPRINT_BLOCK_BYTES = 16, 1 << 16
"""TokenFile.fingerprint's sample: 16 blocks of 64 KiB (1 MiB read)."""


@dataclass(frozen=True)
class TokenFile:
    """A token file and its split: the first n_train tokens train, the tail evaluates."""

    path: Path
    dtype: str  # uint16 | uint32
    n_tokens: int
    eval_frac: float

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def n_eval(self) -> int:
        return int(self.n_tokens * self.eval_frac)

    @property
    def n_train(self) -> int:
        return self.n_tokens - self.n_eval

    def array(self) -> np.memmap:
        return np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.n_tokens,))

    def fingerprint(self) -> str:
        """The data's identity wherever the file lies (two clusters' copies of one corpus): its
        width, its length in tokens and the sha256 of FINGERPRINT_BLOCKS blocks of
        FINGERPRINT_BLOCK_BYTES spread evenly over it, first and last included (the whole file
        when it is smaller). Read in well under a second whatever the size."""
        size = self.n_tokens * self.itemsize
        h = hashlib.sha256(f"{self.dtype}:{self.n_tokens}".encode())
        with open(self.path, "rb") as f:
            if size <= FINGERPRINT_BLOCKS * FINGERPRINT_BLOCK_BYTES:
                h.update(f.read())
            else:
                last = size - FINGERPRINT_BLOCK_BYTES
                for i in range(FINGERPRINT_BLOCKS):
                    f.seek(last * i // (FINGERPRINT_BLOCKS - 1))
                    h.update(f.read(FINGERPRINT_BLOCK_BYTES))
        return f"{self.dtype}:{self.n_tokens}:{h.hexdigest()[:16]}"


def open_token_file(path: str | Path, dtype: str, eval_frac: float) -> TokenFile:
    p = Path(path).expanduser()
    if p.is_dir():
        raise DataError(
            f"data.path={str(path)!r} is a folder; allowed: a token file (uint16/uint32) with data=tokens."
        )
    if p.exists() and not p.is_file():
        raise DataError(
            f"data.path={str(path)!r} is not a regular file (a device, pipe or socket); allowed: a token file "
            "(uint16/uint32) with data=tokens."
        )
    if not p.is_file():
        raise DataError(f"data.path={str(path)!r}: no such token file.")
    size, width = p.stat().st_size, np.dtype(dtype).itemsize
    if size % width:
        raise DataError(
            f"data.path={str(path)!r} is {size} bytes, not a multiple of data.dtype={dtype} ({width} bytes per "
            "token id): a file of another width (set data.dtype=uint16 or uint32) or a truncated file."
        )
    return TokenFile(p, dtype, size // width, eval_frac)


def max_token_id(tf: TokenFile) -> int:
    """The largest id in the file, scanned in chunks once per file version (cached)."""
    st = tf.path.stat()
    key = (str(tf.path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _max_ids:
        arr, top = tf.array(), 0
        for i in range(0, tf.n_tokens, _SCAN_CHUNK):
            top = max(top, int(arr[i : i + _SCAN_CHUNK].max()))
        _max_ids[key] = top
    return _max_ids[key]


# --- text -> tokens ---------------------------------------------------------------------------
def _corpus_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and p.suffix in TEXT_SUFFIXES and CACHE_DIR not in p.parts
        )
    return [path]


def _documents(files: list[Path], text_key: str) -> Iterator[tuple[str, bool]]:
    """The corpus as (text, ends a document) pieces of at most PIECE_CHARS characters whatever
    the input (a document is tokenized piece by piece: memory stays bounded). jsonl: one
    document per line (its `text_key` field; a line over MAX_LINE_CHARS is refused, naming it);
    plain text: paragraphs of about 64 k characters, cut at line ends, a longer line in pieces."""
    for f in files:
        with f.open(encoding="utf-8", errors="replace") as fh:
            if f.suffix == ".jsonl":
                for doc in _jsonl_documents(f, fh, text_key):
                    yield from _cut(doc, end=True)
            else:
                yield from _plain_pieces(fh)


def _jsonl_documents(f: Path, fh: TextIO, text_key: str) -> Iterator[str]:
    n = 0
    while line := fh.readline(MAX_LINE_CHARS + 1):
        n += 1
        if len(line) > MAX_LINE_CHARS:
            raise DataError(
                f"data.path: {f}:{n} is a line of more than {MAX_LINE_CHARS // (1 << 20)} Mi characters: one "
                "jsonl document may hold at most that much (it is read whole to be parsed); split the "
                "document over several lines, or give it as a plain-text file (read in pieces)."
            )
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"data.path: {f}:{n} is not a JSON line ({e.msg}).") from e
        del line  # one copy of a long document at a time
        if not isinstance(doc, dict) or not isinstance(doc.get(text_key), str):
            raise DataError(
                f"data.path: {f}:{n} has no string field data.text_key={text_key!r} "
                f"(its keys: {sorted(doc) if isinstance(doc, dict) else type(doc).__name__})."
            )
        yield doc.pop(text_key)


def _plain_pieces(fh: TextIO) -> Iterator[tuple[str, bool]]:
    buf: list[str] = []
    size = 0
    while line := fh.readline(PIECE_CHARS):  # a line longer than that comes in several reads
        buf.append(line)
        size += len(line)
        if size >= 65536 and line.endswith("\n"):
            yield "".join(buf), True
            buf, size = [], 0
        elif size >= PIECE_CHARS:  # inside a long line: cut where whitespace starts, carry the rest
            text = "".join(buf)
            cut = _cut_at(text, PIECE_CHARS)
            yield text[:cut], False
            buf, size = [text[cut:]], len(text) - cut
    if buf:
        yield "".join(buf), True


def _cut_at(text: str, limit: int, start: int = 0) -> int:
    """Where to end a piece of `text` that starts at `start` and holds at most `limit`
    characters: where the last run of whitespace inside it starts (the pre-tokenizers split
    there, so the pieces tokenize as the whole would), else at the limit (no whitespace: a hard
    cut, which a token may straddle)."""
    end = min(len(text), start + limit)
    if end == len(text):
        return end
    ws = max(text.rfind(c, start + 1, end + 1) for c in " \n\t\r")
    if ws <= start:
        return end
    while ws - 1 > start and text[ws - 1].isspace():
        ws -= 1
    return ws if ws > start else end


def _cut(doc: str, end: bool) -> Iterator[tuple[str, bool]]:
    """A document in pieces of at most PIECE_CHARS characters (the last one ends it)."""
    start = 0
    while len(doc) - start > PIECE_CHARS:
        cut = _cut_at(doc, PIECE_CHARS, start)
        yield doc[start:cut], False
        start = cut
    yield doc[start:], end


@dataclass(frozen=True)
class Tokenizer:
    folder: Path
    vocab_size: int
    eos_id: int | None

    def load(self) -> Any:
        from tokenizers import Tokenizer as HFTokenizer

        return HFTokenizer.from_file(str(self.folder / "tokenizer.json"))


def open_tokenizer(folder: str | Path) -> Tokenizer:
    """A local tokenizer folder as save_pretrained writes it (tokenizer.json, and the eos token
    in tokenizer_config.json, if any: documents are separated by it)."""
    d = Path(folder).expanduser()
    if not (d / "tokenizer.json").is_file():
        what = "does not exist" if not d.exists() else "has no tokenizer.json"
        raise DataError(
            f"data.tokenizer={str(folder)!r} {what}: give a local folder saved by a fast tokenizer's "
            "save_pretrained (or tokenizers' Tokenizer.save to <folder>/tokenizer.json). Nothing is downloaded."
        )
    from tokenizers import Tokenizer as HFTokenizer

    try:
        tok = HFTokenizer.from_file(str(d / "tokenizer.json"))
    except Exception as e:  # tokenizers raises a bare Exception for a file it cannot parse
        raise DataError(
            f"data.tokenizer={str(folder)!r}: its tokenizer.json cannot be read ({_first_line(e)}): a damaged or "
            "truncated file, or one written by a newer tokenizers. Save the tokenizer again with "
            "save_pretrained (or tokenizers' Tokenizer.save)."
        ) from None
    eos = None
    conf = d / "tokenizer_config.json"
    if conf.is_file():
        try:
            settings = json.loads(conf.read_text(encoding="utf-8"))
        except (ValueError, OSError) as e:
            settings = e
        if not isinstance(settings, dict):
            why = (
                _first_line(settings)
                if isinstance(settings, Exception)
                else f"a JSON {type(settings).__name__}"
            )
            raise DataError(
                f"data.tokenizer={str(folder)!r}: its tokenizer_config.json is no JSON object ({why}): a damaged "
                "file. Save the tokenizer again with save_pretrained, or remove the file (its eos token "
                "separates the documents)."
            )
        name = settings.get("eos_token")
        name = name.get("content") if isinstance(name, dict) else name
        eos = tok.token_to_id(name) if isinstance(name, str) else None
    return Tokenizer(d, tok.get_vocab_size(with_added_tokens=True), eos)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _digest(files: list[Path], tok: Tokenizer, text_key: str) -> str:
    h = hashlib.sha256(f"v{CACHE_VERSION} key={text_key} eos={tok.eos_id}".encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        p = tok.folder / name
        if p.is_file():
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


def text_cache_path(path: Path, files: list[Path], tok: Tokenizer, text_key: str) -> Path:
    folder = path if path.is_dir() else path.parent
    stem = "tokens" if path.is_dir() else path.stem
    return folder / CACHE_DIR / f"{stem}-{_digest(files, tok, text_key)}.bin"


def tokenize_text(data: DataSection) -> TokenFile:
    """The token file of data=text: from the cache, or tokenized now and written atomically."""
    assert data.path and data.tokenizer
    path = Path(data.path).expanduser()
    if not path.exists():
        raise DataError(
            f"data.path={data.path!r} does not exist: give a .jsonl/.txt file or a folder of them."
        )
    tok = open_tokenizer(data.tokenizer)
    files = _corpus_files(path)
    if not files:
        raise DataError(f"data.path={data.path!r} holds no {'/'.join(TEXT_SUFFIXES)} files.")
    dtype = "uint16" if tok.vocab_size <= 1 << 16 else "uint32"
    out = text_cache_path(path, files, tok, data.text_key)
    if not out.is_file():
        _write_cache(out, files, tok, data.text_key, dtype)
    return open_token_file(out, dtype, data.eval_frac)


def _write_cache(out: Path, files: list[Path], tok: Tokenizer, text_key: str, dtype: str) -> None:
    """Tokenize into a temporary file beside `out`, renamed over it when whole: on any failure
    it is removed (and a temporary file a killed process left is removed by the next run), and
    a cache folder this made stays only when something is in it."""
    made = not out.parent.exists()
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    encoder = tok.load()
    try:
        with tmp.open("wb") as fh:
            batch: list[tuple[str, bool]] = []
            chars = 0
            for piece in _documents(files, text_key):
                batch.append(piece)
                chars += len(piece[0])
                if len(batch) == BATCH_DOCS or chars >= BATCH_CHARS:
                    _write_ids(fh, encoder, batch, tok.eos_id, dtype)
                    batch, chars = [], 0
            _write_ids(fh, encoder, batch, tok.eos_id, dtype)
        os.replace(tmp, out)  # atomic: a concurrent point sees the old state or the whole file
    finally:
        tmp.unlink(missing_ok=True)
        if made and not out.exists():
            with contextlib.suppress(OSError):
                out.parent.rmdir()


def _remove_stale(out: Path) -> None:
    """Temporary files of `out` whose process is gone (killed: no `finally` ran)."""
    for old in out.parent.glob(f".{out.name}.*.tmp"):
        pid = old.name[len(out.name) + 2 : -len(".tmp")]
        if pid.isdigit() and not _alive(int(pid)):
            old.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_ids(
    fh: BinaryIO, encoder: Any, pieces: list[tuple[str, bool]], eos: int | None, dtype: str
) -> None:
    if not pieces:
        return
    encodings = encoder.encode_batch([text for text, _ in pieces], add_special_tokens=False)
    for enc, (_, ends) in zip(encodings, pieces, strict=True):
        ids = [*enc.ids, *([eos] if eos is not None and ends else [])]
        np.asarray(ids, dtype=dtype).tofile(fh)


def resolve(data: DataSection) -> TokenFile | None:
    """The token file a run reads (None for data=synthetic)."""
    if data.kind == "synthetic":
        return None
    if data.kind == "text":
        return tokenize_text(data)
    assert data.path
    return open_token_file(data.path, data.dtype, data.eval_frac)


def data_problems(data: DataSection, vocab: int, seq_len: int) -> list[str]:
    """What makes the point's data unusable with a model of `vocab` embedding rows that trains
    on sequences of `seq_len` (empty: fine). Tokenizes data=text into its cache on the way, so
    the jobs find it ready."""
    window = seq_len + 1
    if data.kind == "synthetic":
        return []
    try:
        if data.kind == "text":
            assert data.tokenizer
            tok = open_tokenizer(data.tokenizer)
            if tok.vocab_size > vocab:
                return [
                    f"data.tokenizer={data.tokenizer!r} has {tok.vocab_size} tokens, more than the model's "
                    f"embedding (model.vocab_size={vocab}): use the model's own tokenizer or a model with a "
                    "larger vocabulary"
                ]
        tf = resolve(data)
    except DataError as e:
        return [str(e).rstrip(".")]
    assert tf is not None
    problems = []
    for split, n in (("training", tf.n_train), ("evaluation", tf.n_eval)):
        if n < window:
            problems.append(
                f"data.path={data.path!r}: its {split} split has {n} tokens ({tf.n_tokens} in all, data.eval_frac="
                f"{data.eval_frac} held out), shorter than one sequence of model.seq_len + 1 = {window} tokens"
            )
    if not problems and (top := max_token_id(tf)) >= vocab:
        problems.append(
            f"data.path={data.path!r} holds token id {top}, beyond the model's vocabulary (model.vocab_size="
            f"{vocab}, ids 0..{vocab - 1}): the file was made with another tokenizer, or data.dtype is wrong"
        )
    return problems
