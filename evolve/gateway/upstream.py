"""What answers behind a route: an upstream model reached through litellm (any hosted provider, or
a user's vLLM / Ollama / OpenAI-compatible server).

Requests are passed on in the OpenAI chat format with their tools, tool choice and params
untouched; answers come back whole (:meth:`LiteLLMUpstream.complete`) or as the upstream's own
stream chunks (:meth:`LiteLLMUpstream.stream`). The upstream key is read from the environment
variable the route names, at each call; it is never recorded or logged (a route with an
``api_base`` and no ``api_key_env`` sends no key from the environment:
:func:`evolve.llm.litellm.api_key_for`).

Retries are the gateway's own (litellm's and the provider SDK's are off): a request reaches the
upstream at most ``1 + max_retries`` times; only a transient failure (429, 408/409/425, 5xx, a
connection error) is retried, after ``0.5 * 2**k`` seconds times a jitter in [0.5, 1.5)
(longer when ``Retry-After`` asks); a refusal (400, 401, 403, 404, 422, ...) is passed on at once.
All attempts together last at most ``timeout`` seconds: a hung upstream gets a 504 after
``timeout`` (a stream: until its answer starts; each wait for a next chunk is bounded by
``timeout`` too); no retry is made whose wait would reach past it. An upstream that fails
becomes a :class:`~evolve.gateway.wire.GatewayError` with the status the agent's client expects
(429 for a rate limit, 502 for an unreachable or failing upstream, 504 for a timeout, 400 with the
upstream's message for a request it refused).
"""

from __future__ import annotations

import asyncio
import fnmatch
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from evolve.gateway.wire import GatewayError, Request

_STATUS = {
    "rate_limit": 429,
    "timeout": 504,
    "unreachable": 502,
    "server": 502,
    "auth": 502,
    "not_found": 404,
    "request": 400,
    "config": 500,
    "backend": 500,
}
BACKOFF = 0.5  # seconds before the first retry of a transient upstream failure (doubled each time)
_RNG = random.Random()


@dataclass
class Result:
    """A whole answer, in the gateway's terms."""

    text: str | None
    tool_calls: list[dict] | None
    finish_reason: str | None
    model: str | None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None
    raw: dict[str, Any] = field(default_factory=dict)  # the OpenAI chat.completion object
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    system_id: str | None = None  # the system that answered, when the upstream knows (a local route)
    served: dict[str, Any] | None = None  # a local route: the role, base and adapter (sha256) that answered


