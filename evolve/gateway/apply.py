"""The evolved system applied at the gateway, without touching the agent: a run's current system's
prompt components put into each request by the route's declared rules.

A route's ``evolve`` block names the run and the rules::

    evolve:
      run: runs/support-agent        # its archive's current system is followed (promotion, rollback)
      apply:
        - component: policy.instruction   # a key of System.prompts
          how: block                      # block | prepend | append | replace
          message: system                 # the message it goes into: system (the first) or last_user

* ``block`` replaces the placeholder ``{{evolve:<component>}}`` in that message (the agent marks
  where the evolved text goes, and keeps the rest of its prompt its own);
* ``prepend`` / ``append`` put the component before / after the message's text;
* ``replace`` replaces the message's text whole;
* ``demos`` inserts the component's few-shot demos (a JSON list of ``{"input", "output"}``, as
  the prompt layer's ``*.demos`` components hold) as user / assistant message pairs right before
  the last user message (``message`` is not used).

``message: system`` adds a system message when the request has none. A rule whose component the
system lacks, or whose placeholder the message lacks, changes nothing; the call records the rules
that did apply (``params.evolve_applied``) and the system id, so every call says which system
answered it. The agent may also read the components: ``GET /v1/evolve/system?model=<name>``.

``recall: {message: system, how: append, header: ..., format: "- {text}"}`` in the ``evolve`` block
also inserts what the system's memory (``System.memory``: store, version, k, kinds) recalls for the
last user message, through :data:`evolve.registry.recallers`; the call records the item ids
(``params.memory_recalled``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.gateway.wire import Request, text_of

if TYPE_CHECKING:  # pragma: no cover
    from evolve.gateway.upstream import Route

HOW = ("block", "prepend", "append", "replace", "demos")
WHERE = ("system", "last_user")


@dataclass(frozen=True)
class Rule:
    component: str
    how: str = "block"
    message: str = "system"

    def placeholder(self) -> str:
        return "{{evolve:" + self.component + "}}"


def demo_messages(value: str) -> list[dict[str, str]]:
    """Few-shot demos (a JSON list of ``{"input", "output"}``) as user / assistant messages; [] when
    the component is not such a list."""
    import json

    try:
        demos = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError:
        return []
    out: list[dict[str, str]] = []
    for d in demos if isinstance(demos, list) else []:
        if isinstance(d, dict) and "input" in d and "output" in d:

            def text(v: Any) -> str:
                return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)

            out += [{"role": "user", "content": text(d["input"])}, {"role": "assistant", "content": text(d["output"])}]
    return out


def _edit(content: Any, rule: Rule, value: str) -> Any:
    """The message content with the rule applied (None: the rule does not apply). A list of content
    parts keeps its other parts (images, files): text parts are edited, or one is added."""
    if isinstance(content, list):
        parts = [dict(p) if isinstance(p, dict) else p for p in content]
        texts = [i for i, p in enumerate(parts) if isinstance(p, dict) and p.get("type") == "text"]
        if rule.how == "block":
            hit = [i for i in texts if rule.placeholder() in str(parts[i].get("text", ""))]
            if not hit:
                return None
            for i in hit:
                parts[i]["text"] = parts[i]["text"].replace(rule.placeholder(), value)
            return parts
        if rule.how == "replace":
            rest = [p for i, p in enumerate(parts) if i not in texts]
            return [{"type": "text", "text": value}, *rest]
        part = {"type": "text", "text": value}
        return [part, *parts] if rule.how == "prepend" else [*parts, part]
    text = text_of(content)
    if rule.how == "block":
        return text.replace(rule.placeholder(), value) if rule.placeholder() in text else None
    if rule.how == "prepend":
        return value + ("\n\n" + text if text else "")
    if rule.how == "append":
        return (text + "\n\n" if text else "") + value
    return value


def apply_rules(messages: list[dict], rules: list[Rule], prompts: dict[str, str]) -> tuple[list[dict], list[str]]:
    """(the messages with the rules applied, the components that were applied); the input is not changed."""
    out = [dict(m) for m in messages]
    applied = []
    for rule in rules:
        value = prompts.get(rule.component)
        if value is None:
            continue
        if rule.how == "demos":
            pairs = demo_messages(value)
            last = next((i for i in range(len(out) - 1, -1, -1) if out[i].get("role") == "user"), None)
            if not pairs or last is None:
                continue
            out[last:last] = pairs
            applied.append(rule.component)
            continue
        if rule.message == "system":
            idx = next((i for i, m in enumerate(out) if m.get("role") in ("system", "developer")), None)
            if idx is None:
                if rule.how == "block":
                    continue
                out.insert(0, {"role": "system", "content": ""})
                idx = 0
        else:
            idx = next((i for i in range(len(out) - 1, -1, -1) if out[i].get("role") == "user"), None)
            if idx is None:
                continue
        content = out[idx].get("content")
        new = _edit(content, rule, value)
        if new is None:
            continue
        out[idx] = {**out[idx], "content": new}
        applied.append(rule.component)
    return out, applied


@dataclass(frozen=True)
class RecallRule:
    """Where a system's recalled memories go: ``message`` (system | last_user), ``how`` (prepend |
    append), under ``header``; each item shown as ``format`` (``{text}`` and the item's metadata
    keys, e.g. ``{text} -> {answer}``)."""

    message: str = "system"
    how: str = "append"
    header: str = "Relevant past experience:"
    format: str = "- {text}"


def recall_text(items: list[dict], rule: RecallRule) -> str:
    lines = []
    for it in items:
        try:
            lines.append(
                rule.format.format(text=it["text"], **{k: v for k, v in it["metadata"].items() if k != "text"})
            )
        except Exception:  # noqa: BLE001 - a format that does not fit an item shows the item plainly
            lines.append(f"- {it['text']}")
    return rule.header + "\n" + "\n".join(lines) if lines else ""


def apply_recall(
    messages: list[dict], memory: dict | None, rule: RecallRule | None, query_from: list[dict] | None = None
) -> tuple[list[dict], list[str]]:
    """(the messages with the system's recalled memories inserted, the recalled item ids). The query
    is the last user message of ``query_from`` (the agent's own messages) or of ``messages``."""
    if rule is None or not memory or not memory.get("store"):
        return messages, []
    from evolve.registry import recallers

    source = query_from if query_from is not None else messages
    query = next((text_of(m.get("content")) for m in reversed(source) if m.get("role") == "user"), "")
    items = recallers.get("memory")(memory, query)
    text = recall_text(items, rule)
    if not text:
        return messages, []
    out, _ = apply_rules(messages, [Rule("_recall", rule.how, rule.message)], {"_recall": text})
    return out, [it["id"] for it in items]


@dataclass
class SystemSource:
    """A run's current system (or a pinned one), re-read when the archive's pointer moves (checked at
    most every ``poll`` seconds, on a request's thread)."""

    run: Path
    system: str | None = None
    poll: float = 1.0
    _archive: Any = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _sid: str | None = field(default=None, init=False)
    _prompts: dict[str, str] = field(default_factory=dict, init=False)
    _memory: dict[str, Any] = field(default_factory=dict, init=False)
    _checked: float = field(default=0.0, init=False)
    _others: dict[str, tuple[dict[str, str], dict[str, Any]]] = field(default_factory=dict, init=False)
    _systems: dict[str, Any] = field(default_factory=dict, init=False)

    def resolve(self, pinned: str | None = None) -> tuple[str | None, dict[str, str], dict[str, Any]]:
        """(id, prompts, memory) of ``pinned`` (a session's own system), else of the current one (also
        when the pinned system is not in this run's archive)."""
        sid, prompts = self.current()
        with self._lock:
            memory = self._memory if sid == self._sid else {}
            if pinned is None or pinned == sid:
                return sid, prompts, memory
            got = self._others.get(pinned)
        if got is None:
            try:
                system = self._archive.get_system(pinned)
            except Exception:  # noqa: BLE001 - not this run's system: the session is served the current one
                return sid, prompts, memory
            got = (dict(system.prompts), dict(system.memory or {}))
            with self._lock:
                if len(self._others) >= 64:
                    self._others.pop(next(iter(self._others)))
                self._others[pinned] = got
        return pinned, got[0], got[1]

    def get(self, sid: str | None) -> Any:
        """A system of this run (:class:`~evolve.types.System`), or None when it is not in its
        archive. Systems never change, so each is read once."""
        if sid is None:
            return None
        with self._lock:
            if sid in self._systems:
                return self._systems[sid]
        try:
            got = self._archive.get_system(sid)
        except Exception:  # noqa: BLE001 - not this run's system
            got = None
        with self._lock:
            if len(self._systems) >= 64:
                self._systems.pop(next(iter(self._systems)))
            self._systems[sid] = got
        return got

    def open(self) -> SystemSource:
        from evolve.archive import Archive

        if self._archive is None:
            self._archive = Archive(self.run, create=False)
            self._load(self._archive.resolve(self.system or "current"))
        return self

    def _load(self, sid: str) -> None:
        system = self._archive.get_system(sid)
        self._sid, self._prompts, self._checked = sid, dict(system.prompts), time.monotonic()
        self._memory = dict(system.memory or {})

    @property
    def memory(self) -> dict[str, Any]:
        """The current system's memory spec (store, version, k, kinds)."""
        return self._memory

    def current(self) -> tuple[str | None, dict[str, str]]:
        with self._lock:
            if self.system is None and time.monotonic() - self._checked >= self.poll:
                self._checked = time.monotonic()
                try:
                    cur = self._archive.current()
                    if cur is not None and cur != self._sid:
                        self._load(cur)
                except Exception:  # noqa: BLE001 - keep the system we have; the next check tries again
                    pass
            return self._sid, self._prompts

    @property
    def system_id(self) -> str | None:
        return self._sid

    def close(self) -> None:
        if self._archive is not None:
            self._archive.close()
            self._archive = None


@dataclass
class Applied:
    """What the answering system made of a request: its id, the prompt rules that applied, the
    memory items recalled, the system's own tools served (by name)."""

    system_id: str | None
    rules: list[str] = field(default_factory=list)
    recalled: list[str] = field(default_factory=list)
    tools: dict[str, Any] = field(default_factory=dict)


async def apply_system(
    route: Route, req: Request, pinned: str | None, sent: list[dict], log: Callable[[str], None] | None = None
) -> Applied:
    """Make ``req`` the request of system ``pinned`` (None: the route's current system), in place:
    the route's prompt rules and memory recall applied to its messages (the recall's query from
    ``sent``, the messages as the agent sent them), the system's served tools added to those on
    offer, and the system named to an upstream that answers with the system it is told."""
    import anyio

    applied = Applied(pinned or route.current_system())
    if route.source is not None:
        applied.system_id, prompts, memory = await anyio.to_thread.run_sync(route.source.resolve, pinned)
        req.messages, applied.rules = apply_rules(req.messages, route.rules, prompts)
        if route.recall is not None:
            try:
                req.messages, applied.recalled = await anyio.to_thread.run_sync(
                    lambda: apply_recall(req.messages, memory, route.recall, sent)
                )
            except Exception as e:  # noqa: BLE001 - memory that cannot be read never fails the call
                if log:
                    log(f"recall failed on route {route.name} ({type(e).__name__}: {e}); answered without")
    if route.tools is not None and route.source is not None:  # the system's own tools, run by the gateway
        system = await anyio.to_thread.run_sync(route.source.get, applied.system_id)
        applied.tools = route.tools.offered(system, req.tools)
        if applied.tools:
            req.params["tools"] = [*(req.tools or []), *(route.tools.schema(t) for t in applied.tools.values())]
    if route.upstream.serves_systems:  # e.g. a local route: it answers with the session's own system
        req.system = pinned
    return applied


__all__ = [
    "HOW",
    "WHERE",
    "Applied",
    "RecallRule",
    "Rule",
    "SystemSource",
    "apply_recall",
    "apply_rules",
    "apply_system",
]
