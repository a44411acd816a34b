"""Recorded traffic as data for offline jobs: sessions from a trace store as tasks, and an agent
that replays a task's first turn through a candidate system.

In a task file::

    dataset:
      source: evolve.gateway.dataset:sessions
      params: {store: traces, route: sql, feedback: scored, val: 0.2}
    agent: evolve.gateway.dataset:replay      # where a candidate must answer anew
    reward: my_app.checks:verify              # a verifier (or an LLM judge) of the new answer

Each task is one session::

    {"id": <session id>, "session_id", "route", "system_id",
     "messages": [...], "tools": [...],          # the first call as the model saw it (OpenAI format)
     "request_messages": [...],                   # the first call as the agent sent it (OpenAI API)
     "answer": {"output", "tool_calls"},          # what was answered then
     "calls": [{"messages", "output", "tool_calls", "prompt_token_ids", "token_ids", "logprobs",
                "system_id", "role", "base", "adapter", "status"}, ...],
     "score", "components", "feedback_text"}      # its feedback (the latest score; all texts)

Operators that learn without re-running the agent read these fields: ``from_traces``
(:mod:`evolve.policy.from_traces`) trains on the recorded token ids of positively scored sessions.

A call's ``role`` is the system's model role that answered it (a local route records it; a team
route, ``local: {roles: ...}``, answers each model name with its own role), None where unknown
(an upstream route). ``sessions(..., role=R)`` keeps only R's calls (and the sessions that have
one); ``from_traces`` with ``roles`` sorts the calls by role itself.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from evolve.errors import ConfigError
from evolve.gateway.wire import TOOL_ERROR, text_of

FEEDBACK = ("any", "scored", "positive", "unscored")


def _split_of(session_id: str, seed: int, val: float, test: float) -> str:
    h = int(hashlib.sha256(f"{seed}:{session_id}".encode()).hexdigest()[:12], 16) / 16**12
    return "test" if h < test else "val" if h < test + val else "train"


def session_task(s: dict[str, Any], ok: list[Any], fb: list[Any], score: float | None) -> dict[str, Any]:
    """One session as a task (see the module docstring): ``s`` its row, ``ok`` its answered calls
    (at least one), ``fb`` its feedback, ``score`` the score it counts with."""
    first = ok[0]
    raw = first.request if isinstance(first.request, dict) else {}
    if first.api == "openai":
        original = raw.get("messages") or first.messages
    else:  # the agent's own messages, before any evolved component was applied
        from evolve.gateway.wire import GatewayError, anthropic_request

        try:
            original = anthropic_request(raw).messages
        except GatewayError:
            original = first.messages
    comps: dict[str, float] = {}
    for f in fb:
        comps.update(f.components)
    task = {
        "id": s["id"],
        "session_id": s["id"],
        "route": s["route"],
        "system_id": first.system_id,
        "messages": first.messages,
        "tools": first.tools,
        "request_messages": original,
        "answer": {"output": first.output, "tool_calls": first.tool_calls},
        "calls": [
            {
                "messages": c.messages,
                "output": c.output,
                "tool_calls": c.tool_calls,
                "prompt_token_ids": c.prompt_token_ids,
                "token_ids": c.token_ids,
                "logprobs": c.logprobs,
                "system_id": c.system_id,
                "status": c.status,
                **{k: (c.params.get("served_by") or {}).get(k) for k in ("role", "base", "adapter")},
            }
            for c in ok
        ],
        "score": score,
        "components": comps,
        "feedback_text": "\n".join(f.text for f in fb if f.text) or None,
    }
    return task


def sessions(
    store: str,
    *,
    base_dir: Path | None = None,
    route: str | None = None,
    system: str | None = None,
    since: float | None = None,
    until: float | None = None,
    feedback: str = "scored",
    min_score: float | None = None,
    val: float = 0.2,
    test: float = 0.0,
    seed: int = 0,
    apply: list[dict] | None = None,
    role: str | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Sessions of a trace store as train / val / test tasks (split by a hash of the session id, so
    a session keeps its split as the store grows). ``feedback``: any | scored (a score was given) |
    positive (score > 0, or >= ``min_score``) | unscored; ``route``, ``system`` (the system that
    answered the first call, an id prefix), ``since`` / ``until`` (Unix times) filter; ``role``
    keeps only the calls that role answered (a team's sessions as that role's tasks). ``apply``
    (the gateway's rules, e.g. ``[{component: policy.instruction, how: block}]``) is copied into
    each task for :func:`replay`."""
    from evolve.gateway.traces import TraceStore, scores_of

    if feedback not in FEEDBACK:
        raise ConfigError(f"feedback must be one of {list(FEEDBACK)}, got {feedback!r}", path="dataset.params.feedback")
    if not (0 <= val < 1 and 0 <= test < 1 and val + test < 1):
        raise ConfigError(
            f"val ({val}) and test ({test}) are shares of the sessions: each in [0, 1), together below 1",
            path="dataset.params",
        )
    path = Path(store)
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    st = TraceStore(path, create=False)
    out: dict[str, list[dict[str, Any]]] = {"train": [], "val": [], "test": []}
    try:
        for s in st.sessions():
            if route is not None and s["route"] != route:
                continue
            if system is not None and not (s["system_id"] or "").startswith(system):
                continue
            if since is not None and s["created"] < since or until is not None and s["created"] >= until:
                continue
            ok = [c for c in st.calls(s["id"]) if c.status == "ok"]
            if role is not None:
                ok = [c for c in ok if (c.params.get("served_by") or {}).get("role") == role]
            if not ok:
                continue
            fb = st.feedback_of(session_id=s["id"])
            score = scores_of(fb)
            if feedback == "scored" and score is None or feedback == "unscored" and score is not None:
                continue
            if feedback == "positive" and (score is None or score < (min_score if min_score is not None else 1e-12)):
                continue
            task = session_task(s, ok, fb, score)
            if apply:
                task["apply"] = list(apply)
            out[_split_of(s["id"], seed, val, test)].append(task)
    finally:
        st.close()
    if not out["train"] and not out["val"]:
        raise ConfigError(
            f"the trace store {path} has no session that passes the filters (feedback={feedback!r}"
            f"{', route=' + repr(route) if route else ''}{', role=' + repr(role) if role else ''}); record traffic and feedback first "
            "(evolve traces ls shows what is there)",
            path="dataset.params",
        )
    return out