class StreamAnswer:
    """What an OpenAI chat stream adds up to (its first choice): text, tool calls (a new id at an
    index already seen starts a new call), finish reason, usage, model."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[Any, dict[str, Any]] = {}
        self.keys: dict[int, Any] = {}  # a tool-call index -> its slot
        self.finish: str | None = None
        self.usage: dict[str, Any] = {}
        self.model: str | None = None

    def add(self, chunk: dict[str, Any]) -> str:
        """Take one chunk in; returns the text it adds."""
        self.model = chunk.get("model") or self.model
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        added = ""
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                added += delta["content"]
            for tc in delta.get("tool_calls") or []:
                i = int(tc.get("index", 0) or 0)
                key = self.keys.get(i, i)
                if tc.get("id") and key in self.calls and self.calls[key]["id"] not in (None, tc["id"]):
                    key = (i, len(self.calls))
                self.keys[i] = key
                slot = self.calls.setdefault(
                    key, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                fn = tc.get("function") or {}
                slot["id"] = tc.get("id") or slot["id"]
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            self.finish = choice.get("finish_reason") or self.finish
        if added:
            self.text.append(added)
        return added

    def result(self) -> Result:
        return Result(
            text="".join(self.text) if self.text else None,
            tool_calls=list(self.calls.values()) or None,
            finish_reason=self.finish,
            model=self.model,
            prompt_tokens=self.usage.get("prompt_tokens"),
            completion_tokens=self.usage.get("completion_tokens"),
        )


def upstream_error(e: BaseException, where: str, secret: str | None = None) -> GatewayError:
    from evolve.failures import category_of

    category = category_of(e, client=True) or "server"
    status = _STATUS.get(category, 502)
    message = str(e).replace("litellm.", "").strip()
    if secret and len(secret) >= 4:
        message = message.replace(secret, "[key]")  # a provider that echoes the key does not get it stored
    if category == "auth":
        message = f"the upstream {where} refused the gateway's credentials ({message}); check the route's api_key_env"
    elif category in ("unreachable", "timeout", "server", "rate_limit"):
        message = f"the upstream {where} failed ({category}): {message}"
    return GatewayError(status, message, code=f"upstream_{category}")


class Upstream:
    """What answers a route; the gateway calls, per request, :meth:`complete` (a whole answer) or
    :meth:`stream` (the answer as it comes), and :meth:`target` / :meth:`describe` to record and
    name it; :meth:`close` when the route closes.

    What a kind of upstream can do beyond answering is declared here, with the default for the kinds
    that cannot: :attr:`serves_systems` (it answers a request with the system the request names) and
    :attr:`system_id` (the system answering now)."""

    #: It serves a run's systems and answers a request with the one :attr:`Request.system` names
    #: (a session's own, the system of its first call); with it a route keeps each session on its
    #: system (when ``sticky``), and the gateway tells it which.
    serves_systems: ClassVar[bool] = False

    @property
    def system_id(self) -> str | None:
        """The id of the system answering now, where the upstream knows it (a local model)."""
        return None

    def target(self, asked: str) -> str:
        """The model recorded as the one that answers a request for ``asked``."""
        raise NotImplementedError

    def describe(self) -> str:
        """The upstream in words, for the messages of errors that name it."""
        raise NotImplementedError

    def model_names(self) -> list[str]:
        """The model names it answers to, for a route that matches none of its own."""
        raise NotImplementedError(f"{type(self).__name__} names no models: give its route a match")

    async def complete(self, req: Request) -> Result:
        raise NotImplementedError

    def stream(self, req: Request) -> AsyncIterator[Any]:
        """OpenAI ``chat.completion.chunk`` dicts; a local model may end with its whole :class:`Result`
        (for the record, not sent)."""
        raise NotImplementedError

    def close(self) -> None:
        """Let go of what it holds (nothing, unless the kind holds something)."""


@dataclass
class LiteLLMUpstream(Upstream):
    """``model`` is a litellm model name (``openai/gpt-4o-mini``, ``anthropic/claude-...``,
    ``hosted_vllm/...``); a ``*`` in it stands for the model name the agent asked for."""

    model: str
    api_base: str | None = None
    api_key_env: str | None = None
    timeout: float = 120.0
    max_retries: int = 2
    params: dict[str, Any] = field(default_factory=dict)

    def target(self, asked: str) -> str:
        return self.model.replace("*", asked) if "*" in self.model else self.model

    def describe(self) -> str:
        return self.model + (f" at {self.api_base}" if self.api_base else "")

    def _kwargs(self, req: Request, stream: bool) -> dict[str, Any]:
        from evolve.llm.litellm import api_key_for

        # the retries are ours (_open): litellm's (num_retries) and the SDK's (max_retries) are off
        kw: dict[str, Any] = {
            **self.params,
            **req.params,
            "model": self.target(req.model),
            "messages": req.messages,
            "timeout": self.timeout,
            "num_retries": 0,
            "max_retries": 0,
        }
        if self.api_base:
            kw["api_base"] = self.api_base
        key = api_key_for(self.api_base, self.api_key_env)
        if key:
            kw["api_key"] = key
        if stream:
            kw["stream"] = True
            kw["stream_options"] = {"include_usage": True}
        return kw

    async def _open(self, req: Request, stream: bool) -> Any:
        """The upstream's answer (or its open stream): at most ``1 + max_retries`` requests, only
        transient failures retried, all within ``timeout`` seconds."""
        from evolve.llm.litellm import import_litellm, is_retryable, retry_delay

        litellm = import_litellm()
        kw = self._kwargs(req, stream)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        attempt = 0
        while True:
            attempt += 1
            try:
                return await asyncio.wait_for(litellm.acompletion(**kw), max(deadline - loop.time(), 0.001))
            except Exception as e:  # noqa: BLE001 - every upstream failure becomes an API error for the agent
                if type(e) is asyncio.TimeoutError:  # our deadline (wait_for), not the client's own timeout
                    e = TimeoutError(
                        f"no answer within the route's timeout of {self.timeout:g}s "
                        f"({attempt} request{'s' if attempt > 1 else ''})"
                    )
                delay = (
                    retry_delay(e, attempt, BACKOFF, _RNG) if is_retryable(e) and attempt <= self.max_retries else None
                )
                if delay is None or loop.time() + delay >= deadline:
                    raise upstream_error(e, self.describe(), self._secret()) from None
                await asyncio.sleep(delay)

    async def complete(self, req: Request) -> Result:
        resp = await self._open(req, stream=False)
        raw = resp.model_dump(exclude_none=True)
        choice = (raw.get("choices") or [{}])[0]
        msg = choice.get("message") or {}
        usage = raw.get("usage") or {}
        cost = (getattr(resp, "_hidden_params", None) or {}).get("response_cost")
        lp = ((choice.get("logprobs") or {}).get("content")) or None
        return Result(
            text=msg.get("content"),
            tool_calls=msg.get("tool_calls") or None,
            finish_reason=choice.get("finish_reason"),
            model=raw.get("model"),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            cost=float(cost) if cost is not None else None,
            raw=raw,
            logprobs=[float(t.get("logprob")) for t in lp] if lp else None,
        )

    async def stream(self, req: Request) -> AsyncIterator[dict[str, Any]]:
        """The upstream's chunks as OpenAI ``chat.completion.chunk`` dicts."""
        chunks = await self._open(req, stream=True)
        try:
            async for chunk in chunks:
                yield chunk.model_dump(exclude_none=True)
        except GatewayError:
            raise
        except Exception as e:  # noqa: BLE001 - the stream broke half way
            raise upstream_error(e, self.describe(), self._secret()) from None

    def _secret(self) -> str | None:
        from evolve.llm.litellm import api_key_for

        return api_key_for(None, self.api_key_env)


