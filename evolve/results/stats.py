"""Is a gain more than noise? A paired comparison of two systems scored on the same tasks, and
the interval of one system's score.

Two systems evaluated on the same held-out tasks differ on only some of them; the rest they both
solve or both fail. Comparing the two means as if they were independent samples overstates the
noise, and ignoring the noise altogether reads a 2-point gain on 300 tasks as a result (its 95%
interval is about ±3.5 points on the SQL world's test split). :func:`paired` gives what a
reader needs: the per-task differences' mean with a 95% interval (normal approximation of the
paired mean, fine for the tens-to-hundreds of tasks a split holds; with scores in [0, 1] it is at
least as wide as with Agresti and Min's pseudo-pairs added (one difference of +1 and one of -1 at
weight 1/2, and a tie), so that 20 wins in 20 tasks read ``[+85.0, +100.0]``, not ``±0.0``; it is cut to the
differences possible, [-1, 1], and then reads ``[low, high]``), how many tasks only
one of the two wins, and the exact two-sided sign test on those (McNemar's exact test when scores
are 0/1). Only tasks both were scored on are paired; none in common gives no interval and no
p-value.

:func:`interval` is one system's score: with scores in [0, 1] the Wilson score interval, which
stays inside [0, 1] and is not empty at 0% or 100% (a normal approximation reads 15 of 15 as
``100.0% ±0.0``); it is asymmetric, so it is given as ``(low, high)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

Z = 1.96  # the two-sided 95% normal quantile


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign-test p-value for ``wins`` against ``losses`` (ties dropped)."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1)) / 2**n
    return min(1.0, 2 * tail)


def _unit(values: Any) -> bool:
    return all(0.0 <= v <= 1.0 for v in values)


def paired(a: Mapping[Any, float], b: Mapping[Any, float]) -> dict[str, Any]:
    """Compare ``b`` against ``a`` on the task ids both scored (``{task_id: score}`` each; give
    only tasks that are the same task in both, see :mod:`evolve.results.pairing`).

    Returns ``n`` (common tasks), ``a``/``b`` (their means there), ``diff`` (b - a), ``ci95``
    (the half-width of its normal 95% interval; ``None`` below 2 tasks), ``low``/``high`` (that
    interval, cut to [-1, 1] when every score is in [0, 1]), ``b_only``/``a_only`` (tasks where
    one scores strictly higher) and ``p`` (the sign test on those; ``None`` with no task in common).
    """
    common = [k for k in a if k in b]
    n = len(common)
    if n == 0:
        return {
            "n": 0,
            "a": None,
            "b": None,
            "diff": None,
            "ci95": None,
            "low": None,
            "high": None,
            "b_only": 0,
            "a_only": 0,
            "p": None,
        }
    xa, xb = [float(a[k]) for k in common], [float(b[k]) for k in common]
    d = [y - x for x, y in zip(xa, xb)]
    mean = sum(d) / n
    ci = low = high = None
    unit = _unit(xa) and _unit(xb)
    if n > 1:
        ci = Z * math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n)
        if unit:  # at least Agresti and Min's width (pseudo-pairs: one each way at weight 1/2, one tie)
            m2 = (sum(x * x for x in d) + 1.0) / (n + 2) - (sum(d) / (n + 2)) ** 2
            ci = max(ci, Z * math.sqrt(max(m2, 0.0) / (n + 2)))
        low, high = mean - ci, mean + ci
        if unit:
            low, high = max(-1.0, low), min(1.0, high)
    b_only = sum(1 for x in d if x > 0)
    a_only = sum(1 for x in d if x < 0)
    return {
        "n": n,
        "a": sum(xa) / n,
        "b": sum(xb) / n,
        "diff": mean,
        "ci95": ci,
        "low": low,
        "high": high,
        "b_only": b_only,
        "a_only": a_only,
        "p": sign_test(b_only, a_only),
    }


def bounds(c: Mapping[str, Any]) -> tuple[float, float] | None:
    """The 95% interval ``(low, high)`` of a :func:`paired` comparison; one written before
    ``low``/``high`` existed (an older ``report.json``) is cut to [-1, 1] when both means are in
    [0, 1]."""
    if c.get("low") is not None and c.get("high") is not None:
        return float(c["low"]), float(c["high"])
    ci, diff = c.get("ci95"), c.get("diff")
    if ci is None or diff is None:
        return None
    low, high = diff - ci, diff + ci
    if c.get("a") is not None and c.get("b") is not None and _unit((c["a"], c["b"])):
        low, high = max(-1.0, low), min(1.0, high)
    return low, high


def with_bounds(c: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``c`` with ``low``/``high`` filled in (:func:`bounds`), for comparisons read from older files."""
    if c is None:
        return None
    out = dict(c)
    if c.get("n"):
        out["low"], out["high"] = bounds(c) or (None, None)
    return out


def interval_text(c: Mapping[str, Any]) -> str:
    """``95% CI ±3.5`` when the interval is symmetric, ``95% CI [+50.0, +100.0]`` (points) when it
    was cut at a bound; empty without one."""
    lh = bounds(c)
    if lh is None:
        return ""
    low, high, ci, diff = *lh, c.get("ci95"), c.get("diff")
    if (
        ci is not None
        and diff is not None
        and math.isclose(low, diff - ci, abs_tol=1e-12)
        and math.isclose(high, diff + ci, abs_tol=1e-12)
    ):
        return f"95% CI ±{100 * ci:.1f}"
    return f"95% CI [{100 * low:+.1f}, {100 * high:+.1f}]"


def describe(c: Mapping[str, Any]) -> str:
    """One line for a report: ``+6.3 points (95% CI ±3.5; 24 tasks better with the best system, 5 with
    the baseline; sign test p=0.001, n=300)``; ``no task in common`` when nothing pairs."""
    if not c.get("n"):
        return "no task in common"
    ci = interval_text(c)
    return (
        f"{100 * c['diff']:+.1f} points ({ci + '; ' if ci else ''}{c['b_only']} tasks better with the best "
        f"system, {c['a_only']} with the baseline; sign test p={c['p']:.3g}, n={c['n']})"
    )


def wilson(mean: float, n: int, z: float = Z) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``mean`` of ``n``; for a mean of scores between 0 and 1
    it is conservative (their variance is at most mean(1 - mean), what it assumes)."""
    p = min(1.0, max(0.0, float(mean)))
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def interval(mean: float, mean_sq: float, n: int, *, unit: bool = True) -> tuple[float, float] | None:
    """The 95% interval ``(low, high)`` of a mean of ``n`` scores, from their mean and the mean of
    their squares: the Wilson interval when every score is in [0, 1] (``unit``), else the normal
    approximation (``None`` below 2 scores); ``None`` with no score."""
    if n < 1:
        return None
    if unit:
        return wilson(mean, n)
    if n < 2:
        return None
    half = Z * math.sqrt(max(0.0, mean_sq - mean * mean) * n / (n - 1) / n)
    return mean - half, mean + half


__all__ = ["bounds", "describe", "interval", "interval_text", "paired", "sign_test", "wilson", "with_bounds"]
