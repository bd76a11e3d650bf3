"""Credentials never leave the process: a tracking URI's user-info is moved into the
environment MLflow reads (MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD; a ~/.netrc entry
works too, through requests), and is stripped from every string that is printed, logged or
written. Values whose key matches a secret pattern (password, token, secret, key) are
replaced before they reach a param, a tag or an artifact; so is, inside any value, text shaped
like a credential (TOKEN_SHAPES: Hugging Face, GitHub, AWS, OpenAI-style and Slack tokens, a
Bearer header, `NAME=value` where NAME names a secret) and any value marked secret
(`mark_secret`, tracking.secrets). Stdlib only.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

DEFAULT_SECRET_PATTERNS = ("password", "passwd", "token", "secret", "key", "*apikey*")
# keys of the project's own schema that a pattern matches but that name a thing, not hold a
# credential: data.text_key is the JSONL field the text is read from (redacted, the job would
# look for a field named ***)
NOT_SECRET_KEYS = frozenset({"data.text_key"})
REDACTED = "***"
USER_ENV, PASSWORD_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"

# scheme://user-info@ anywhere in a text: the user-info ends at the last '@' before the host
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s'\"@]*(?:@[^/?#\s'\"@]*)*@")
_secrets_seen: set[str] = set()  # every password this process stripped from a URI (for free text)

# Credentials by their shape, wherever they appear in a value (each provider's documented prefix;
# the lengths keep ordinary words out: 'sk-learn' or 'hf_home' are no tokens)
TOKEN_SHAPES: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        r"\bhf_[A-Za-z0-9]{16,}",  # Hugging Face user access token
        r"\bgh[pousr]_[A-Za-z0-9]{20,}",  # GitHub classic / OAuth / app tokens
        r"\bgithub_pat_[A-Za-z0-9_]{20,}",  # GitHub fine-grained token
        r"\bglpat-[A-Za-z0-9_-]{20,}",  # GitLab personal access token
        r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b",  # AWS access key id
        r"\bsk-[A-Za-z0-9_-]{20,}",  # OpenAI / Anthropic style secret keys
        r"\bxox[abposr]-[A-Za-z0-9-]{10,}",  # Slack tokens
        r"(?<=\bBearer )[A-Za-z0-9._~+/-]{16,}=*",  # an Authorization header's credential
    )
)
# NAME=value or NAME: value inside a value (`export HF_TOKEN=hf_x`, `--password=x`): the value
# is masked when NAME names a secret (is_secret_key)
_ASSIGNMENT = re.compile(
    r"(?<![\w./])(?P<key>[A-Za-z_][\w.-]*)(?P<sep>=|:[ \t]+)(?P<q>['\"]?)(?P<val>[^\s'\"=,;\]}]+)"
)


def split_userinfo(uri: str) -> tuple[str, str | None, str | None]:
    """'http://u:p@host:5000/x' -> ('http://host:5000/x', 'u', 'p'); user and password are
    percent-decoded. A URI without user-info comes back unchanged with (None, None)."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri, None, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, sep, password = userinfo.partition(":")
    if sep:  # the password (not the user name: a name like "admin" also appears in paths)
        _secrets_seen.update(s for s in (userinfo, password, unquote(password)) if s)
    clean = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return clean, unquote(user) or None, unquote(password) if sep else None


def strip_userinfo(text: str) -> str:
    """Every `scheme://user-info@` in `text` without its user-info, and every password this
    process has already stripped from a URI replaced by ***."""
    out = _USERINFO.sub(r"\1", text)
    for secret in sorted(_secrets_seen, key=len, reverse=True):
        if len(secret) >= 4:  # a very short password would blank out ordinary text
            out = out.replace(secret, REDACTED)
    return out


def mark_secret(value: str) -> None:
    """A value the user marks secret (tracking.secrets): masked wherever this process writes it."""
    if value and len(value) >= 4:
        _secrets_seen.add(value)


def redact_text(text: str, patterns: Iterable[str] = DEFAULT_SECRET_PATTERNS) -> str:
    """`text` as it may be written: user-info stripped (strip_userinfo), credentials found by
    their shape (TOKEN_SHAPES) and values assigned to a secret name (`HF_TOKEN=...`) masked."""
    out = strip_userinfo(text)
    for shape in TOKEN_SHAPES:
        out = shape.sub(REDACTED, out)
    pats = tuple(patterns)

    def assignment(m: re.Match[str]) -> str:
        if m.group("val") == REDACTED or not _is_secret_key(m.group("key"), pats):
            return m.group(0)
        return f"{m.group('key')}{m.group('sep')}{m.group('q')}{REDACTED}"

    return _ASSIGNMENT.sub(assignment, out) if ("=" in out or ":" in out) else out


def adopt_credentials(uri: str) -> str:
    """The URI without its user-info; the user-info goes to the environment MLflow reads (and
    that local and Slurm jobs inherit), never to a file. Returns the clean URI."""
    clean, user, password = split_userinfo(uri)
    if user is not None:
        os.environ[USER_ENV] = user
    if password is not None:
        os.environ[PASSWORD_ENV] = password
    return clean


def is_secret_key(key: str, patterns: Iterable[str] = DEFAULT_SECRET_PATTERNS) -> bool:
    """Whether a param/tag key names a secret: a pattern (fnmatch, any case) matches one of its
    words (split on . _ - /) or the whole key. 'tracking.api_key' and 'hf_token' match 'key'
    and 'token'; 'model.n_kv_heads', 'data.tokens_per_step' and NOT_SECRET_KEYS do not."""
    return _is_secret_key(key, tuple(patterns))


@functools.lru_cache(maxsize=65536)  # a sweep asks about the same keys for every point
def _is_secret_key(key: str, patterns: tuple[str, ...]) -> bool:
    low = key.lower()
    if low in NOT_SECRET_KEYS:
        return False
    words = [w for w in re.split(r"[._/\-]", low) if w]
    return any(fnmatch.fnmatchcase(w, p.lower()) for p in patterns for w in [low, *words])


def redact_mapping(d: Mapping[str, Any], patterns: Iterable[str] = DEFAULT_SECRET_PATTERNS) -> dict[str, str]:
    """Values of secret keys replaced by ***, every other value through redact_text."""
    pats = tuple(patterns)
    return {k: REDACTED if is_secret_key(k, pats) else redact_text(str(v), pats) for k, v in d.items()}


def redact_tree(node: Any, patterns: Iterable[str] = DEFAULT_SECRET_PATTERNS, key: str = "") -> Any:
    """A nested config (dicts and lists of plain values) with secret keys' values replaced and
    every string through redact_text."""
    pats = tuple(patterns)
    if isinstance(node, Mapping):
        return {
            k: REDACTED
            if is_secret_key(f"{key}.{k}" if key else str(k), pats) and not isinstance(v, Mapping)
            else redact_tree(v, pats, f"{key}.{k}" if key else str(k))
            for k, v in node.items()
        }
    if isinstance(node, list | tuple):
        return [redact_tree(v, pats, key) for v in node]
    if isinstance(node, str):
        return redact_text(node, pats)
    return node
