"""The env world's agent: a multi-turn loop over one episode of an OpenEnv-style environment.

``reset(seed)``, then, until the environment says ``done`` or ``workflow.max_turns`` replies are
spent: the model reads the last observation and replies, the reply becomes the action, ``step``
answers the next observation and a reward. Every reset and step is a recorded tool call of the
trajectory (``env.reset``, ``env.step``: the action sent, the observation, reward and done
answered), beside the model's calls.

The reply becomes an action by the task's ``action`` setting (``dataset.params.action``):

* ``{format: text, key: message}`` (the default): ``{"message": reply}``, OpenEnv's text
  environments' action (echo, chat, word games);
* ``{format: json}``: the reply is a JSON object, sent as the action (a reply that is not one
  costs a turn and the model is told why: the agent's failure, not the world's).

An action the server refuses (HTTP 422, OpenEnv's ``VALIDATION_ERROR``) costs a turn and the
model sees the server's reason. A server that is down, times out or answers garbage raises
:class:`~evolve.errors.InfraError`: the world failing, never a score.

Settings (``ctx.system.workflow``): ``max_turns`` (12), ``max_tokens`` (64), ``obs_chars`` (2000:
the tail of each observation the model sees), ``history`` (the last N exchanges kept besides the
first observation; all when unset). Prompt component ``instruction`` is the system message
(:data:`DEFAULT_INSTRUCTION` when unset; an empty string sends none). With a memory
(``System.memory``), the most similar rewarded episodes and their actions come first.
"""

from __future__ import annotations

import json
import re
from typing import Any

from evolve.types import Message

DEFAULT_INSTRUCTION = (
    "You are an agent acting in an environment. Each user message is the environment's observation; "
    "reply with your next action only."
)
TEXT_FIELDS = ("prompt", "text", "message", "content", "observation")
_OBJECT = re.compile(r"\{.*\}", re.S)


def render(observation: Any, key: str | None = None, limit: int = 2000) -> str:
    """An observation as the text the model reads: a string as it is; an object's ``key`` field, or
    its first text field of :data:`TEXT_FIELDS`, or the object as JSON; the last ``limit``
    characters."""
    if isinstance(observation, str):
        text = observation
    elif isinstance(observation, dict) and key is not None and key in observation:
        v = observation[key]
        text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    elif isinstance(observation, dict) and any(isinstance(observation.get(k), str) for k in TEXT_FIELDS):
        text = next(observation[k] for k in TEXT_FIELDS if isinstance(observation.get(k), str))
    else:
        text = json.dumps(observation, sort_keys=True, default=str)
    return text if len(text) <= limit else "…" + text[-limit:]


def to_action(reply: str, spec: dict) -> tuple[dict | None, str]:
    """``(action, "")`` from a reply, or ``(None, why)`` when it is not one (``json`` format only)."""
    text = (reply or "").strip()
    if spec.get("format", "text") == "text":
        return {spec.get("key", "message"): text}, ""
    fenced = re.search(r"```(?:json)?\s*\n?(.*?)```", text, re.S)
    body = fenced.group(1).strip() if fenced else text
    for candidate in (body, *(m.group(0) for m in [_OBJECT.search(body)] if m)):
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value, ""
        return None, f"it is JSON {type(value).__name__}, not an object"
    return None, "it is not a JSON object"


def recall_text(examples: list[dict]) -> str:
    lines = []
    for ex in examples:
        meta = ex.get("metadata") or {}
        actions = meta.get("actions") or []
        if not actions:
            continue
        lines.append(
            f"A similar episode that earned a return of {meta.get('return', 0):g}:\n"
            + ex["text"].strip()[:600]
            + "\nYour actions then:\n"
            + "\n".join(f"- {a}" for a in actions[:8])
        )
    return "\n\n".join(lines)


def messages_for(first: str, instruction: str | None, examples: list[dict] | None = None) -> list[Message]:
    """The messages an episode opens with: the instruction, recalled episodes, the first observation."""
    system = DEFAULT_INSTRUCTION if instruction is None else instruction
    out = [Message(role="system", content=system)] if system.strip() else []
    recalled = recall_text(examples or [])
    out.append(Message(role="user", content=(recalled + "\n\nNow:\n" if recalled else "") + first))
    return out


