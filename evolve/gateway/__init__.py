"""``evolve gateway``: a standing OpenAI- and Anthropic-compatible endpoint in front of an agent's
real model, so an unmodified agent's traffic is recorded, and can be learnt from.

* ``wire`` — the two APIs (OpenAI chat completions, Anthropic Messages) checked and translated to
  the one format the gateway works in, errors in each API's shape;
* ``upstream`` — what answers a route: a model through litellm (hosted, or the user's own
  OpenAI-compatible server); routes by model name;
* ``traces`` — the trace store: calls in sessions, feedback, in one append-only SQLite file;
* ``app`` — the HTTP endpoints (starlette), with ``surface`` (who may call, the body read, JSON
  answers); a chat call's session is found by ``sessions``, the system that answers it chosen by
  ``assign`` (a session's first system, a canary's share) and applied by ``apply``; ``exchange``
  answers and records it;
* ``config`` — ``gateway.yaml``; ``server`` — running it under uvicorn.

Needs the ``gateway`` extra (starlette, uvicorn, litellm); ``import evolve`` loads none of it.
See docs/gateway.md.

    from evolve.gateway import GatewayServer, TraceStore
    from evolve.gateway.config import from_flags
    with GatewayServer(from_flags(upstream="openai/*", api_base=URL, ...)) as gw:
        OpenAI(base_url=gw.url, api_key="unused").chat.completions.create(...)
"""

from __future__ import annotations

from typing import Any

# The package's face hands names on, lazily (as ``evolve/__init__.py`` does): GatewayServer is the composition root
# of ``evolve gateway`` (a config to routes, with deploy's canary), which stands above this engine in evolve.deploy.
_EXPORTS = {
    "GatewayServer": "evolve.deploy.gateway",
    "TraceStore": "traces",
    "CallRecord": "traces",
    "Feedback": "traces",
    "GatewayConfig": "config",
    "load_config": "config",
    "Gateway": "app",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        module = _EXPORTS[name]
        return getattr(importlib.import_module(module if "." in module else f"evolve.gateway.{module}"), name)
    raise AttributeError(f"module 'evolve.gateway' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)  # noqa: PLE0605 - the lazy table above is the one list
