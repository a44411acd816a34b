"""The rollouts' endpoint: an OpenAI endpoint per rollout, so an unmodified agent gets trained.

:meth:`RolloutContext.openai_base_url <evolve.rollout.RolloutContext.openai_base_url>` starts
(once per process, lazily, thread-safe) one loopback gateway (:class:`~evolve.gateway.app.Gateway`,
no trace store) on a free port and registers the rollout under a random, unguessable token; the
agent points any OpenAI (or Anthropic) client at ``http://127.0.0.1:<port>/r/<token>/v1``. Each
request is answered by ``ctx.llm(role).complete(...)``, so it is recorded in that rollout's
trajectory exactly as a native call (prompt and sampled token ids, log-probs, the temperature used).

* Temperature: when the rollout has a temperature of its own (an exploration rollout sampled
  by the engine) it wins over the request's, because training needs the temperature it asked
  for; otherwise the request's temperature is used, and without one the role's default.
* The request's ``seed`` is ignored: the rollout seeds each step (reproducible rollouts).
* Any model name is accepted (an unmodified agent names its own); any API key too: the token in
  the URL is the secret. When the rollout ends :func:`unregister` drops the token (404 after).
* Tools are offered in the prompt, as on every local route (:mod:`evolve.gateway.local`).
"""

from __future__ import annotations

import os
import secrets
import threading
from typing import TYPE_CHECKING, Any, Protocol

from evolve.gateway.local import ModelUpstream, refuse_top_logprobs, tokenizer_of, top_logprobs_of
from evolve.gateway.upstream import Route
from evolve.gateway.wire import GatewayError, Request

if TYPE_CHECKING:  # pragma: no cover
    from evolve.gateway.app import HTTPGateway


class Rollout(Protocol):
    """What a route needs of a rollout (:class:`evolve.rollout.RolloutContext`, which registers
    itself here; named by its shape, so this module does not depend back on it)."""

    system: Any
    temperature: float | None
    _gateway: dict[str, str]

    def llm(self, role: str = "policy") -> Any: ...


_LOCK = threading.Lock()
_SERVER: HTTPGateway | None = None
_PID: int | None = None
_ROUTES: dict[str, tuple[Rollout, str, Route]] = {}


def _after_fork_in_child() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # another thread may have held it at fork(); server() starts a new gateway


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class RolloutUpstream(ModelUpstream):
    """``role`` of one rollout's system, through the rollout's own (recording) LLM."""

    # a rollout's calls are its steps, in order, each seeded by the steps before it: n choices run one by one
    concurrent_choices = False
    serves_systems = True  # the rollout's own system (its id is the one recorded)

    def __init__(self, ctx: Rollout, role: str) -> None:
        self.ctx, self.role = ctx, role

    def model_names(self) -> list[str]:
        spec = self.ctx.system.models.get(self.role)
        return list(dict.fromkeys([self.role] + ([spec.name] if spec is not None else [])))

    @property
    def system_id(self) -> str:
        return self.ctx.system.id

    def describe(self) -> str:
        return f"the rollout's model ({self.role})"

    def generate(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float | None,
        max_tokens: int | None,
        stop: list[str] | None,
        seed: int | None,
        req: Request,
    ) -> tuple[Any, str | None, Any]:
        from evolve.errors import RolloutTimeout
        from evolve.types import Message

        llm = self.ctx.llm(self.role)
        top = top_logprobs_of(req)
        if top and not llm.backend_takes("top_logprobs"):
            raise refuse_top_logprobs(self.describe())
        try:  # the rollout's own temperature wins; its seed too (the request's is ignored)
            out = llm.complete(
                [Message(**m) for m in messages],
                max_tokens=max_tokens,
                stop=stop,
                temperature=None if self.ctx.temperature is not None else temperature,
                logprobs=True if req.params.get("logprobs") else None,
                top_logprobs=top,
            )
        except RolloutTimeout:
            raise GatewayError(408, "the rollout ran past its time limit", code="rollout_timeout") from None
        return out, self.ctx.system.id, tokenizer_of(llm)


def _route(token: str) -> Route | None:
    with _LOCK:
        hit = _ROUTES.get(token)
    return None if hit is None else hit[2]


def server() -> HTTPGateway:
    """The process's rollout gateway, started on first use (again in a forked child)."""
    global _SERVER, _PID
    from evolve.gateway.app import Gateway, HTTPGateway
    from evolve.gateway.asgi import need_http

    with _LOCK:
        if _SERVER is None or _PID != os.getpid():
            if _PID != os.getpid():
                _ROUTES.clear()  # a forked child: the parent's rollouts are not ours
            need_http("an agent's OpenAI endpoint (ctx.openai_base_url)")
            _SERVER = HTTPGateway(Gateway([], None, by_token=_route), "127.0.0.1", 0, "the rollouts' endpoint").start()
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
            _ROUTES[token] = (ctx, role, Route("rollout", [], RolloutUpstream(ctx, role), sticky=False))
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


__all__ = ["RolloutUpstream", "active", "register", "server", "unregister"]