@dataclass
class Route:
    """Which model names a route answers (``match``: names or globs), what answers them, and the
    label recorded as the system that answered (until the gateway serves evolved systems)."""

    name: str
    match: list[str]
    upstream: Upstream  # LiteLLMUpstream, or a model in this process (evolve.gateway.local.ModelUpstream)
    system_id: str | None = None
    source: Any = None  # evolve.gateway.apply.SystemSource: the run whose prompts apply
    rules: list[Any] = field(default_factory=list)  # evolve.gateway.apply.Rule
    recall: Any = None  # evolve.gateway.apply.RecallRule: the system's memories inserted
    sticky: bool = True  # a session stays with the system of its first call (routes that follow a run)
    tools: Any = None  # evolve.gateway.tools.ServedTools: the system's tools, run by the gateway
    canary: Any = None  # evolve.deploy.canary.CanaryView: the followed run's deployment (canary, blocked systems)

    def current_system(self) -> str | None:
        """The system answering now: the followed run's, the local route's, or the route's label."""
        if self.source is not None:
            return self.source.system_id
        return self.upstream.system_id or self.system_id

    def close(self) -> None:
        for part in (self.upstream, self.source, self.tools, self.canary):
            close = getattr(part, "close", None)
            if close is not None:
                close()

    def names(self) -> list[str]:
        """The model names (or globs) this route answers: ``match``, or when that is empty the names
        its model answers to now (a served run's role, model name and system id)."""
        return list(self.match) if self.match else list(self.upstream.model_names())

    def matches(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, pat) for pat in self.names())


def pick(routes: list[Route], model: str) -> Route:
    for r in routes:
        if r.matches(model):
            return r
    served = [p for r in routes for p in r.names()]
    raise GatewayError(
        404,
        f"the model {model!r} is not served by this gateway; its routes match {served}",
        param="model",
        code="model_not_found",
    )


__all__ = ["LiteLLMUpstream", "Result", "Route", "StreamAnswer", "Upstream", "pick", "upstream_error"]
