"""The SQL agent as workflow-graph steps (:mod:`evolve.topology`): write, execute, rewrite.

Three node types, registered as ``sql.write``, ``sql.execute`` and ``sql.rewrite``:

* ``sql.write`` — one model call: the task's opening messages (system instruction, few-shot
  demos, recalled experiences, schema and question laid out by the ``template`` component,
  exactly as :func:`evolve.worlds.sql.agent.messages_for` writes them for the agent, with the tool
  lines of ``workflow.tool_docs`` and the stop strings of ``workflow.stop`` as the agent has them) → ``sql``;
  the conversation goes to ``state["messages"]``.
* ``sql.execute`` — no model call: runs ``sql`` on the task's database (read-only, or as a
  sandboxed call of one of the system's query tools) → ``rows``, ``error`` (the message the
  model would see, or None) and ``empty`` (no rows, or an error).
* ``sql.rewrite`` — one model call: the conversation so far plus a tool turn with the error
  (``error: no rows returned`` when the result was only empty) → a new ``sql``. This is the
  repair turn of the cold-start demos.

Graphs built from them: :func:`single_step` (write and answer: one model call, the search's
starting point), :func:`repair_loop` (the hand-written agent of :func:`agent`: write, execute,
rewrite on error up to ``max_turns - 1`` times), :func:`vote` (self-consistency: ``n`` sampled
write→execute chains, majority over the result rows). An ``answer`` node returns
``{"sql", "rows", "turns"}`` as the hand-written agent does, so :func:`reward` scores both alike.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evolve.types import Message
from evolve.worlds.sql.agent import act
from evolve.worlds.sql.db import SQLError, clean_sql, error_text
from evolve.worlds.sql.fewshot import demos_of
from evolve.worlds.sql.memory import recall
from evolve.worlds.sql.prompt import messages_for, stop_strings, with_tool_docs
from evolve.worlds.sql.tools import toolbox


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _max_tokens(rt: Any, given: int | None) -> int:
    if given is not None:
        return given
    return int((rt.ctx.system.workflow or {}).get("max_tokens", 160))


class Write:
    """``sql.write``: schema and question in, SQL out (one model call)."""

    calls_model = True

    class Params(_Params):
        role: str = "policy"
        max_tokens: int | None = Field(None, ge=1, description="default: workflow.max_tokens, else 160")
        instruction: str = Field("instruction", description="the prompt component used as the system message")

    def run(self, p: Write.Params, state: dict, rt: Any) -> dict:
        task, system = state["task"], rt.ctx.system
        instruction = (system.prompts or {}).get(p.instruction, "") or ""
        spec = system.memory or {}
        examples = (
            rt.ctx.tool("recall_memory", lambda query: recall(spec, task), query=task["question"])
            if spec.get("store")
            else []
        )
        from evolve.prompts.components import get_template

        # the system's demos and template component lay the prompt out as the agent's would
        messages = messages_for(
            task,
            instruction,
            examples,
            spec.get("render", "full"),
            demos_of(system),
            str((system.workflow or {}).get("demo_style", "masked")),
            get_template(system.prompts or {}),
        )
        messages = with_tool_docs(messages, toolbox(system), system.workflow or {})
        out = rt.llm(p.role).complete(
            messages,
            temperature=rt.temperature(state, None),
            max_tokens=_max_tokens(rt, p.max_tokens),
            stop=stop_strings(system.workflow or {}),
        )
        said = clean_sql(getattr(out, "text", ""))
        return {
            "messages": [*messages, Message(role="assistant", content=said)],
            "said": said,
            "sql": said,
            "turns": int(state.get("turns", 0)) + 1,
        }


class Execute:
    """``sql.execute``: run the latest SQL (or tool call) on the task's database; no model call."""

    calls_model = False

    class Params(_Params):
        empty_is_error: bool = Field(False, description="also set error when the query returns no rows")

    def run(self, p: Execute.Params, state: dict, rt: Any) -> dict:
        said = state.get("said", state.get("sql", ""))
        try:
            sql, rows = act(rt.ctx, toolbox(rt.ctx.system), said, state["task"]["db"])
        except Exception as e:  # noqa: BLE001 - a failed query is data for the next step, not a crash
            return {"rows": None, "error": error_text(e), "empty": True}
        error = error_text(SQLError("no rows returned")) if p.empty_is_error and not rows else None
        return {"sql": sql, "rows": rows, "error": error, "empty": not rows}


