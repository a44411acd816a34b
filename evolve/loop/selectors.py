"""Parent selectors: which archived systems the next generation starts from.

Protocol (one method)::

    class Selector(Protocol):
        def select(self, pool: list[Scored], k: int, rng: random.Random) -> list[str]: ...

``pool`` holds every accepted system with its validation score; selectors must be
deterministic given ``rng``. A selector class is built once per run as
``cls(**engine.selector_params)`` (validated at load through its optional pydantic ``Params``
model, else its constructor's signature). A selector that sets the class attribute
``needs_per_task = True`` gets each system's validation score per task (``Scored.per_task``)
and its mean cost, LLM calls and latency per validation rollout (``Scored.metrics``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict


@dataclass(frozen=True)
class Scored:
    system_id: str
    score: float
    generation: int
    children: int = 0
    per_task: dict[str, float] | None = field(default=None, hash=False)  # val task id -> score
    metrics: dict[str, float] = field(default_factory=dict, hash=False)  # cost, calls, latency per val rollout


class Selector(Protocol):
    def select(self, pool: list[Scored], k: int, rng: random.Random) -> list[str]: ...


class Best:
    """The k best by validation score (ties: the older system first)."""

    def select(self, pool: list[Scored], k: int, rng: random.Random) -> list[str]:
        ranked = sorted(pool, key=lambda s: (-s.score, s.generation))
        return [s.system_id for s in ranked[:k]]


class Tournament:
    """k tournaments of ``size`` random entrants; the best entrant of each wins.
    Children already made lower an entrant's chance (the DGM's 1/(1+children) novelty bonus)."""

    def __init__(self, size: int = 3) -> None:
        self.size = size

    def select(self, pool: list[Scored], k: int, rng: random.Random) -> list[str]:
        out: list[str] = []
        for _ in range(k):
            entrants = rng.sample(pool, min(self.size, len(pool)))
            best = max(entrants, key=lambda s: (s.score / (1 + 0.1 * s.children), -s.generation))
            out.append(best.system_id)
        return out


# ----------------------------------------------------------------------------- per-task Pareto (GEPA)


class Pareto:
    """GEPA's selection: parents are sampled from the per-task Pareto front of the pool
    (:func:`evolve.loop.pareto.pareto_front`), each with probability proportional to the
    number of validation tasks it is best on, so a system that solves tasks no other one
    solves stays in play even when its mean is lower; ``k`` parents are drawn without
    replacement. ``objectives`` add minimised metrics per validation rollout (``cost`` in
    money, ``calls``, ``latency`` in seconds) as further dimensions of the front, so the
    cheapest or fastest system stays on it (weighing 1 when it is best on no task)."""

    needs_per_task = True

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        objectives: list[Literal["cost", "calls", "latency"]] = []

    def __init__(self, objectives: Sequence[str] = ()) -> None:
        self.p = self.Params.model_validate({"objectives": list(objectives)})

    def _views(self, pool: Sequence[Scored]) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
        per_task = {s.system_id: dict(s.per_task) for s in pool if s.per_task}
        if not per_task:  # no per-task scores at all: the mean is the only task
            per_task = {s.system_id: {"mean": s.score} for s in pool}
        objectives: dict[str, dict[str, float]] = {
            s.system_id: {o: s.metrics[o] for o in self.p.objectives if o in s.metrics}
            for s in pool
            if s.system_id in per_task
        }
        return per_task, objectives

    def front(self, pool: Sequence[Scored]) -> list[str]:
        from evolve.loop.pareto import pareto_front

        per_task, objectives = self._views(pool)
        return pareto_front(per_task, objectives if self.p.objectives else None)

    def select(self, pool: list[Scored], k: int, rng: random.Random) -> list[str]:
        from evolve.loop.pareto import sample_from_front

        per_task, _ = self._views(pool)
        front = self.front(pool)
        out: list[str] = []
        while front and len(out) < k:
            pick = sample_from_front(front, per_task, rng)
            out.append(pick)
            front = [s for s in front if s != pick]
        return out
