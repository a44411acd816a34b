"""Operators propose better systems: f(Π, τ, r) → Π′.

Protocol (one method)::

    class Operator(Protocol):
        name: str
        def propose(self, parent: System, ctx: OperatorContext) -> list[Candidate]: ...

Optional, for ``evolve run --dry-run`` (:mod:`evolve.scoring.estimate`)::

    def estimate(self, plan: RunPlan) -> dict:  # {"rollouts": int, "llm_calls": int, "children": int}

what one ``propose`` call costs at most: rollouts through ``ctx.rollouts``, LLM calls made
outside rollouts, children proposed.

Lifecycle: the engine builds each configured operator once per run from its task-file entry
(``cls(**params)``, validated through the class's optional pydantic ``Params`` model), then in
every generation calls ``propose`` once per selected parent. ``ctx`` gives the parent's
minibatch trajectories (with rewards and feedback), a way to run more rollouts (memoised in
the archive, counted against the budget), the artifact store, a seeded RNG, and in
``ctx.extra["pool"]`` the accepted systems (``{"system", "score", "per_task", "metrics"}``
dicts, loaded on first access; e.g. a crossover operator's mates), and in ``ctx.extra["known"]``
a test ``known(system_id) -> bool`` of whether the archive holds a system already (a child it
holds has been judged; the engine drops it, so an operator can propose another instead). Operators
must be deterministic given ``ctx.rng`` / ``ctx.seed`` so a seeded run has a fixed lineage.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from evolve.artifacts import ArtifactStore
from evolve.types import Candidate, System, Trajectory


class Operator(Protocol):
    name: str

    def propose(self, parent: System, ctx: OperatorContext) -> list[Candidate]: ...


@dataclass
class OperatorContext:
    generation: int
    seed: int
    rng: random.Random
    train: Sequence[dict]  # the training tasks (never validation or test): all, or the curriculum's of this generation
    trajectories: Sequence[Trajectory]  # the parent's scored rollouts on this generation's minibatch
    artifacts: ArtifactStore
    workdir: Path  # scratch space for this operator call (inside the run directory)
    # rollouts(system, tasks, samples=1, temperature=None, tag="explore", logprobs=True, max_tokens=None)
    # -> list[Trajectory],
    # memoised; logprobs=False when the operator reads none (a backend that pays extra for them skips them)
    rollouts: Callable[..., list[Trajectory]]
    log: Callable[[str], None] = print
    # charge(completion): an operator that calls a model itself (to mutate or reflect) reports each
    # call here, so that it counts against the run's call, token and money budgets
    charge: Callable[[Any], None] = lambda completion: None
    # may_call(): call before each such model call; raises BudgetExhausted when the budget has no room
    may_call: Callable[[], None] = lambda: None
    extra: dict[str, Any] = field(default_factory=dict)


def capped(tag: str, max_tokens: int | None) -> dict[str, Any]:
    """``ctx.rollouts`` keywords for samples capped at ``max_tokens`` new tokens a call (None: the
    workflow's own cap): the cap, and a tag of their own (``star@512``) so that samples drawn under
    another cap are never reused from the archive."""
    return {"tag": tag} if max_tokens is None else {"tag": f"{tag}@{max_tokens}", "max_tokens": max_tokens}


class ChargedLLM:
    """A model an operator calls itself, bound to ``ctx``: each call first asks ``ctx.may_call()``
    (a spent budget raises :class:`~evolve.errors.BudgetExhausted` before anything is sent), then
    reports the completion to ``ctx.charge``, so it counts against the run's call, token and money
    budgets like a rollout's calls."""

    def __init__(self, llm: Any, ctx: OperatorContext) -> None:
        self.llm, self._ctx = llm, ctx
        self.name = getattr(llm, "name", "operator-llm")

    def complete(self, messages: Any, **kwargs: Any) -> Any:
        may_call, charge = getattr(self._ctx, "may_call", None), getattr(self._ctx, "charge", None)
        if may_call is not None:  # a duck-typed context without budgets is allowed
            may_call()
        out = self.llm.complete(messages, **kwargs)
        if charge is not None:
            charge(out)
        return out


class ScriptedEdit:
    """A deterministic prompt-edit operator for plumbing tests and golden runs.

    Each proposal sets ``prompts[component]`` to the next unused string from ``choices``
    (picked by ``ctx.rng``). It does not read trajectories; it exists so the engine, archive
    and resume logic can be tested end to end with the scripted LM.
    """

    name = "scripted"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        component: str = "instruction"
        choices: list[str]
        children: int = 1

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)

    def estimate(self, plan: Any) -> dict[str, int]:
        return {"rollouts": 0, "llm_calls": 0, "children": min(self.p.children, len(set(self.p.choices)))}

    def propose(self, parent: System, ctx: OperatorContext) -> list[Candidate]:
        current = parent.prompts.get(self.p.component)
        pool = [c for c in self.p.choices if c != current]
        ctx.rng.shuffle(pool)
        out = []
        for text in pool[: self.p.children]:
            prompts = {**parent.prompts, self.p.component: text}
            out.append(
                Candidate(
                    system=parent.replace(prompts=prompts),
                    parents=(parent.id,),
                    operator=self.name,
                    rationale=f"set {self.p.component} to {text!r}",
                )
            )
        return out
