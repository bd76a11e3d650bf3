"""A conversation through the tokenizer's own chat template, and its loss mask.

The template is the tokenizer folder's (`chat_template.jinja`, else `chat_template` in
`tokenizer_config.json`), or `data.chat_template` (a file) when given. Rendering is transformers'
`apply_chat_template(tokenize=True, return_dict=True)`: `return_dict` is passed, as its default
changed between transformers 4.x (False) and 5.x (True).

The mask marks the tokens trained on (`data.train_on`: assistant = every assistant turn, last =
the last one, all = every token). Where the template has `{% generation %}` markers,
transformers' assistant mask is used; where it has none, the mask is derived by rendering the
conversation prefix by prefix and diffing the token ids (torchtune's and axolotl's way): the
tokens of assistant turn i are those the render of turns 0..i adds to the render of turns
0..i-1 with the generation prompt, so the end-of-turn / EOS the template writes after an
answer is trained. An assistant turn with content whose mask is empty is a template that
renders no assistant token: refused, never a silent all-zero mask.

transformers is imported inside functions, and only its tokenizer (no torch): this runs on the
login node, which tokenizes a chat set once before anything is submitted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.chat import Message
from pipeline.data.tokenfile import DataError

_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


def template_of(folder: str | Path, template_file: str | None) -> str:
    """The chat template text: the file given, else the tokenizer folder's."""
    if template_file:
        p = Path(template_file).expanduser()
        if not p.is_file():
            raise DataError(f"data.chat_template={template_file!r}: no such file (a Jinja chat template).")
        return p.read_text(encoding="utf-8")
    d = Path(folder).expanduser()
    if (d / "chat_template.jinja").is_file():
        return (d / "chat_template.jinja").read_text(encoding="utf-8")
    conf = d / "tokenizer_config.json"
    found = json.loads(conf.read_text()).get("chat_template") if conf.is_file() else None
    if isinstance(found, list):  # named templates: the default one
        found = next((t.get("template") for t in found if t.get("name") == "default"), None)
    if not isinstance(found, str) or not found.strip():
        raise DataError(
            f"data.tokenizer={str(folder)!r} has no chat template (no chat_template.jinja, no chat_template in "
            "tokenizer_config.json), and data.chat_template names no template file: give the model's template "
            "as a file with data.chat_template=/path/to/template.jinja."
        )
    return found


def has_generation_markers(template: str) -> bool:
    return bool(_GENERATION.search(template))


def load_tokenizer(folder: str | Path, template: str) -> Any:
    """The folder's fast tokenizer (transformers, no torch) with `template` as its chat template."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(Path(folder).expanduser()), local_files_only=True)
    tok.chat_template = template
    return tok


def _ids(tok: Any, messages: Sequence[Message], generation_prompt: bool = False) -> list[int]:
    out = tok.apply_chat_template(
        list(messages), tokenize=True, return_dict=True, add_generation_prompt=generation_prompt
    )
    return list(out["input_ids"])


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _spans_by_diff(tok: Any, messages: Sequence[Message], full: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each assistant turn in `full`, by rendering prefix by prefix."""
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = _common(_ids(tok, messages[:i], generation_prompt=True), full) if i else 0
        end = _common(_ids(tok, messages[: i + 1]), full)
        if end > start:
            spans.append((start, end))
    return spans


def _spans_of_mask(mask: Sequence[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, v in enumerate([*mask, 0]):
        if v and start is None:
            start = i
        elif not v and start is not None:
            spans.append((start, i))
            start = None
    return spans


def render(
    tok: Any, messages: Sequence[Message], train_on: str, markers: bool, where: str
) -> tuple[np.ndarray, np.ndarray, int]:
    """(token ids, trained mask, prompt length) of one conversation. Prompt length: tokens
    before the first trained one. Refuses a conversation whose assistant content renders to no
    token of the mask (the template's fault, not the sample's)."""
    if markers:
        out = tok.apply_chat_template(
            list(messages), tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ids = list(out["input_ids"])
        spans = _spans_of_mask(out["assistant_masks"])
    else:
        ids = _ids(tok, messages)
        spans = _spans_by_diff(tok, messages, ids)
    answered = any(m["role"] == "assistant" and m["content"].strip() for m in messages)
    if answered and not spans:
        how = "its {% generation %} markers" if markers else "rendering it prefix by prefix"
        raise DataError(
            f"data.path: {where}: the chat template renders no assistant token for this conversation (found by "
            f"{how}): the template drops or hides the assistant's turns; give a template that writes them "
            "(data.chat_template=/path/to/template.jinja)."
        )
    mask = np.zeros(len(ids), dtype=np.bool_)
    if train_on == "all":
        mask[:] = bool(spans)  # nothing to learn from a conversation without an answer
    for s, e in spans[-1:] if train_on == "last" else spans if train_on == "assistant" else []:
        mask[s:e] = True
    prompt = spans[0][0] if spans else len(ids)
    return np.asarray(ids, dtype=np.int64), mask, prompt
