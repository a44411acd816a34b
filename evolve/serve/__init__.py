"""Deprecated: ``evolve.serve`` re-exports the serving names from where they live now, the gateway
(:mod:`evolve.gateway`): :class:`~evolve.gateway.run_route.ServeApp` (``evolve serve RUN_DIR`` is the
gateway with one local route on the run), :func:`~evolve.gateway.local.serve_llm` (one LLM object
behind an OpenAI-compatible server) and :func:`~evolve.gateway.asgi.check_bind`. Import them from
those modules; this package warns and will be removed."""

import warnings

from evolve.gateway.asgi import check_bind
from evolve.gateway.local import serve_llm
from evolve.gateway.run_route import ServeApp

warnings.warn(
    "evolve.serve is deprecated: import ServeApp from evolve.gateway.run_route, serve_llm from "
    "evolve.gateway.local and check_bind from evolve.gateway.asgi",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["ServeApp", "check_bind", "serve_llm"]
