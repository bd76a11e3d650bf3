"""Per-partition references as data, compared by code (ReFrame-style).

A references file (conf/references/*.yaml) maps a scope to metrics:

    references:
      "*":                  {ckpt/verified: [1.0, 0.0, null, "bool"]}
      h100/llama-7b/bf16:   {perf/tokens_per_s: [11000, -0.1, null, "tokens/s"]}

A scope is "<partition>[/<model>[/<precision>[/<parallelism>]]]", "*" matching anything (the
full four parts name one candidate). A run takes every scope that matches it, the more
specific overriding the less for the same metric. Each
metric is [value, lower, upper, unit]; lower and upper are fractions of |value| (-0.1: at
most 10% below; null: unbounded), as in ReFrame. Bad entries and keys that no run reports
are reported as problems and not judged: a typo neither crashes nor fails every run.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from analysis.runs import RunRecord
from pipeline.contract.outcome import Outcome
from pipeline.tracking import keys as K

METRIC_KEYS = frozenset(v for n, v in vars(K).items() if n.isupper() and isinstance(v, str) and "/" in v)
"""Every metric key the job writes (pipeline/tracking/keys.py): metric keys, unlike tags, hold a '/'."""
PASS = "pass"


def _num(x: float) -> str:
    return f"{x:.4g}"


@dataclass(frozen=True)
class Reference:
    metric: str
    value: float
    lower: float | None
    """Fraction of |value| the measurement may fall below it (<= 0), None: no lower bound."""
    upper: float | None
    """Fraction of |value| it may exceed it (>= 0), None: no upper bound."""
    unit: str
    scope: str

    def bounds(self) -> tuple[float | None, float | None]:
        lo = None if self.lower is None else self.value + self.lower * abs(self.value)
        hi = None if self.upper is None else self.value + self.upper * abs(self.value)
        return lo, hi

    def describe(self) -> str:
        def pct(f: float | None) -> str:
            return "none" if f is None else f"{f:+.0%}"

        return f"{_num(self.value)} {self.unit} ({pct(self.lower)}/{pct(self.upper)}, scope {self.scope})"

    def check(self, measured: float | None, missing: str = "not reported") -> RefResult:
        if measured is None:
            return RefResult(self.metric, False, missing)
        lo, hi = self.bounds()
        m = f"{_num(measured)} {self.unit}"
        if lo is not None and measured < lo:
            return RefResult(self.metric, False, f"{m} < {_num(lo)}, the lower bound ({self.describe()})")
        if hi is not None and measured > hi:
            return RefResult(self.metric, False, f"{m} > {_num(hi)}, the upper bound ({self.describe()})")
        return RefResult(self.metric, True, f"{m} within bounds ({self.describe()})")


@dataclass(frozen=True)
class RefResult:
    metric: str
    ok: bool
    reason: str

    @property
    def tag_value(self) -> str:
        """The sq.ref.<metric> tag: "pass" or "fail: <reason>" (MLflow caps tags at 8000 chars)."""
        return PASS if self.ok else f"fail: {self.reason}"[:8000]


def verdict(results: Iterable[RefResult]) -> str | None:
    """'pass' when every reference passed, 'fail' when one did, None when none applied."""
    results = list(results)
    if not results:
        return None
    return PASS if all(r.ok for r in results) else "fail"


Scope = tuple[str, str, str, str]
"""(partition, model, precision, parallelism), "*" for any."""


def scope_key(scope: str) -> Scope | None:
    parts = [p.strip() or "*" for p in scope.split("/")]
    if not 1 <= len(parts) <= 4:
        return None
    parts += ["*"] * (4 - len(parts))
    return parts[0], parts[1], parts[2], parts[3]


@dataclass
class References:
    """Parsed references, keyed by scope."""

    source: str
    scopes: dict[Scope, dict[str, Reference]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    skipped: set[str] = field(default_factory=set)
    """Metric keys not judged (unknown, or no run reports them)."""

    def metrics(self) -> set[str]:
        return {m for refs in self.scopes.values() for m in refs}

    def for_run(self, partition: str, model: str, precision: str, parallelism: str) -> dict[str, Reference]:
        """The references that apply, most specific scope winning per metric."""
        # a partition addressed by its cluster (<cluster>/<partition>, analysis/sweeps.py) is
        # judged by its partition's references: a scope names no cluster ("/" splits its fields)
        want = (partition.rpartition("/")[2], model, precision, parallelism)
        hits = [s for s in self.scopes if all(p in ("*", w) for p, w in zip(s, want, strict=True))]
        hits.sort(key=lambda s: (sum(p != "*" for p in s), [p != "*" for p in s]))
        merged: dict[str, Reference] = {}
        for s in hits:
            merged |= self.scopes[s]
        return {m: r for m, r in merged.items() if m not in self.skipped}


def _number(x: Any) -> float | None:
    """A YAML number; also a string such as "1e9", which YAML 1.1 (PyYAML) reads as a string."""
    if isinstance(x, bool):
        return None
    try:
        return float(x) if isinstance(x, int | float | str) else None
    except ValueError:
        return None


def _parse_entry(metric: str, raw: Any, scope: str) -> Reference:
    if not isinstance(raw, list | tuple) or len(raw) != 4:
        raise ValueError(f"expected [value, lower, upper, unit], got {raw!r}")
    value, lower, upper, unit = _number(raw[0]), _number(raw[1]), _number(raw[2]), raw[3]
    if value is None:
        raise ValueError(f"value must be a number, got {raw[0]!r}")
    for name, frac, given, sign in (("lower", lower, raw[1], -1), ("upper", upper, raw[2], 1)):
        if given is not None and (frac is None or frac * sign < 0):
            raise ValueError(
                f"{name} must be null or a fraction {'<= 0' if sign < 0 else '>= 0'}, got {given!r}"
            )
    return Reference(metric, value, lower, upper, str(unit), scope)


def parse_references(data: Any, source: str) -> References:
    """References from loaded YAML; every bad scope or entry becomes a problem, not an error."""
    refs = References(source)
    body = data.get("references") if isinstance(data, dict) else None
    if body is None:
        if data not in (None, {}):
            refs.problems.append(f"{source}: no top-level 'references:' mapping; no references applied")
        return refs
    if not isinstance(body, dict):
        refs.problems.append(f"{source}: 'references' must map scopes to metrics; no references applied")
        return refs
    for scope, metrics in body.items():
        key = scope_key(str(scope))
        if key is None or not isinstance(metrics, dict):
            refs.problems.append(
                f"{source}: scope '{scope}' is not 'partition[/model[/precision[/parallelism]]]': skipped"
            )
            continue
        for metric, raw in metrics.items():
            try:
                refs.scopes.setdefault(key, {})[str(metric)] = _parse_entry(str(metric), raw, str(scope))
            except ValueError as e:
                refs.problems.append(f"{source}: reference '{metric}' in scope '{scope}': {e}; not judged")
    return refs


def load_references(path: Path | None) -> References:
    """References from a YAML file; None or a missing file gives none (with a problem for a
    missing file that was asked for)."""
    if path is None:
        return References("(none)")
    if not path.exists():
        refs = References(str(path))
        refs.problems.append(f"references file {path} does not exist: runs are not judged")
        return refs
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        refs = References(str(path))
        refs.problems.append(f"references file {path} is not valid YAML ({e}); runs are not judged")
        return refs
    return parse_references(data, str(path))


def check_keys(refs: References, runs: Iterable[RunRecord]) -> None:
    """Mark reference keys that no run reports as skipped, each with a clear problem."""
    reported = {k for r in runs for k in r.metrics}
    for metric in sorted(refs.metrics()):
        if metric in reported:
            continue
        refs.skipped.add(metric)
        scopes = ", ".join(sorted(r.scope for s in refs.scopes.values() for m, r in s.items() if m == metric))
        if metric in METRIC_KEYS:
            why = "a known metric, but no run of this sweep reports it"
        else:
            close = difflib.get_close_matches(metric, METRIC_KEYS, n=1)
            why = "not a metric the job writes (pipeline/tracking/keys.py)" + (
                f"; did you mean '{close[0]}'?" if close else ""
            )
        refs.problems.append(
            f"unknown reference key '{metric}' (scope {scopes} in {refs.source}): {why}; not judged"
        )


def judge(
    refs: Mapping[str, Reference], value: Callable[[str], float | None], missing: str = "not reported"
) -> list[RefResult]:
    """Each reference checked against value(metric); a missing value fails with `missing`."""
    return [ref.check(value(metric), missing) for metric, ref in sorted(refs.items())]


def judge_run(refs: References, run: RunRecord) -> list[RefResult]:
    applicable = refs.for_run(run.partition, run.model, run.precision, run.parallelism)
    missing = "not reported by this run"
    if run.outcome == Outcome.FAILED:  # say why it has no value: the run's own failure
        reason = run.tag(K.TAG_REASON) or "no reason recorded"
        missing = f"not reported: the run failed ({reason})"
    return judge(applicable, run.metric, missing)


def ref_tags(results: list[RefResult]) -> dict[str, str]:
    tags = {K.TAG_REF_PREFIX + r.metric: r.tag_value for r in results}
    v = verdict(results)
    if v is not None:
        tags[K.TAG_VERDICT] = v
    return tags


def write_tags(client: Any, judged: Iterable[tuple[RunRecord, list[RefResult]]]) -> int:
    """Set sq.ref.<metric> and sq.verdict on each judged run, through the MLflow API. Only runs
    whose tags change are written (one log_batch each), and stale sq.ref.* tags are deleted,
    so a second report on the same sweep writes nothing. Returns the number of runs written."""
    from mlflow.entities import RunTag

    written = 0
    for run, results in judged:
        want = ref_tags(results)
        have = {k: v for k, v in run.tags.items() if k.startswith(K.TAG_REF_PREFIX) or k == K.TAG_VERDICT}
        if want == have:
            continue
        changed = [RunTag(k, v) for k, v in want.items() if have.get(k) != v]
        if changed:
            client.log_batch(run.run_id, tags=changed)
        for stale in sorted(set(have) - set(want)):
            client.delete_tag(run.run_id, stale)
        written += 1
    return written