class Rewrite:
    """``sql.rewrite``: show the model its last answer's error (or empty result) and take a new
    answer (one model call). Needs a conversation from ``sql.write``."""

    calls_model = True

    class Params(_Params):
        role: str = "policy"
        max_tokens: int | None = Field(None, ge=1)

    def run(self, p: Rewrite.Params, state: dict, rt: Any) -> dict:
        messages = list(state.get("messages") or [])
        if not messages:
            raise ValueError("sql.rewrite needs a conversation: put a sql.write step before it")
        feedback = state.get("error") or error_text(SQLError("no rows returned"))
        messages.append(Message(role="tool", content=feedback))
        out = rt.llm(p.role).complete(
            messages,
            temperature=rt.temperature(state, None),
            max_tokens=_max_tokens(rt, p.max_tokens),
            stop=stop_strings(rt.ctx.system.workflow or {}),
        )
        said = clean_sql(getattr(out, "text", ""))
        return {
            "messages": [*messages, Message(role="assistant", content=said)],
            "said": said,
            "sql": said,
            "turns": int(state.get("turns", 0)) + 1,
            "error": None,
        }


# ----------------------------------------------------------------------------- ready-made graphs

_ANSWER = {"id": "answer", "type": "answer", "params": {"fields": ["sql", "rows", "turns"]}}


def single_step() -> dict:
    """Write and answer: one model call per task (JSON for ``System.workflow["graph"]``)."""
    return {
        "entry": "write",
        "nodes": [{"id": "write", "type": "sql.write"}, _ANSWER],
        "edges": [{"src": "write", "dst": "answer"}],
    }


def repair_loop(max_turns: int = 3, when: str = "error") -> dict:
    """The hand-written agent as a graph: write, execute, rewrite while ``when`` holds (at most
    ``max_turns - 1`` rewrites), answer."""
    nodes = [{"id": "write", "type": "sql.write"}, {"id": "run", "type": "sql.execute"}, _ANSWER]
    edges = [{"src": "write", "dst": "run"}]
    if max_turns > 1:
        nodes.insert(2, {"id": "fix", "type": "sql.rewrite", "max_visits": max_turns - 1})
        edges += [{"src": "run", "dst": "fix", "when": when}, {"src": "fix", "dst": "run"}]
    edges.append({"src": "run", "dst": "answer"})
    return {"entry": "write", "nodes": nodes, "edges": edges}


def vote(n: int = 5, temperature: float = 0.8, parallel: int = 1) -> dict:
    """Self-consistency: ``n`` write→execute samples at ``temperature``; the most common result
    rows win (samples that error do not vote unless all do). ``parallel`` samples run at once."""
    extra = {"parallel": parallel} if parallel > 1 else {}  # 1 (the default) keeps the graph's id as it was
    return {
        "entry": "vote",
        "nodes": [
            {
                "id": "vote",
                "type": "vote",
                "params": {
                    "chain": ["write", "run"],
                    "n": n,
                    "temperature": temperature,
                    "key": "rows",
                    "exclude_when": "error",
                    **extra,
                },
            },
            {"id": "write", "type": "sql.write"},
            {"id": "run", "type": "sql.execute"},
            _ANSWER,
        ],
        "edges": [{"src": "vote", "dst": "answer"}],
    }


#: The palette the topology search uses on the SQL world (see :mod:`evolve.topology.edits`).
PALETTE: list[dict[str, Any]] = [
    {"name": "execute", "type": "sql.execute", "kind": "step"},
    {
        "name": "repair",
        "type": "sql.rewrite",
        "kind": "loop",
        "at": "sql.execute",
        "when": ["error", "error or empty"],
        "max_visits": [1, 2, 3],
    },
    {
        "name": "vote",
        "kind": "wrap",
        "chain_types": ["sql.write", "sql.execute"],
        "params": {"key": "rows", "exclude_when": "error"},
        "grid": {"n": [5, 8, 16, 3], "temperature": [0.8, 0.5, 1.0]},
    },
]
