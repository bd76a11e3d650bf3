"""`sweep.repeats=N`: every point N times with seeds train.seed, train.seed + 1, ... (a sweep axis
on train.seed), so a candidate's figures aggregate N repeats (docs/design.md, "The decision and
its confidence"). A seed list (`train.seed=1,2,3`) does the same with the seeds given."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.config.schema import ConfigError, SweepConfig, TrainConfig

MAX_REPEATS = 1000


def _value(overrides: Sequence[str], key: str) -> str | None:
    found = None
    for ov in overrides:
        k, sep, v = ov.partition("=")
        if sep and k.lstrip("+") == key:
            found = v.strip()
    return found


def repeat_axis(sweep: SweepConfig, user_overrides: Sequence[str]) -> list[str] | None:
    """The train.seed axis of `sweep.repeats` (the user's override, else the preset's), or None
    for one repeat or when train.seed is swept already (its list decides)."""
    raw = _value(user_overrides, "sweep.repeats")
    try:
        n = int(raw) if raw is not None else sweep.repeats
    except ValueError:
        raise ConfigError(
            f"Invalid value for 'sweep.repeats': {raw!r}. Allowed: an integer in [1, {MAX_REPEATS}]. "
            "Nothing was submitted."
        ) from None
    if not 1 <= n <= MAX_REPEATS:
        raise ConfigError(
            f"Invalid value for 'sweep.repeats': {n}. Allowed: an integer in [1, {MAX_REPEATS}]. Nothing was submitted."
        )
    seed = _value(user_overrides, "train.seed")
    if n == 1 or (seed is not None and "," in seed) or "train.seed" in sweep.grid:
        return None
    try:
        base = int(seed) if seed is not None else TrainConfig().seed
    except ValueError:
        return None  # a bad seed is refused by the schema, with its own message
    return [f"train.seed={base + i}" for i in range(n)]
