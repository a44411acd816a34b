"""``evolve.serve``: where the serving names have always been imported from. The one server is the
gateway's (:mod:`evolve.gateway`): ``evolve serve RUN_DIR`` is the gateway with one local route on
the run (:class:`ServeApp`), :func:`serve_llm` puts one LLM object behind it, and each rollout's own
endpoint is a route of it (:mod:`evolve.gateway.rollout_route`)."""

from evolve.gateway.asgi import check_bind
from evolve.gateway.local import serve_llm
from evolve.gateway.run_route import ServeApp

__all__ = ["ServeApp", "check_bind", "serve_llm"]
