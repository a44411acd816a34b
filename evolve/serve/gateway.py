"""The rollout gateway: an OpenAI endpoint per rollout, so an unmodified agent gets trained.

:meth:`RolloutContext.openai_base_url <evolve.rollout.RolloutContext.openai_base_url>` starts
(once per process, lazily, thread-safe) one loopback :class:`~evolve.serve.server.OpenAIServer`
on a free port and registers the rollout under a random, unguessable token; the agent points
any OpenAI client at ``http://127.0.0.1:<port>/r/<token>/v1``. Each request is answered by
``ctx.llm(role).complete(...)``, so it is recorded in that rollout's trajectory exactly as a
native call (prompt and sampled token ids, log-probs, the temperature used).

* Temperature: when the rollout has a temperature of its own (an exploration rollout sampled
  by the engine) it wins over the request's, because training needs the temperature it asked
  for; otherwise the request's temperature is used, and without one the role's default.
* The request's ``seed`` is ignored: the rollout seeds each step (reproducible rollouts).
* Any model name is accepted (an unmodified agent names its own); any API key too: the token in
  the URL is the secret. When the rollout ends :func:`unregister` drops the token (404 after).
"""

from __future__ import annotations

import os
import secrets
import threading
from typing import Any, Protocol

from evolve.serve.protocol import APIError, ChatRequest
from evolve.serve.server import Answer, OpenAIServer, tokenizer_of


class Rollout(Protocol):
    """What a route needs of a rollout (:class:`evolve.rollout.RolloutContext`, which registers
    itself here; named by its shape, so this module does not depend back on it)."""

    system: Any
    temperature: float | None
    _gateway: dict[str, str]

    def llm(self, role: str = "policy") -> Any: ...

_LOCK = threading.Lock()
_SERVER: OpenAIServer | None = None
_PID: int | None = None
_ROUTES: dict[str, tuple[Rollout, str]] = {}


def _after_fork_in_child() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # another thread may have held it at fork(); server() starts a new gateway


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _RolloutTarget:
    def __init__(self, ctx: Rollout, role: str) -> None:
        self.ctx, self.role = ctx, role

    def model_names(self) -> list[str]:
        spec = self.ctx.system.models.get(self.role)
        return list(dict.fromkeys([self.role] + ([spec.name] if spec is not None else [])))

    def accepts(self, model: str | None) -> bool:
        return True

    def chat(self, req: ChatRequest) -> Answer:
        from evolve.errors import RolloutTimeout

        ctx = self.ctx
        llm = ctx.llm(self.role)
        temperature = None if ctx.temperature is not None else req.temperature
        try:
            outs = [llm.complete(req.messages, temperature=temperature, max_tokens=req.max_tokens, stop=req.stop)
                    for _ in range(req.n)]
        except RolloutTimeout:
            raise APIError(408, "the rollout ran past its time limit", type="timeout", code="rollout_timeout") from None
        return Answer(outs, model=outs[0].model, fingerprint=ctx.system.id, tokenizer=tokenizer_of(llm))


def _route(kind: str | None, key: str | None) -> _RolloutTarget | None:
    if kind != "r" or not key:
        return None
    with _LOCK:
        hit = _ROUTES.get(key)
    return None if hit is None else _RolloutTarget(*hit)


def server() -> OpenAIServer:
    """The process's gateway server, started on first use (again in a forked child)."""
    global _SERVER, _PID
    with _LOCK:
        if _SERVER is None or _PID != os.getpid():
            if _PID != os.getpid():
                _ROUTES.clear()  # a forked child: the parent's rollouts are not ours
            _SERVER = OpenAIServer(_route, host="127.0.0.1", port=0).start()
            _PID = os.getpid()
        return _SERVER


def register(ctx: Rollout, role: str = "policy") -> str:
    """Route a token to ``ctx``'s ``role`` (one token per context and role); returns the base URL."""
    if role not in ctx.system.models:
        raise KeyError(f"the system has no model role {role!r}; it has {sorted(ctx.system.models)}")
    srv = server()
    tokens: dict[str, str] = ctx._gateway
    with _LOCK:
        token = tokens.get(role)
        if token is None or token not in _ROUTES:
            token = secrets.token_urlsafe(24)
            _ROUTES[token] = (ctx, role)
            tokens[role] = token
    return f"http://127.0.0.1:{srv.port}/r/{token}/v1"


def unregister(ctx: Rollout) -> None:
    """Drop every token of ``ctx``: its URLs answer 404 from now on."""
    with _LOCK:
        for token in ctx._gateway.values():
            _ROUTES.pop(token, None)


def active() -> int:
    """How many rollout routes are registered (for tests and diagnostics)."""
    with _LOCK:
        return len(_ROUTES)


__all__ = ["active", "register", "server", "unregister"]
