"""The evolution loop's strategies, each a small protocol whose default is the engine's behaviour.

**Acceptance** — whether a proposed child joins the pool of accepted systems, and whether it is
promoted (made current)::

    class Acceptance(Protocol):
        def judge(self, session, generation, candidate, minibatch, parent, parent_minibatch_score,
                  parent_val_score) -> Verdict: ...
        def promote(self, session, generation, candidate, verdict, best: Scored) -> tuple[bool, Scored]: ...

``two_stage`` (default): better than its parent on the generation's training minibatch by more
than ``engine.min_gain``, then not worse on validation by more than ``engine.val_tolerance``
(:mod:`evolve.loop.acceptance`, with ``engine.reeval`` for noisy graders); promoted when it beats the best.
``val_only``: stage 2 alone (a child is never rolled out on the minibatch). ``paired``: stage 1,
then stage 2 and the promotion on the paired val comparison with its interval, not on a higher mean
(``engine.acceptance_params: {z: 1.96}``; :mod:`evolve.loop.acceptance`).

**Minibatch sampler** — the training tasks a generation's parents and children are compared on::

    class MinibatchSampler(Protocol):
        def sample(self, train: list[dict], n: int, rng: random.Random, generation: int) -> list[dict]: ...

``random`` (default): ``n`` tasks drawn anew each generation; ``fixed``: the same ``n`` every generation.

**Stopping** — checked after every generation, beside the budgets::

    class Stopping(Protocol):
        def stop(self, generations: list[GenerationRow]) -> str | None: ...   # a reason, or go on

``budget`` (default): only the budgets stop the run; ``plateau``: stop when the best validation
score has not risen for ``patience`` generations (``engine.stopping_params: {patience: 2}``).

Each is named in the task file (``engine.acceptance``, ``engine.minibatch_sampler``,
``engine.stopping``), registered in :mod:`evolve.registry` (or an import path), and built once per
run with no arguments (``stopping`` with ``engine.stopping_params``, ``acceptance`` with
``engine.acceptance_params``). All must be deterministic
given their inputs, so a resumed run decides the same.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from evolve.loop.acceptance import Verdict, judge, paired_judge, paired_promotion, promotion

if TYPE_CHECKING:
    from evolve.loop.selectors import Scored
    from evolve.scoring.session import Session
    from evolve.scoring.state import GenerationRow
    from evolve.types import Candidate, System


class Acceptance(Protocol):
    def judge(
        self,
        session: Session,
        generation: int,
        candidate: Candidate,
        minibatch: list[dict],
        parent: System,
        parent_minibatch_score: float,
        parent_val_score: float,
    ) -> Verdict: ...

    def promote(
        self, session: Session, generation: int, candidate: Candidate, verdict: Verdict, best: Scored
    ) -> tuple[bool, Scored]: ...


class TwoStage:
    """Better than the parent on the minibatch, then not worse on validation (see :mod:`evolve.loop.acceptance`)."""

    def judge(
        self,
        session: Session,
        generation: int,
        candidate: Candidate,
        minibatch: list[dict],
        parent: System,
        parent_minibatch_score: float,
        parent_val_score: float,
    ) -> Verdict:
        return judge(session, generation, candidate, minibatch, parent, parent_minibatch_score, parent_val_score)

    def promote(
        self, session: Session, generation: int, candidate: Candidate, verdict: Verdict, best: Scored
    ) -> tuple[bool, Scored]:
        return promotion(session, generation, candidate, verdict, best)


class ValOnly(TwoStage):
    """Stage 2 alone: the child is judged on validation against its parent (within
    ``engine.val_tolerance``, re-evaluated when close), never on the minibatch."""

    def judge(
        self,
        session: Session,
        generation: int,
        candidate: Candidate,
        minibatch: list[dict],
        parent: System,
        parent_minibatch_score: float,
        parent_val_score: float,
    ) -> Verdict:
        return judge(session, generation, candidate, None, parent, parent_minibatch_score, parent_val_score)


class Paired(TwoStage):
    """Stage 1 on the minibatch, then stage 2 and the promotion decided on the paired val
    comparison and its interval at ``z`` (1.96: 95%): a child is rejected only when it is worse
    than its parent beyond the interval, and kept as the best only when its interval against the
    best is above zero (see :mod:`evolve.loop.acceptance`)."""

    def __init__(self, z: float = 1.96) -> None:
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not z > 0:
            raise ValueError(f"z must be a positive number (1.96 for a 95% interval), not {z!r}")
        self.z = float(z)

    def judge(
        self,
        session: Session,
        generation: int,
        candidate: Candidate,
        minibatch: list[dict],
        parent: System,
        parent_minibatch_score: float,
        parent_val_score: float,
    ) -> Verdict:
        return paired_judge(session, generation, candidate, minibatch, parent, parent_minibatch_score, self.z)

    def promote(
        self, session: Session, generation: int, candidate: Candidate, verdict: Verdict, best: Scored
    ) -> tuple[bool, Scored]:
        return paired_promotion(session, generation, candidate, verdict, best, self.z)


class MinibatchSampler(Protocol):
    def sample(self, train: list[dict], n: int, rng: random.Random, generation: int) -> list[dict]: ...


class RandomMinibatch:
    """``n`` training tasks drawn anew every generation (from the generation's own seeded rng)."""

    def sample(self, train: list[dict], n: int, rng: random.Random, generation: int) -> list[dict]:
        return rng.sample(train, min(n, len(train)))


class FixedMinibatch:
    """The same ``n`` training tasks every generation (those generation 1 draws), so scores on the
    minibatch compare across generations."""

    def sample(self, train: list[dict], n: int, rng: random.Random, generation: int) -> list[dict]:
        return random.Random("fixed-minibatch").sample(train, min(n, len(train)))


class Stopping(Protocol):
    def stop(self, generations: Sequence[GenerationRow]) -> str | None: ...


class BudgetOnly:
    """Never stops early: the budgets (generations, rollouts, calls, tokens, money, time) stop the run."""

    def stop(self, generations: Sequence[GenerationRow]) -> str | None:
        return None


class Plateau:
    """Stop when the best validation score has not risen for ``patience`` generations."""

    def __init__(self, patience: int = 2) -> None:
        if int(patience) < 1:
            raise ValueError(f"patience must be at least 1 generation; got {patience}")
        self.patience = int(patience)

    def stop(self, generations: Sequence[GenerationRow]) -> str | None:
        if len(generations) <= self.patience:
            return None
        before = max(g.best_val for g in generations[: -self.patience])
        if max(g.best_val for g in generations[-self.patience :]) <= before:
            return f"plateau: the best val score has not risen for {self.patience} generations ({before:.3f})"
        return None


def build_strategies(engine_cfg: Any) -> tuple[Acceptance, MinibatchSampler, Stopping]:
    """The acceptance, sampler and stopping rule an ``engine`` section names (built once per run)."""
    from evolve.registry import acceptances, minibatch_samplers, stoppings

    return (
        acceptances.get(engine_cfg.acceptance)(**engine_cfg.acceptance_params),
        minibatch_samplers.get(engine_cfg.minibatch_sampler)(),
        stoppings.get(engine_cfg.stopping)(**engine_cfg.stopping_params),
    )


__all__ = [
    "Acceptance",
    "BudgetOnly",
    "FixedMinibatch",
    "MinibatchSampler",
    "Paired",
    "Plateau",
    "RandomMinibatch",
    "Stopping",
    "TwoStage",
    "ValOnly",
    "build_strategies",
]
