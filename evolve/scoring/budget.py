"""Budgets while a run spends them: how many of the rollouts about to start may start.

A run stops cleanly on the first budget spent (generations, rollouts, LLM calls, tokens,
money, wall time) with a :class:`~evolve.errors.BudgetExhausted` that says which. Budgets
are checked before every batch of rollouts:

* ``rollouts`` are exact: only as many rollouts as still fit may start. A batch cut short
  stops the run once its allowed part has finished.
* ``calls`` (LLM calls in rollouts plus operators' own calls, which are checked before each
  one) are exact when the number of calls per rollout is known: a rollout is assumed to make
  ``budget.calls_per_rollout`` calls when set, else the most of its workflow graph's bound
  (:func:`evolve.topology.runtime.calls_upper_bound`) and of what any stored rollout of the
  run made. An agent without a graph that makes more calls than any rollout before it can
  pass the limit by that surprise, in that one batch; set ``calls_per_rollout`` to rule it out.
* ``tokens``, ``usd`` and ``seconds`` are known only after a rollout ends: a batch that
  starts under the limit runs whole, and the run stops before the next batch.

The final scoring of the baseline and the promoted system on test is outside the budget.
The dry-run estimate of a whole run is :mod:`evolve.scoring.estimate`.
"""

from __future__ import annotations

import math
from typing import Any

from evolve.errors import BudgetExhausted
from evolve.task.config import BudgetConfig


def calls_bound(workflow: dict[str, Any]) -> int | None:
    """The most LLM calls a rollout of a system with this ``workflow`` can make, as the layers that
    run workflows say (:data:`evolve.registry.call_bounds`), or None when none can tell."""
    from evolve.registry import call_bounds

    bounds = [b for b in (call_bounds.get(name)(workflow) for name in call_bounds.names()) if b is not None]
    return max(bounds) if bounds else None


def spent(budget: BudgetConfig, kind: str, used: dict[str, Any]) -> str:
    """The stop reason for a spent budget of ``kind`` (``rollouts``, ``calls``, ...)."""
    if kind == "rollouts":
        return f"rollout budget of {budget.rollouts} spent"
    if kind == "calls":
        return f"call budget of {budget.calls} LLM calls spent ({used.get('calls', 0)} used)"
    if kind == "tokens":
        return f"token budget of {budget.tokens} spent ({used.get('tokens', 0)} used)"
    if kind == "usd":
        return f"money budget of ${budget.usd:g} spent (${used.get('cost', 0.0):.4f} used)"
    return f"wall-time budget of {budget.seconds:g}s spent"


def allowed_rollouts(
    budget: BudgetConfig, used: dict[str, Any], elapsed: float, pending: int, calls_per_rollout: float = 1.0
) -> tuple[int, str | None]:
    """How many of ``pending`` rollouts may start, and the budget that cuts them (None when
    all may start). Raises :class:`BudgetExhausted` when a budget is already spent."""
    if budget.seconds is not None and elapsed >= budget.seconds:
        raise BudgetExhausted(spent(budget, "seconds", used))
    if budget.tokens is not None and used["tokens"] >= budget.tokens:
        raise BudgetExhausted(spent(budget, "tokens", used))
    if budget.usd is not None and used["cost"] >= budget.usd:
        raise BudgetExhausted(spent(budget, "usd", used))
    allowed, by = pending, None
    if budget.rollouts is not None:
        left = budget.rollouts - used["rollouts"]
        if left <= 0:
            raise BudgetExhausted(spent(budget, "rollouts", used))
        if left < allowed:
            allowed, by = left, "rollouts"
    if budget.calls is not None:
        left = budget.calls - used.get("calls", 0)
        fit = math.floor(left / max(calls_per_rollout, 1e-9) + 1e-9) if left > 0 else 0
        if fit <= 0:
            more = f"; a rollout makes up to {calls_per_rollout:g}" if left > 0 else ""
            raise BudgetExhausted(spent(budget, "calls", used) + more)
        if fit < allowed:
            allowed, by = fit, "calls"
    return allowed, by
