"""Point names for the sweep's summary table: every row tells its point apart.

A point id is `pNNNN-<candidate>-<drills>`; repeats (`sweep.repeats=N`, `train.seed=1,2,3`) share
the candidate and the drills, so their ids differ only in the index. A row's name is the id
followed by the overrides that differ between the points of that id (`seed=2`), and a name
longer than the column keeps the index and the part that differs: the text common to every
row is elided (`…`) just before the first difference, and where that is not enough the column
widens to the longest name rather than cutting a difference off.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Sequence

from pipeline.contract.sweepdir import PointEntry

WIDTH = 46
ELLIPSIS = "…"
_INDEX = re.compile(r"^(p\d+-)(.*)$")


def _split(point_id: str) -> tuple[str, str]:
    m = _INDEX.match(point_id)
    return (m.group(1), m.group(2)) if m else ("", point_id)


def _differing(entries: Sequence[PointEntry]) -> dict[str, str]:
    """Per point id, the overrides (last key part = value) that differ among the points that
    share its id without the index; empty for a point whose id is unique."""
    groups: dict[str, list[PointEntry]] = defaultdict(list)
    for e in entries:
        groups[_split(e.point_id)[1]].append(e)
    out: dict[str, str] = {}
    for group in groups.values():
        if len(group) < 2:
            continue
        common = set.intersection(*(set(e.overrides) for e in group))
        for e in group:
            diff = [o for o in e.overrides if o not in common]
            out[e.point_id] = " ".join(_short(o) for o in diff)
    return out


def _short(override: str) -> str:
    key, sep, value = override.partition("=")
    return f"{key.lstrip('+~').rsplit('.', 1)[-1]}={value}" if sep else override


def _fit(name: str, common: int, width: int) -> str:
    """`name` within `width`: the index kept, then as much of the candidate's start as fits, the
    text common to every row elided (`…`) up to the word that holds the first difference."""
    if len(name) <= width:
        return name
    head, rest = _split(name)
    cut = len(name) - width + len(ELLIPSIS)  # characters to elide
    # the word holding the first difference is kept whole, with the space, - or / before it
    end = max(0, *(rest.rfind(sep, 0, common) for sep in " -/"))
    if end >= cut:
        rest = rest[: end - cut] + ELLIPSIS + rest[end:]
    short = head + rest
    return short if len(short) <= width else short[: width - len(ELLIPSIS)] + ELLIPSIS


def point_names(entries: Sequence[PointEntry], width: int = WIDTH) -> list[str]:
    """One name per entry, in order, that tells its point apart from every other row's."""
    extra = _differing(entries)
    full = [f"{e.point_id} {extra[e.point_id]}" if extra.get(e.point_id) else e.point_id for e in entries]
    rests = [_split(n)[1] for n in full]
    common = len(os.path.commonprefix(rests)) if len(rests) > 1 else 0
    fitted = [_fit(n, common, width) for n in full]
    told_apart = len({_split(n)[1] for n in fitted}) == len({_split(n)[1] for n in full})
    return fitted if told_apart else full