def _window(messages: list[Message], history: int | None) -> list[Message]:
    """The system message and the first observation, then the last ``history`` exchanges."""
    if history is None:
        return messages
    head = 2 if messages and messages[0].role == "system" else 1
    tail = messages[head:]
    keep = max(0, 2 * int(history) - 1)  # the last observation and the exchanges before it
    return messages[:head] + (tail[-keep:] if keep else [])


def _recall(spec: dict, query: str) -> list[dict]:
    from evolve.memory.recall import recall

    return recall(spec, query)


def action_text(action: dict, spec: dict) -> str:
    """How an action reads in memory and feedback: the text of a text action, else its JSON."""
    if spec.get("format", "text") == "text":
        return str(action.get(spec.get("key", "message"), ""))
    return json.dumps(action, sort_keys=True)


def agent(task: dict, ctx: Any) -> dict:
    """One episode of ``task`` (see the module docstring). Returns ``{"actions", "rewards",
    "return", "done", "turns", "invalid", "first_observation", "final_observation",
    "transport"}``."""
    from evolve.worlds.env.client import ActionRejected, connect
    from evolve.worlds.env.launch import serve

    cfg = task["env"]
    wf = dict(getattr(ctx.system, "workflow", None) or {})
    prompts = getattr(ctx.system, "prompts", None) or {}
    max_turns = max(1, int(wf.get("max_turns", 12)))
    max_tokens = int(wf.get("max_tokens", 64))
    obs_chars = int(wf.get("obs_chars", 2000))
    history = wf.get("history")
    spec, key = dict(cfg.get("action") or {}), cfg.get("observation_key")
    base = cfg.get("url") or serve(cfg["server"], cfg.get("search"))
    env = connect(base, cfg.get("transport", "auto"), timeout=float(cfg.get("timeout", 30)))
    actions: list[dict] = []
    rewards: list[float] = []
    invalid = turn = 0
    try:
        first = ctx.tool(
            "env.reset", lambda **kw: env.reset(**kw).as_json(), **{"seed": task["seed"], **(cfg.get("reset") or {})}
        )
        obs, done = first["observation"], bool(first["done"])
        first_text = render(obs, key, obs_chars)
        mem = getattr(ctx.system, "memory", None) or {}
        examples = ctx.tool("recall_memory", _recall, spec=mem, query=first_text) if mem.get("store") else []
        messages = messages_for(first_text, prompts.get("instruction"), examples)
        llm = ctx.llm("policy")
        while not done and turn < max_turns:
            turn += 1
            reply = getattr(llm.complete(_window(messages, history), max_tokens=max_tokens), "text", "") or ""
            messages.append(Message(role="assistant", content=reply))
            action, why = to_action(reply, spec)
            if action is None:
                invalid += 1
                messages.append(
                    Message(role="user", content=f"That reply is not an action: {why}. Reply with one JSON object.")
                )
                continue
            try:
                r = ctx.tool("env.step", lambda action: env.step(action).as_json(), action=action)
            except ActionRejected as e:
                invalid += 1
                messages.append(Message(role="user", content=f"The environment refused that action: {e}"))
                continue
            actions.append(action)
            rewards.append(float(r["reward"] or 0.0))
            obs, done = r["observation"], bool(r["done"])
            messages.append(Message(role="user", content=render(obs, key, obs_chars)))
    finally:
        env.close()
    return {
        "actions": [action_text(a, spec) for a in actions],
        "rewards": rewards,
        "return": sum(rewards),
        "done": done,
        "turns": turn,
        "invalid": invalid,
        "first_observation": first_text,
        "final_observation": render(obs, key, obs_chars),
        "transport": env.transport,
    }


def _reflexion_agent() -> Any:
    """The agent with Reflexion: the episode's feedback (its return, the last observation) is the
    lesson's material; each attempt is a fresh episode of the same seed."""
    from evolve.reflexion import reflexion_agent as wrap

    fn = wrap(
        "evolve.worlds.env:agent",
        "evolve.worlds.env:reward",
        name="reflexion_agent",
        reflect="feedback",
        max_attempts=2,
    )
    fn.__module__ = "evolve.worlds.env"
    return fn


reflexion_agent = _reflexion_agent()  # ``agent: evolve.worlds.env:reflexion_agent`` in a task file

__all__ = [
    "DEFAULT_INSTRUCTION",
    "TEXT_FIELDS",
    "action_text",
    "agent",
    "messages_for",
    "recall_text",
    "reflexion_agent",
    "render",
    "to_action",
]
