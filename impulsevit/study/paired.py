"""Paired differences between two methods of a study: per seed, ``method − reference``, and a Student-t interval on
their mean. Pure functions on ``{seed: value}`` mappings; what the interval means and how the report uses it is in
:mod:`impulsevit.study.report`.

Computation, for the n seeds at which both methods have a finite value (``d_i = method_i − reference_i``):
mean ``d̄``, sample std ``s`` (n − 1 denominator), half width ``t_{1−α/2, n−1} · s / √n`` (``scipy.stats.t``), with
``α = 1 − confidence``. ``scipy.stats.ttest_rel(...).confidence_interval`` gives the same numbers (the tests check),
but it warns of "catastrophic cancellation" when every difference is the same (duplicated runs, a constant shift) and
keeps neither the per-seed differences nor which seeds paired, which the report prints; so only the t quantile comes
from scipy.

Not supported: a bootstrap (meaningless at n = 3), weights, more than one value per seed and method.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence

__all__ = ["PairedDifference", "pair_by_seed", "paired_difference", "t_interval"]


@dataclasses.dataclass(frozen=True)
class PairedDifference:
    """``method − reference`` per paired seed and its summary, in the unit of the values given (the report: top-1
    percentage points). ``std`` / ``low`` / ``high`` are ``None`` when fewer than 2 seeds pair (no interval);
    ``mean`` is ``None`` when none does."""

    seeds: tuple[int, ...]
    diffs: tuple[float, ...]
    confidence: float
    mean: float | None
    std: float | None
    low: float | None
    high: float | None

    @property
    def n(self) -> int:
        """How many seeds paired."""
        return len(self.seeds)

    @property
    def excludes_zero(self) -> bool | None:
        """Whether the interval lies entirely above or below 0 (``None`` without an interval)."""
        if self.low is None or self.high is None:
            return None
        return self.low > 0 or self.high < 0

    def to_dict(self) -> dict:
        """JSON-ready: ``n``, ``seeds``, ``diffs`` (per seed, seed order), ``mean``, ``std``, ``ci_low``, ``ci_high``,
        ``confidence``, ``excludes_zero``."""
        return {"n": self.n, "seeds": list(self.seeds), "diffs": list(self.diffs), "mean": self.mean, "std": self.std,
                "ci_low": self.low, "ci_high": self.high, "confidence": self.confidence,
                "excludes_zero": self.excludes_zero}


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def pair_by_seed(method: Mapping[int, float | None],
                 reference: Mapping[int, float | None]) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The seeds (ascending) at which both ``method`` and ``reference`` have a finite value, and ``method[s] −
    reference[s]`` at each. A seed present on one side only, or whose value is ``None`` / nan on either side (a failed
    or unfinished run), is left out: only its own pair is lost."""
    seeds = tuple(sorted(s for s in method if s in reference and _finite(method[s]) and _finite(reference[s])))
    return seeds, tuple(float(method[s]) - float(reference[s]) for s in seeds)  # type: ignore[arg-type]


def t_interval(diffs: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float, float]:
    """``(mean, sample std, low, high)`` of the Student-t interval (n − 1 degrees of freedom) for the mean of
    ``diffs``.

    Raises:
        ValueError: fewer than 2 values, or ``confidence`` not in (0, 1).
    """
    from scipy.stats import t

    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence!r}: must be in (0, 1), e.g. 0.95")
    n = len(diffs)
    if n < 2:
        raise ValueError(f"a t interval needs at least 2 paired values, got {n}")
    mean, std = statistics.fmean(diffs), statistics.stdev(diffs)
    half = float(t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n)
    return mean, std, mean - half, mean + half


def paired_difference(method: Mapping[int, float | None], reference: Mapping[int, float | None],
                      confidence: float = 0.95) -> PairedDifference:
    """:func:`pair_by_seed`, then :func:`t_interval` when at least 2 seeds pair (the mean alone for one, nothing for
    none)."""
    seeds, diffs = pair_by_seed(method, reference)
    if len(diffs) >= 2:
        mean, std, low, high = t_interval(diffs, confidence)
        return PairedDifference(seeds, diffs, confidence, mean, std, low, high)
    return PairedDifference(seeds, diffs, confidence, diffs[0] if diffs else None, None, None, None)