def score_sessions(
    store: str | Path, reward: str, *, route: str | None = None, rescore: bool = False, base_dir: Path | None = None
) -> dict[str, int]:
    """Run a reward function offline over a store's sessions and record its verdicts as feedback
    (``source`` ``reward:<path>``; one per session and reward, so running it again adds nothing
    unless ``rescore``). ``reward(task, output)`` gets the session as a task (see the module
    docstring) and its last answer (``{"text", "tool_calls"}``, or the text alone without tool
    calls), and returns a number or a :class:`~evolve.types.Reward`. Returns counts."""
    from evolve.gateway.traces import TraceStore, scores_of
    from evolve.registry import import_path

    st = TraceStore(store, create=False)
    fn = import_path(reward, what="reward", search=base_dir or Path.cwd())
    counts = {"sessions": 0, "scored": 0, "skipped": 0, "failed": 0}
    source = f"reward:{reward}"
    try:
        for s in st.sessions():
            if route is not None and s["route"] != route:
                continue
            counts["sessions"] += 1
            ok = [c for c in st.calls(s["id"]) if c.status == "ok"]
            fb = st.feedback_of(session_id=s["id"])
            if not ok or (not rescore and any(f.source == source for f in fb)):
                counts["skipped"] += 1
                continue
            task = session_task(s, ok, fb, scores_of(fb))
            last = ok[-1]
            output = last.output if not last.tool_calls else {"text": last.output, "tool_calls": last.tool_calls}
            try:
                r = fn(task, output)
                score = float(getattr(r, "score", r))
                comps = dict(getattr(r, "components", None) or {})
                text = getattr(r, "feedback", None)
                n = sum(1 for f in fb if f.source == source)
                st.feedback(
                    session_id=s["id"],
                    score=score,
                    components=comps or None,
                    text=text or None,
                    id=f"{source}:{s['id']}:{n if rescore else 0}",
                    source=source,
                )
            except Exception:  # noqa: BLE001 - a reward that raises, or gives no finite score, scores nothing there
                counts["failed"] += 1
                continue
            counts["scored"] += 1
    finally:
        st.close()
    return counts


def experiences(trajectories: Any, tasks: dict[str, dict], *, threshold: float = 1.0) -> list[dict[str, Any]]:
    """The memory operator's ``extract`` for recorded traffic: every session task scored at or above
    ``threshold`` becomes an experience — its last user message as the text, what was answered as
    metadata (``answer``, ``tool_calls``, ``session``). The trajectories are not needed: what the
    session did is recorded. Use: ``{name: memory, params: {extract: evolve.gateway.dataset:experiences}}``."""
    out = []
    for t in tasks.values():
        if t.get("score") is None or t["score"] < threshold or not t.get("calls"):
            continue
        first = t["calls"][0]
        own = t.get("request_messages") or first["messages"]  # the agent's words, not what the gateway added
        user = next((m for m in reversed(own) if isinstance(m, dict) and m.get("role") == "user"), None)
        if user is None:
            continue
        text = text_of(user.get("content"))
        meta = {"answer": first.get("output") or "", "session": t["session_id"]}
        if first.get("tool_calls"):
            meta["tool_calls"] = first["tool_calls"]
        out.append({"kind": "experience", "text": text, "metadata": meta})
    return out


