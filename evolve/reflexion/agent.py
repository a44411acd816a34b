"""Reflexion as an agent the engine can run: every attempt inside one rollout."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from evolve.rollout import RolloutContext

from .core import Reflexion

_NOT_HERE = ("llm_provider", "artifacts", "timeout", "seed")  # the rollout decides these


def _placeholder(*_: Any) -> None:
    return None


def reflexion_agent(
    agent: Callable | str,
    reward_or_evaluator: Callable | str,
    *,
    name: str | None = None,
    attempts_key: str | None = "reflexion_attempts",
    **options: Any,
) -> Callable[[dict, Any], Any]:
    """An ``agent(task, ctx)`` that runs Reflexion around ``agent`` inside one rollout and returns
    the final output (the successful attempt's, else the best-scoring one's, latest on ties).

    All attempts' LLM calls, the reflection calls and a ``reflexion`` tool step per lesson land in
    the rollout's trajectory. ``agent`` and ``reward_or_evaluator`` are callables or import paths
    (imported on the first call). ``options`` are :class:`Reflexion`'s (``max_attempts``,
    ``reflect``, ``memory``, ...); when the system's workflow has ``attempts_key`` (default
    ``"reflexion_attempts"``), it sets the number of attempts. Inside the engine the engine
    scores the final output again with the task's reward.
    """
    bad = sorted(set(_NOT_HERE) & set(options))
    if bad:
        raise TypeError(f"reflexion_agent: {bad} are set by the rollout, not here")
    Reflexion(_placeholder, evaluator=_placeholder, **options)  # check the options now
    state: dict[str, Reflexion] = {}
    lock = threading.Lock()

    def reflexion(task: dict, ctx: RolloutContext) -> Any:
        rx = state.get("rx")
        if rx is None:
            with lock:
                rx = state.get("rx") or Reflexion(agent, evaluator=reward_or_evaluator, **options)
                state["rx"] = rx
        workflow = getattr(ctx.system, "workflow", None) or {}
        n = int(workflow[attempts_key]) if attempts_key and workflow.get(attempts_key) is not None else None
        return rx.run_in(task, ctx, max_attempts=n).output

    base = name or "reflexion_" + (
        agent.rsplit(":", 1)[-1].rsplit(".", 1)[-1] if isinstance(agent, str) else getattr(agent, "__name__", "agent")
    )
    reflexion.__name__ = reflexion.__qualname__ = base
    reflexion.__doc__ = f"Reflexion around {agent if isinstance(agent, str) else getattr(agent, '__name__', agent)}."
    reflexion.options = dict(options)  # type: ignore[attr-defined]
    return reflexion


__all__ = ["reflexion_agent"]
