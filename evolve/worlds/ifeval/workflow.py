"""The agent as a workflow graph of generic steps (:mod:`evolve.topology`), the ``ifeval.revise``
step, and the palette the topology search adds to the graph.

:func:`single_step` is the agent's one call (an ``llm`` step: the prompt as the user turn, with no
system message, as IFEval's protocol; give the step ``system: instruction`` to put a prompt
component there) and an ``answer`` step returning ``{reply}``, so the reward scores it as it
scores :func:`~evolve.worlds.ifeval.agent.agent` on a system without prompt components.

``ifeval.revise`` (:class:`Revise`) shows the model its reply and asks it to check it against
every instruction of the request and write it again; with ``measure: true`` the draft's
measurements come first (:func:`evolve.worlds.ifeval.tools.measure`, a recorded tool call: counts
and facts, never a verdict). :func:`draft_measure_revise` is
:func:`~evolve.worlds.ifeval.agent.revise_agent` as a graph. :data:`PALETTE`: ``revise`` inserts the
step after a model call, with or without measurements.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evolve.types import Message
from evolve.worlds.ifeval.agent import MAX_TOKENS, revision


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Revise:
    """``ifeval.revise``: one model call rewriting ``state["reply"]`` (see the module docstring).
    Needs the conversation of an ``llm`` step with ``history: true`` before it."""

    calls_model = True

    class Params(_Params):
        role: str = "policy"
        measure: bool = Field(False, description="show the draft's measurements (a recorded tool call) first")
        max_tokens: int | None = Field(None, ge=1)

    def run(self, p: Revise.Params, state: dict, rt: Any) -> dict:
        messages = list(state.get("messages") or [])
        if not messages or messages[-1].role != "assistant":
            raise ValueError("ifeval.revise needs a conversation: put an llm step with history: true before it")
        reply = str(messages[-1].content)
        measures = None
        if p.measure:
            from evolve.worlds.ifeval.tools import measure

            measures = rt.ctx.tool("measure", measure, reply=reply)
        asked = revision(messages[:-1], reply, measures)
        wf = rt.ctx.system.workflow or {}
        out = rt.llm(p.role).complete(
            asked,
            temperature=rt.temperature(state, None),
            max_tokens=p.max_tokens or int(wf.get("max_tokens", MAX_TOKENS)),
        )
        return {"messages": [*asked, Message(role="assistant", content=out.text)], "reply": out.text}


def _write(max_tokens: int) -> dict[str, Any]:
    return {
        "id": "write",
        "type": "llm",
        "params": {"prompt": "{prompt}", "history": True, "out": "reply", "max_tokens": max_tokens},
    }


_ANSWER = {"id": "answer", "type": "answer", "params": {"fields": ["reply"]}}


def single_step(max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """Ask once, answer (JSON for ``System.workflow["graph"]``)."""
    return {"entry": "write", "nodes": [_write(max_tokens), _ANSWER], "edges": [{"src": "write", "dst": "answer"}]}


def draft_measure_revise(max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """Draft, then rewrite given the draft's measurements, answer."""
    return {
        "entry": "write",
        "nodes": [_write(max_tokens), {"id": "revise", "type": "ifeval.revise", "params": {"measure": True}}, _ANSWER],
        "edges": [{"src": "write", "dst": "revise"}, {"src": "revise", "dst": "answer"}],
    }


#: The palette the topology search uses on this world (see :mod:`evolve.topology.edits`).
PALETTE: list[dict[str, Any]] = [
    {"name": "revise", "type": "ifeval.revise", "kind": "step", "at": ["llm"], "grid": {"measure": [False, True]}},
]

__all__ = ["PALETTE", "Revise", "draft_measure_revise", "single_step"]