def recorded_trajectories(
    tasks: list[dict], role: str = "policy", system_id: str | None = None, enough: int = 1
) -> list[Any]:
    """Scored session tasks as trajectories of what was served: one LLM call per recorded call (the
    first with the agent's own messages, so the input shown is the user's, not what the gateway
    added), the session's score and its feedback text as the reward. For operators that reflect on
    behaviour (the ``reflective`` operator's ``traces``): only the sessions answered by
    ``system_id`` when there are at least ``enough`` of them, else all."""
    import json as _json

    from evolve.types import LLMCall, Message, Reward, Trajectory

    def msg(m: dict) -> Message:
        said = m.get("role")
        role_ = {"developer": "system", "function": "tool"}.get(said, said) if isinstance(said, str) else said
        text = text_of(m.get("content"))
        if m.get("tool_calls"):
            text = (text + "\n" if text else "") + _json.dumps(m["tool_calls"], ensure_ascii=False)
        return Message(role=role_ if role_ in ("system", "user", "assistant", "tool") else "user", content=text)

    scored = [t for t in tasks if t.get("score") is not None and t.get("calls")]
    own = [t for t in scored if system_id and t.get("system_id") == system_id]
    out = []
    for t in own if len(own) >= enough else scored:
        steps: list[Any] = []
        asked = t.get("request_messages")
        for i, c in enumerate(t["calls"]):
            steps.append(
                LLMCall(
                    role=role,
                    model=str(c.get("system_id") or "served"),
                    messages=tuple(
                        msg(m) for m in (asked if i == 0 and asked else c["messages"]) if isinstance(m, dict)
                    ),
                    output=(c.get("output") or "")
                    + (("\n" + _json.dumps(c["tool_calls"], ensure_ascii=False)) if c.get("tool_calls") else ""),
                )
            )
            steps.extend(tool_steps(c, t["calls"][i + 1 :]))
        last = t["calls"][-1]
        out.append(
            Trajectory(
                task_id=str(t["id"]),
                system_id=str(t.get("system_id") or ""),
                steps=tuple(steps),
                output=last.get("output"),
                reward=Reward(score=float(t["score"]), feedback=t.get("feedback_text") or ""),
            )
        )
    return out


def tool_steps(call: dict, later: list[dict]) -> list[Any]:
    """The tool calls a recorded call asked for, as trajectory steps with what came back: the result
    is the ``tool`` message with the call's id in a later call of the session (parsed as JSON when
    it is JSON); a result marked as an error becomes the step's ``error``. Calls whose result never
    came back (the session ended) are left out: nothing is known of what they did."""
    import json as _json

    from evolve.types import ToolCall

    results: dict[str, str] = {}
    for c in later:
        for m in c.get("messages") or []:
            if isinstance(m, dict) and m.get("role") == "tool" and isinstance(m.get("tool_call_id"), str):
                results.setdefault(m["tool_call_id"], text_of(m.get("content")))
    out = []
    for tc in call.get("tool_calls") or []:
        fn = tc.get("function") or {}
        if tc.get("id") not in results or not isinstance(fn.get("name"), str):
            continue
        try:
            args = _json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = {"arguments": fn.get("arguments")}
        text = results[tc["id"]]
        if text.startswith(TOOL_ERROR):
            out.append(
                ToolCall(
                    name=fn["name"],
                    args=args if isinstance(args, dict) else {"arguments": args},
                    error=text[len(TOOL_ERROR) :],
                )
            )
            continue
        try:
            value: Any = _json.loads(text)
        except ValueError:
            value = text
        out.append(
            ToolCall(name=fn["name"], args=args if isinstance(args, dict) else {"arguments": args}, result=value)
        )
    return out


def replay(task: dict, ctx: Any) -> Any:
    """A candidate answers a recorded session's first turn anew. The candidate's prompt components
    are applied to the agent's original messages by the task's ``apply`` rules (the gateway's);
    offered tools are rendered into the prompt as on a local route, and answered by the role that
    answered the recorded call (a team's), else ``policy``. Returns the text, or
    ``{"text", "tool_calls"}`` when the answer calls a tool."""
    from evolve.gateway.apply import Rule, apply_rules
    from evolve.gateway.local import parse_tool_calls, render

    messages = task.get("request_messages") or task["messages"]
    if task.get("apply"):
        rules = [Rule(**r) for r in task["apply"]]
        messages, _ = apply_rules(list(messages), rules, dict(ctx.system.prompts))
    role = ((task.get("calls") or [{}])[0] or {}).get("role")  # a team's session: the role that answered it
    out = ctx.llm(role if role and role in ctx.system.models else "policy").complete(
        render(list(messages), task.get("tools"))
    )
    text, calls = parse_tool_calls(out.text, task.get("tools"))
    return out.text if calls is None else {"text": text, "tool_calls": calls}


__all__ = ["experiences", "recorded_trajectories", "replay", "score_sessions", "session_task", "sessions", "tool_steps"]
