"""What the trace store holds: a call through the gateway
(:class:`CallRecord`), a piece of feedback (:class:`Feedback`, checked from untrusted input by
:func:`check_feedback`), the key by which a conversation continued by a stateless client is found
again (:func:`chain_key`), and a session's reward from its feedback (:func:`scores_of`). The store
itself is :class:`evolve.gateway.traces.TraceStore`, which exports these too.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evolve.errors import UserError
from evolve.gateway.wire import text_of


@dataclass
class CallRecord:
    """One call through the gateway, as stored. ``messages``, ``tools`` and ``tool_calls`` are in
    the OpenAI chat format whatever API the agent spoke; ``request``/``response`` are the raw bodies."""

    session_id: str
    api: str
    messages: list[dict]
    model: str | None = None
    route: str | None = None
    upstream_model: str | None = None
    stream: bool = False
    tools: list[dict] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    output: str | None = None
    tool_calls: list[dict] | None = None
    finish_reason: str | None = None
    request: Any = None
    response: Any = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None
    system_id: str | None = None
    status: str = "ok"
    error: str | None = None
    id: str = field(default_factory=lambda: "call-" + uuid.uuid4().hex)
    ts: float = field(default_factory=time.time)
    seq: int | None = None  # its place in the session, set when stored
    chain_key: str | None = None  # the conversation so far with this call's answer (see :func:`chain_key`)


@dataclass(frozen=True)
class Feedback:
    id: str
    session_id: str | None
    call_id: str | None
    score: float | None
    components: dict[str, float]
    text: str | None
    ts: float
    source: str | None = None


def _norm_args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def chain_key(messages: Sequence[dict]) -> str:
    """A hash of a conversation that ignores what clients re-serialise differently (ids, JSON spacing,
    ``None`` against empty content), so a conversation continued by a stateless client is found again."""
    norm = []
    for m in messages:
        if not isinstance(m, dict):
            norm.append([None, str(m), []])
            continue
        calls = []
        for c in m.get("tool_calls") or [] if isinstance(m.get("tool_calls"), list) else []:
            fn = c.get("function") if isinstance(c, dict) else None
            fn = fn if isinstance(fn, dict) else {}
            calls.append((fn.get("name"), _norm_args(fn.get("arguments"))))
        norm.append([m.get("role"), text_of(m.get("content")).strip(), calls])
    return hashlib.sha256(json.dumps(norm, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def answer_message(call: CallRecord) -> dict[str, Any]:
    """The assistant message a call answered with, in the OpenAI chat format."""
    msg: dict[str, Any] = {"role": "assistant", "content": call.output}
    if call.tool_calls:
        msg["tool_calls"] = call.tool_calls
    return msg


def check_feedback(
    *, session_id: str | None, call_id: str | None, score: Any, components: Any, text: Any, id: Any, source: Any = None
) -> Feedback:
    """Feedback from untrusted input, or a :class:`UserError` naming what is wrong."""
    import math

    if session_id is None and call_id is None:
        raise UserError("feedback needs 'session_id' or 'call_id' (the session or the call it is about)")
    for name, v in (("session_id", session_id), ("call_id", call_id), ("text", text), ("id", id), ("source", source)):
        if v is not None and not isinstance(v, str):
            raise UserError(f"feedback '{name}' must be a string, got {type(v).__name__}")
    if score is not None:
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise UserError(f"feedback 'score' must be a finite number, got {score!r}")
        score = float(score)
    comps: dict[str, float] = {}
    if components is not None:
        if not isinstance(components, Mapping):
            raise UserError("feedback 'components' must be an object of name: number")
        for k, v in components.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise UserError(f"feedback component {k!r} must be a finite number, got {v!r}")
            comps[str(k)] = float(v)
    if score is None and not comps and not text:
        raise UserError("feedback needs a 'score', 'components' or 'text'")
    if id is None:
        content = json.dumps([session_id, call_id, score, comps, text], sort_keys=True)
        id = "fb-" + hashlib.sha256(content.encode()).hexdigest()[:32]
    return Feedback(id, session_id, call_id, score, comps, text, time.time(), source)


def scores_of(feedback: Sequence[Feedback]) -> float | None:
    """A session's reward from its feedback: the latest score given (None without one)."""
    scored = [f for f in feedback if f.score is not None]
    return scored[-1].score if scored else None


__all__ = ["CallRecord", "Feedback", "answer_message", "chain_key", "check_feedback", "scores_of"]
