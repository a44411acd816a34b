"""Telling the agent failing from the world failing under it.

A rollout can fail in two ways, and only one of them says anything about the agent:

* **the agent's own failure** — it raised, it timed out, it sent a request the model refused
  (a prompt past the context window), or its reward failed: a legitimate score of 0, stored
  with the error, counted in the report;
* **the world failing under it** — the model unreachable, a rate limit, a server error, a bad
  key, a model that does not exist, a missing package, the sandbox unavailable, the worker
  process dying: not a result. The engine retries the rollout (:mod:`evolve.scoring.retry`), and
  stops the run when it keeps failing; it never stores it as a score.

:func:`classify` decides for an exception. Model calls made through ``ctx.llm`` (and the
per-rollout OpenAI endpoint) are classified as they fail, so an agent that catches the error and
goes on still has its rollout marked: a rollout during which the model could not be reached is
not a result, whatever the agent made of it. Exceptions an agent raises from its own clients
(the ``openai``, ``anthropic``, ``httpx`` or ``requests`` packages, litellm) are classified by
their class and HTTP status.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from evolve.errors import TRANSIENT, InfraError, LLMError, MissingDependency
from evolve.types import InfraFailure

# packages whose exceptions speak for a model server or the network (not for the agent's logic)
_CLIENT_PACKAGES = frozenset(
    {
        "openai",
        "anthropic",
        "litellm",
        "httpx",
        "httpcore",
        "requests",
        "urllib3",
        "aiohttp",
        "google",
        "groq",
        "mistralai",
        "cohere",
        "ollama",
    }
)
_BY_NAME = {  # exception class name (anywhere in the MRO) -> category, for the packages above
    "RateLimitError": "rate_limit",
    "APITimeoutError": "timeout",
    "Timeout": "timeout",
    "TimeoutException": "timeout",
    "ReadTimeout": "timeout",
    "ConnectTimeout": "timeout",
    "PoolTimeout": "timeout",
    "WriteTimeout": "timeout",
    "GatewayTimeoutError": "timeout",
    "APIConnectionError": "unreachable",
    "ConnectError": "unreachable",
    "ConnectionError": "unreachable",
    "RemoteProtocolError": "unreachable",
    "ReadError": "unreachable",
    "WriteError": "unreachable",
    "NetworkError": "unreachable",
    "ProxyError": "unreachable",
    "ServerDisconnectedError": "unreachable",
    "ClientConnectorError": "unreachable",
    "InternalServerError": "server",
    "ServiceUnavailableError": "server",
    "BadGatewayError": "server",
    "APIResponseValidationError": "server",
    "OverloadedError": "server",
    "AuthenticationError": "auth",
    "PermissionDeniedError": "auth",
    "NotFoundError": "not_found",
    "BudgetExceededError": "config",
    # the request itself was wrong: the agent's own failure
    "BadRequestError": "request",
    "ContextWindowExceededError": "request",
    "ContentPolicyViolationError": "request",
    "UnprocessableEntityError": "request",
    "UnsupportedParamsError": "request",
    "InvalidRequestError": "request",
}
# the connection errors of the standard library (socket-level; not BrokenPipeError, which an agent's
# own subprocess can cause)
_BUILTIN = {
    ConnectionRefusedError: "unreachable",
    ConnectionResetError: "unreachable",
    ConnectionAbortedError: "unreachable",
}
_UNREACHABLE_TEXT = (
    "connection error",
    "connection refused",
    "connecterror",
    "name or service not known",
    "failed to establish a new connection",
    "nodename nor servname",
)
# text that marks a missing or wrong credential whatever the class says
_AUTH_TEXT = (
    "missing credentials",
    "api_key client option must be set",
    "no api key",
    "invalid api key",
    "incorrect api key",
)


def status_of(e: BaseException) -> int | None:
    """The HTTP status an exception carries (``status_code`` on it or on its ``response``)."""
    for obj in (e, getattr(e, "response", None)):
        code = getattr(obj, "status_code", None)
        if isinstance(code, int):
            return code
    return None


def http_category(code: int) -> str:
    """The category of an HTTP error status: 429 rate_limit, 408 timeout, 5xx server, 401/403
    auth, 404 not_found, 409/425 server (a conflict or "too early": worth retrying), other 4xx
    request (the agent's)."""
    if code == 429:
        return "rate_limit"
    if code == 408:
        return "timeout"
    if code >= 500 or code in (409, 425):
        return "server"
    if code in (401, 403):
        return "auth"
    if code == 404:
        return "not_found"
    return "request"


def category_of(e: BaseException, *, client: bool = False) -> str | None:
    """The :data:`~evolve.errors.LLM_CATEGORIES` category of a model-client exception, or None
    when it is not one that a model client or the network raises. With ``client=True`` the
    exception is known to come from a model client (a backend's own call), so its class name and
    status are trusted whatever package defines it, the standard library's ``TimeoutError`` and
    ``ConnectionError`` count too, and anything else is ``"backend"``."""
    if isinstance(e, LLMError):
        return e.category
    text = str(e).lower()
    if any(t in text for t in _AUTH_TEXT):
        return "auth"
    for cls, kind in _BUILTIN.items():
        if isinstance(e, cls):
            return kind
    mro = type(e).__mro__
    if client:
        if isinstance(e, TimeoutError):
            return "timeout"
        if isinstance(e, ConnectionError):
            return "unreachable"
    elif not any((c.__module__ or "").split(".")[0] in _CLIENT_PACKAGES for c in mro):
        return None
    if any(t in text for t in _UNREACHABLE_TEXT):  # litellm reports a refused connection as a server error
        return "unreachable"
    # a class that names its kind wins over the status (litellm reports a timeout as a 500-ish error)
    for c in mro:
        cat = _BY_NAME.get(c.__name__)
        if cat is not None and cat not in ("server", "request"):
            return cat
    code = status_of(e)
    if code is not None:
        return http_category(code)
    for c in mro:
        if c.__name__ in _BY_NAME:
            return _BY_NAME[c.__name__]
    return "backend" if client else None


def classify(e: BaseException, source: str = "agent") -> InfraFailure | None:
    """An :class:`~evolve.types.InfraFailure` when ``e`` is the world failing (see the module
    docstring), None when it is the agent's (or the reward's) own failure."""
    if any(c.__name__ == "SandboxUnavailable" and c.__module__.startswith("evolve.sandbox") for c in type(e).__mro__):
        return InfraFailure(category="sandbox", retryable=False, message=f"{type(e).__name__}: {e}", source=source)
    if isinstance(e, InfraError):  # a world's own environment failed (evolve.worlds.harbor, evolve.worlds.env)
        return InfraFailure(
            category=e.category, retryable=e.retryable, message=" ".join(str(e).split())[:2000], source=source
        )
    if isinstance(e, MissingDependency):
        return InfraFailure(category="config", retryable=False, message=str(e), source=source)
    cat = category_of(e)
    if cat is None or cat == "request":
        return None
    return infra(cat, f"{type(e).__name__}: {e}" if not isinstance(e, LLMError) else str(e), source)


def infra(category: str, message: str, source: str = "agent") -> InfraFailure:
    return InfraFailure(
        category=category,
        retryable=category in TRANSIENT or category == "worker",
        message=" ".join(message.split())[:2000],
        source=source,
    )


def legacy_category(error: str) -> str | None:
    """The world-failure category of an error an evolvekit before 0.2 stored as a score (its model
    errors read ``agent raised LLMError: ... (retryable): APIConnectionError: ...``), or None when it
    was the agent's own. Used once, when such an archive is opened (:mod:`evolve.archive._schema`)."""
    first = (error or "").strip().splitlines()[0] if (error or "").strip() else ""
    if first.startswith("worker process died"):
        return "worker"
    if first.startswith("agent raised ConfigError: model ") and "api_key_env" in first:
        return "config"
    m = re.match(r"agent raised LLMError: .*\((retryable|not retryable)\): (\w+)", first)
    if m is None:
        return None
    if any(t in first.lower() for t in _UNREACHABLE_TEXT):
        return "unreachable"
    cat = _BY_NAME.get(m.group(2))
    if m.group(1) == "retryable":
        return cat if cat in TRANSIENT else "server"
    return cat if cat not in (None, "request") else None


# ----------------------------------------------------------------------------- summaries

_NUM = re.compile(r"\d+(\.\d+)?")


def signature(message: str, width: int = 160) -> str:
    """What failures of one kind share: the first line of the message with numbers written as N,
    so ``agent exploded on val-3`` and ``... on val-7`` count as one kind."""
    first = (message or "").strip().splitlines()[0] if (message or "").strip() else "(no message)"
    first = _NUM.sub("N", first)
    return first if len(first) <= width else first[: width - 1] + "…"


def most_common(messages: Iterable[str], n: int = 3) -> list[tuple[str, int]]:
    """The ``n`` most common failure kinds (grouped by :func:`signature`), each as its first
    message (its first line, cut to 300 characters) with the count of its kind."""
    counts: Counter[str] = Counter()
    first: dict[str, str] = {}
    for m in messages:
        kind = signature(m)
        counts[kind] += 1
        if kind not in first:
            line = (m or "").strip().splitlines()[0] if (m or "").strip() else "(no message)"
            first[kind] = line if len(line) <= 300 else line[:299] + "…"
    return [(first[kind], k) for kind, k in counts.most_common(n)]


def describe_common(messages: Iterable[str]) -> str:
    """``<message> (k times)`` for the most common kind, for one-line messages."""
    msgs = list(messages)
    top = most_common(msgs, 1)
    if not top:
        return "no failure"
    example, k = top[0]
    of = f" of {len(msgs)}" if len(msgs) > k else ""
    return f"{example} ({k}{of} time{'s' if k != 1 or of else ''})"


def failure_of(traj: Any) -> str | None:
    """The failure a stored trajectory records: the agent's error, else its reward's, else None."""
    if traj.error:
        return traj.error
    if traj.reward is not None and traj.reward.error:
        return traj.reward.error
    return None


__all__ = [
    "category_of",
    "classify",
    "describe_common",
    "failure_of",
    "http_category",
    "infra",
    "legacy_category",
    "most_common",
    "signature",
    "status_of",
]
