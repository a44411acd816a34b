"""GEPA's per-task Pareto front over candidate systems, and sampling a parent from it.

GEPA (Agrawal et al., 2025, "GEPA: Reflective Prompt Evolution Can Outperform Reinforcement
Learning", arXiv:2507.19457, §3.3) keeps every candidate that is the best on at least one
task instead of only the best on average, so that a prompt which solves a niche of tasks
survives; dominated candidates are dropped, and parents are sampled with a probability
proportional to the number of tasks they are best on.

Here, with ``per_task = {system_id: {task_id: score}}`` (higher is better) and optional
``objectives = {system_id: {metric: value}}`` (lower is better: cost, latency, ...):

* every task and every extra metric is one dimension; a missing score counts as the worst
  (−∞ for a task, +∞ for a metric);
* a system is *best* on a dimension when no system does better there (ties all count);
* a system *dominates* another when it is at least as good on every dimension and strictly
  better on one;
* the front is the systems best on at least one dimension that no system dominates, in the
  order they first appear in ``per_task`` (then ``objectives``). Systems with identical score
  vectors do not dominate each other: both stay.

These are pure functions: the engine's selector calls them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

PerTask = Mapping[str, Mapping[str, float]]


def _systems(per_task: PerTask, objectives: PerTask | None) -> list[str]:
    out = list(per_task)
    out += [s for s in (objectives or {}) if s not in per_task]
    return out


def _vectors(per_task: PerTask, objectives: PerTask | None) -> tuple[list[str], dict[str, list[float]]]:
    """Each system's values on every dimension, all to be maximised (metrics negated)."""
    systems = _systems(per_task, objectives)
    tasks = sorted({t for s in per_task.values() for t in s})
    metrics = sorted({m for s in (objectives or {}).values() for m in s})
    vectors = {}
    for s in systems:
        scores = per_task.get(s, {})
        costs = (objectives or {}).get(s, {})
        vectors[s] = [float(scores.get(t, -math.inf)) for t in tasks] + [
            -float(costs.get(m, math.inf)) for m in metrics
        ]
    return systems, vectors


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """``a`` is at least as good as ``b`` everywhere and strictly better somewhere (maximising)."""
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))


def best_counts(per_task: PerTask) -> dict[str, int]:
    """How many tasks each system is best on (ties count for every tied system)."""
    systems, vectors = _vectors(per_task, None)
    counts = dict.fromkeys(systems, 0)
    if not systems:
        return counts
    for d in range(len(next(iter(vectors.values())))):
        top = max(v[d] for v in vectors.values())
        if top == -math.inf:
            continue
        for s in systems:
            if vectors[s][d] == top:
                counts[s] += 1
    return counts


def pareto_front(per_task: PerTask, objectives: PerTask | None = None) -> list[str]:
    """The ids of the systems on GEPA's per-task Pareto front (see the module docstring)."""
    systems, vectors = _vectors(per_task, objectives)
    if not systems:
        return []
    n = len(next(iter(vectors.values())))
    best_somewhere = set()
    for d in range(n):
        top = max(v[d] for v in vectors.values())
        if top == -math.inf:
            continue
        best_somewhere |= {s for s in systems if vectors[s][d] == top}
    return [
        s
        for s in systems
        if s in best_somewhere and not any(dominates(vectors[o], vectors[s]) for o in systems if o != s)
    ]


def sample_from_front(front: Sequence[str], per_task: PerTask, rng: random.Random) -> str:
    """One system of ``front``, drawn with weight = the number of tasks it is best on (a front
    member best on no task — kept for an extra objective — weighs 1). One ``rng.random()`` draw."""
    if not front:
        raise ValueError("the Pareto front is empty: there is no system to sample")
    counts = best_counts(per_task)
    weights = [max(counts.get(s, 0), 1) for s in front]
    x = rng.random() * sum(weights)
    for s, w in zip(front, weights):
        if x < w:
            return s
        x -= w
    return front[-1]  # float rounding at the very top


__all__ = ["best_counts", "dominates", "pareto_front", "sample_from_front"]
