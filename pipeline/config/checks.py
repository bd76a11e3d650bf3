"""The schema's checks of a value (`require`, `number`) and the error they raise: below the
schema, so that a drill's options (pipeline.drills, which the schema reads) check their values
the same way without importing the schema."""

from __future__ import annotations

import math
from typing import Any


class ConfigError(ValueError):
    """A config point is invalid; the message is one paragraph a user can act on."""


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"Invalid value for '{key}': {value!r}. Allowed: {allowed}.")


def number(
    key: str, value: float, lo: float | None = None, hi: float | None = None, above: bool = False
) -> None:
    """A finite number in [lo, hi] ((lo, hi] when `above`); bounds of None are open."""
    ok = isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (lo is None or (value > lo if above else value >= lo)) and (hi is None or value <= hi)
    low = "" if lo is None else f"{'>' if above else '>='} {lo:g}"
    high = "" if hi is None else f"<= {hi:g}"
    require(ok, key, value, "a finite number " + " and ".join(s for s in (low, high) if s))
