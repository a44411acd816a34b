"""Parent selectors: which archived systems the next generation starts from.

Protocol (one method)::

    class Selector(Protocol):
        def select(self, pool: list[Scored], k: int, rng: random.Random) -> list[str]: ...

``pool`` holds every accepted system with its validation score; selectors must be
deterministic given ``rng``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Scored:
    system_id: str
    score: float
    generation: int
    children: int = 0


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
