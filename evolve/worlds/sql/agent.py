"""The multi-turn SQL agent: write SQL, run it, read the error, rewrite."""

from __future__ import annotations

from typing import Any

from evolve.types import Message
from evolve.worlds.sql.db import SQLError, clean_sql, error_text, execute
from evolve.worlds.sql.fewshot import demos_of
from evolve.worlds.sql.memory import recall
from evolve.worlds.sql.prompt import messages_for, stop_strings, with_tool_docs
from evolve.worlds.sql.tools import NotACall, run_call, toolbox


def act(ctx: Any, box: Any, said: str, db: str) -> tuple[str, Any]:
    """Run what the model said: a call when it names one of the system's query tools (in the
    sandbox), else SQL. Returns ``(the sql it stands for, rows)``."""
    if box is not None:
        try:
            return run_call(ctx, box, said, db)
        except NotACall:
            pass
    return said, ctx.tool("execute_sql", execute, db=db, sql=said)


def agent(task: dict, ctx: Any) -> dict:
    """Write SQL for ``task``; on an error, show it to the model and let it rewrite.

    Settings (``ctx.system.workflow``): ``max_turns`` (3), ``max_tokens`` (160),
    ``retry_on_empty`` (False: an empty result also counts as an error to rewrite), ``stop`` (stop
    strings for each reply, e.g. ``[";", "\\n\\n"]`` for a model that talks on after its query), ``tool_docs``
    (False: when true and the system has query tools, the system message lists them, one
    ``name(params) = SQL`` line each, for a model that reads; see :func:`~evolve.worlds.sql.prompt.tool_lines`).
    Prompt component ``instruction`` becomes the system message when non-empty; ``template`` lays
    out the user message (:mod:`evolve.worlds.sql.render`: which schema rendering, where). When the
    system has query tools (``System.tools``, see :mod:`evolve.worlds.sql.tools`), an answer
    that calls one runs that tool in the sandbox instead. When it has an experience memory
    (``System.memory``, see :mod:`evolve.worlds.sql.memory`), the recalled examples come first;
    the prompt component ``demos`` (see :mod:`evolve.worlds.sql.fewshot`) comes before them,
    shown as ``workflow.demo_style`` says (``masked``, default, or ``full``).
    Returns ``{"sql": final_sql, "rows": rows or None, "turns": n}``.
    """
    system = ctx.system
    wf = dict(getattr(system, "workflow", None) or {})
    instruction = (getattr(system, "prompts", None) or {}).get("instruction", "") or ""
    max_turns = max(1, int(wf.get("max_turns", 3)))
    max_tokens = int(wf.get("max_tokens", 160))
    retry_on_empty = bool(wf.get("retry_on_empty", False))
    stop = stop_strings(wf)
    db = task["db"]
    spec = getattr(system, "memory", None) or {}
    examples = (
        ctx.tool("recall_memory", lambda query: recall(spec, task), query=task["question"]) if spec.get("store") else []
    )
    from evolve.prompts.components import get_template

    messages = messages_for(
        task,
        instruction,
        examples,
        spec.get("render", "full"),
        demos_of(system),
        str(wf.get("demo_style", "masked")),
        get_template(getattr(system, "prompts", None) or {}),
    )
    llm = ctx.llm("policy")
    sql, turn = "", 0
    box = toolbox(system)
    # a model that reads is told of the tools (workflow.tool_docs); the tiny one learns them from demos
    messages = with_tool_docs(messages, box, wf)
    for turn in range(1, max_turns + 1):
        completion = llm.complete(messages, max_tokens=max_tokens, stop=stop)
        said = sql = clean_sql(getattr(completion, "text", ""))
        try:
            sql, rows = act(ctx, box, said, db)
            if retry_on_empty and not rows and turn < max_turns:
                raise SQLError("no rows returned")
        except Exception as e:  # noqa: BLE001 - every failure is shown to the model
            messages += [Message(role="assistant", content=said), Message(role="tool", content=error_text(e))]
            continue
        return {"sql": sql, "rows": rows, "turns": turn}
    return {"sql": sql, "rows": None, "turns": turn}


def _reflexion_agent() -> Any:
    """The agent with Reflexion: the execution-match feedback ("expected 3 rows, got 5") is the
    lesson (the tiny model cannot write reflections); attempts from workflow.reflexion_attempts (2)."""
    from evolve.reflexion import reflexion_agent as wrap

    fn = wrap(
        "evolve.worlds.sql:agent",
        "evolve.worlds.sql:reward",
        name="reflexion_agent",
        reflect="feedback",
        max_attempts=2,
    )
    fn.__module__ = "evolve.worlds.sql"
    return fn


reflexion_agent = _reflexion_agent()  # ``agent: evolve.worlds.sql:reflexion_agent`` in a task file
