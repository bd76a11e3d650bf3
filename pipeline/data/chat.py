"""Chat and instruction records, each format a small pure transform to one internal shape: a
conversation, a list of messages `{"role": system | user | assistant, "content": str}`.

| data.format | a jsonl record | roles |
|---|---|---|
| messages | `{"messages": [{"role": ..., "content": ...}, ...]}` (OpenAI) | system, user, assistant |
| sharegpt | `{"conversations": [{"from": ..., "value": ...}, ...]}` | system, human, gpt |
| alpaca | `{"instruction": ..., "input": ..., "output": ...}` (input optional) | user, then assistant |
| prompt_completion | `{"prompt": ..., "completion": ...}` | user, then assistant |

`auto` picks the format from each record's fields (the first of the order above it has).
`data.messages_field` renames the list field of messages / sharegpt. Every refusal names the
file and line (DataError: bad input, exit 2 on the login node). No tokenizer here: rendering
and masking are pipeline.data.render's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.data.tokenfile import CACHE_DIR, DataError

ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
}
LIST_KEYS = {"messages": "messages", "sharegpt": "conversations"}
Message = dict[str, str]


def _list_of(rec: dict[str, Any], key: str, where: str) -> list[Any]:
    turns = rec.get(key)
    if not isinstance(turns, list) or not turns:
        raise DataError(f"data.path: {where}: field {key!r} is not a non-empty list of messages.")
    return turns


def from_messages(rec: dict[str, Any], where: str, key: str = "messages") -> list[Message]:
    out = []
    for i, m in enumerate(_list_of(rec, key, where)):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise DataError(f"data.path: {where}: {key}[{i}] has no string 'content'.")
        role = m.get("role")
        if role not in ROLES:
            raise DataError(
                f"data.path: {where}: {key}[{i}] has the unknown role {role!r}; allowed: {', '.join(ROLES)}."
            )
        out.append({"role": str(role), "content": m["content"]})
    return out


def from_sharegpt(rec: dict[str, Any], where: str, key: str = "conversations") -> list[Message]:
    out = []
    for i, m in enumerate(_list_of(rec, key, where)):
        if not isinstance(m, dict) or not isinstance(m.get("value"), str):
            raise DataError(f"data.path: {where}: {key}[{i}] has no string 'value'.")
        role = m.get("from")
        if role not in SHAREGPT_ROLES:
            raise DataError(
                f"data.path: {where}: {key}[{i}] has the unknown role (from) {role!r}; allowed: "
                f"{', '.join(SHAREGPT_ROLES)}."
            )
        out.append({"role": SHAREGPT_ROLES[str(role)], "content": m["value"]})
    return out


def _strings(rec: dict[str, Any], where: str, keys: tuple[str, ...]) -> list[str]:
    bad = [k for k in keys if not isinstance(rec.get(k), str)]
    if bad:
        raise DataError(f"data.path: {where}: field {bad[0]!r} is not a string.")
    return [rec[k] for k in keys]


def from_alpaca(rec: dict[str, Any], where: str) -> list[Message]:
    instruction, output = _strings(rec, where, ("instruction", "output"))
    extra = rec.get("input") or ""
    if not isinstance(extra, str):
        raise DataError(f"data.path: {where}: field 'input' is not a string.")
    prompt = f"{instruction}\n\n{extra}" if extra else instruction
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]


def from_prompt_completion(rec: dict[str, Any], where: str) -> list[Message]:
    prompt, completion = _strings(rec, where, ("prompt", "completion"))
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]


def detect(rec: dict[str, Any], messages_field: str | None = None) -> str | None:
    """The format of a record from its fields, None when it has none of any format's."""
    if (messages_field or "messages") in rec:
        return "messages"
    if (messages_field or "conversations") in rec:
        return "sharegpt"
    if "instruction" in rec and "output" in rec:
        return "alpaca"
    if "prompt" in rec and "completion" in rec:
        return "prompt_completion"
    return None


_FIELDS = {
    "messages": "messages (a list of role/content)",
    "sharegpt": "conversations (a list of from/value)",
    "alpaca": "instruction and output (input optional)",
    "prompt_completion": "prompt and completion",
}


def to_messages(rec: Any, fmt: str, where: str, messages_field: str | None = None) -> list[Message]:
    """One record as a conversation (`fmt` one of pipeline.measure.kinds.CHAT_FORMATS)."""
    if not isinstance(rec, dict):
        raise DataError(f"data.path: {where} is a JSON {type(rec).__name__}, not an object.")
    found = detect(rec, messages_field) if fmt == "auto" else fmt
    lacking = (
        found is None
        or (found in LIST_KEYS and (messages_field or LIST_KEYS[found]) not in rec)
        or (found == "alpaca" and "instruction" not in rec)
        or (found == "prompt_completion" and "prompt" not in rec)
    )
    if lacking:
        wanted = "; ".join(f"{k}: {v}" for k, v in _FIELDS.items() if fmt in ("auto", k))
        raise DataError(
            f"data.path: {where} has none of the fields of data.format={fmt} ({wanted}); its keys: {sorted(rec)}."
        )
    if found == "messages":
        return from_messages(rec, where, messages_field or "messages")
    if found == "sharegpt":
        return from_sharegpt(rec, where, messages_field or "conversations")
    if found == "alpaca":
        return from_alpaca(rec, where)
    return from_prompt_completion(rec, where)


def chat_files(path: Path) -> list[Path]:
    """The jsonl files of data.path: the file, or every .jsonl under the folder (sorted)."""
    if path.is_dir():
        return sorted(p for p in path.rglob("*.jsonl") if p.is_file() and CACHE_DIR not in p.parts)
    return [path]


def conversations(
    files: list[Path], fmt: str, messages_field: str | None = None
) -> Iterator[tuple[str, list[Message]]]:
    """(where, conversation) of every non-blank line, where = "file:line"."""
    for f in files:
        with f.open(encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                where = f"{f}:{n}"
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"data.path: {where} is not a JSON line ({e.msg}).") from e
                yield where, to_messages(rec, fmt, where, messages_field)
