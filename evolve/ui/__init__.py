"""``evolve ui``: a local dashboard of runs, their lineage and trajectories, and live traffic.

Read-only over archives and trace stores, live while a run writes (the page polls a version
that changes when the run does). The folder:

* :mod:`~evolve.ui.run` — one run read-only and cached: status, budgets, per-generation curves,
  the lineage; :mod:`~evolve.ui.lineage` — which systems to draw and where;
* :mod:`~evolve.ui.system` — one system: diff to its parent, the decision and its evidence,
  scores, per-task wins and losses; rollouts and the trajectory viewer; comparing two systems;
* :mod:`~evolve.ui.layers` — memory items and versions, the tool library and sandbox verdicts,
  workflow graphs; :mod:`~evolve.ui.tokens` — sampled tokens' text for colouring by log-prob;
* :mod:`~evolve.ui.traffic` — a gateway's trace store, and a run's deployment and canary;
* :mod:`~evolve.ui.app` — the JSON API and its guards (loopback, token, CSP); ``static/`` — the
  page (ES modules, Plotly from the ``plotly`` wheel); :mod:`~evolve.ui.cli` — the command.

    from evolve.ui import serve
    with serve(["runs/"]) as server:      # a background thread, a free port
        print(server.base)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def serve(paths: Sequence[str | Path], *, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> Any:
    """An :class:`~evolve.gateway.asgi.ASGIServer` for the dashboard over ``paths`` (run directories,
    folders of them, trace store folders); start it with ``with`` or ``.start()``, or ``.run()``
    in the calling thread. Beyond loopback a ``token`` is required."""
    from evolve.errors import ConfigError
    from evolve.gateway.asgi import ASGIServer, is_loopback
    from evolve.ui.app import Sources, build_app, plotly_js

    _check_installed()
    plotly_js()
    from evolve.gateway.asgi import refuse_blank

    refuse_blank(token, "evolve ui: the token")
    loopback = is_loopback(host)
    if not loopback and not token:
        raise ConfigError(
            f"evolve ui: binding to {host!r} shows your runs beyond this machine and needs a token "
            "(--token-env VAR); or bind to 127.0.0.1"
        )
    sources = Sources([Path(p) for p in paths])
    hosts = ["127.0.0.1", "localhost", "[::1]", "::1", host.strip("[]"), host] if loopback else ["*"]
    return ASGIServer(build_app(sources, token=token, hosts=hosts), host, port, "evolve ui", sources.close)


def _check_installed() -> None:
    from evolve.errors import MissingDependency

    for name in ("starlette", "uvicorn"):
        try:
            __import__(name)
        except ImportError:
            raise MissingDependency(
                f"evolve ui needs the Python package {name!r}, which is not installed; "
                "install it with: pip install 'evolvekit[ui]'"
            ) from None


__all__ = ["serve"]
