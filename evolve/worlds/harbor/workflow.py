"""The harbor agent as workflow-graph steps (:mod:`evolve.topology`), and the palette the topology
search uses on it.

Three node types, registered as ``harbor.act``, ``harbor.think`` and ``harbor.review``; they run
inside the harbor agent (``agent: evolve.worlds.harbor:agent``), which opens the task's
environment, runs the system's graph, then the task's tests:

* ``harbor.act`` — one turn: the model's reply, and the command it asked for run in the
  environment (a shortcut expanded); sets ``done`` when the model said DONE, gave no command or
  ran out of time. This is the hand-written agent's turn (:class:`.agent.Episode`).
* ``harbor.think`` — one model call without a command: what the last output showed and what the
  next command should do; the answer stays in the conversation.
* ``harbor.review`` — no model call: before the episode ends, asks the model to check the task's
  requirements with a command, and clears ``done``, so the next ``harbor.act`` runs the check (or
  the model says DONE again).

:func:`shell_loop` is the hand-written agent as a graph (the search's starting point): ``act``
again while not ``done``, at most ``max_turns`` times. :data:`PALETTE` lets the search add a
think step between turns and a review loop at the end (once or twice).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evolve.types import Message

THINK_PROMPT = (
    "Before your next command: in two sentences, what did the last output show, and what should the "
    "next command do? Do not write a command yet."
)
REVIEW_PROMPT = (
    "Before you finish: check that every requirement of the task is met (the exact paths, the file "
    "contents, the format). Reply with one command that checks, or DONE if you are sure."
)


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _episode() -> Any:
    from evolve.worlds.harbor.agent import Episode

    return Episode.current()


class Act:
    """``harbor.act``: one reply of the model and the command it asked for."""

    calls_model = True

    class Params(_Params):
        pass

    def run(self, p: Act.Params, state: dict, rt: Any) -> dict:
        messages = list(state.get("messages") or [])
        over = _episode().turn(messages)
        return {"messages": messages, "done": over, "turns": int(state.get("turns", 0)) + 1}


class Think:
    """``harbor.think``: one model call about the last output, no command."""

    calls_model = True

    class Params(_Params):
        prompt: str = THINK_PROMPT
        max_tokens: int | None = Field(None, ge=1, description="default: workflow.max_tokens")

    def run(self, p: Think.Params, state: dict, rt: Any) -> dict:
        ep = _episode()
        messages = [*list(state.get("messages") or []), Message(role="user", content=p.prompt)]
        if ep.left() <= 0:
            return {"messages": messages[:-1], "done": True}
        thought = ep.reply(messages, p.max_tokens)
        messages += [
            Message(role="assistant", content=thought),
            Message(role="user", content="Now reply with your next command."),
        ]
        return {"messages": messages}


class Review:
    """``harbor.review``: ask for a check before the episode ends (no model call)."""

    calls_model = False

    class Params(_Params):
        prompt: str = REVIEW_PROMPT

    def run(self, p: Review.Params, state: dict, rt: Any) -> dict:
        if _episode().left() <= 0:
            return {}
        return {
            "messages": [*list(state.get("messages") or []), Message(role="user", content=p.prompt)],
            "done": False,
            "reviews": int(state.get("reviews", 0)) + 1,
        }


def shell_loop(max_turns: int = 10) -> dict:
    """The hand-written agent as a graph: ``act`` again while not ``done``, ``max_turns`` at most
    (JSON for ``System.workflow["graph"]``)."""
    return {
        "entry": "act",
        "nodes": [{"id": "act", "type": "harbor.act", "max_visits": int(max_turns)}],
        "edges": [{"src": "act", "dst": "act", "when": "not done"}],
    }


#: The palette the topology search uses on the harbor world (see :mod:`evolve.topology.edits`).
PALETTE: list[dict[str, Any]] = [
    {"name": "think", "type": "harbor.think", "kind": "step", "at": ["harbor.act"], "max_count": 1},
    {
        "name": "review",
        "type": "harbor.review",
        "kind": "loop",
        "at": ["harbor.act"],
        "when": ["done"],
        "max_visits": [1, 2],
    },
]

__all__ = ["PALETTE", "REVIEW_PROMPT", "THINK_PROMPT", "Act", "Review", "Think", "shell_loop"]
