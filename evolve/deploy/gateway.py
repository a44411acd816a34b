"""Running the gateway from its config: :func:`build` (a config to a :class:`~evolve.gateway.app.Gateway`)
and :class:`GatewayServer` (uvicorn, in the calling thread or on a background thread).

The composition root of ``evolve gateway``: it wires deploy's canary and the run's systems into the
engine's routes, so it stands with deploy, above the HTTP engine (``evolve.gateway``), which knows
nothing of deployments. ``evolve.gateway.GatewayServer`` hands this class on."""

from __future__ import annotations

from typing import Any

from evolve.errors import ConfigError
from evolve.gateway.app import Gateway, HTTPGateway
from evolve.gateway.asgi import is_loopback, need_http
from evolve.gateway.config import GatewayConfig
from evolve.gateway.traces import TraceStore
from evolve.gateway.upstream import LiteLLMUpstream, Route


def build(cfg: GatewayConfig, *, log: Any = None) -> Gateway:
    need_http("evolve gateway", names=("starlette", "uvicorn", "litellm"))
    key = cfg.api_key()
    if not key and not is_loopback(cfg.host):
        raise ConfigError(
            f"evolve gateway: binding to {cfg.host!r} exposes your upstream models beyond this machine "
            "and needs an API key; set api_key_env (--api-key-env VAR, with the key in $VAR), or bind "
            "to 127.0.0.1"
        )
    cfg.check_upstream_keys()
    routes: list[Route] = []
    try:
        for r in cfg.routes:
            if r.local is not None:
                from evolve.gateway.run_route import LocalUpstream

                if r.local.roles is None:
                    up: Any = LocalUpstream(r.local.run, r.local.role, r.local.system, poll=r.local.poll).open()
                else:
                    from evolve.gateway.run_route import RolesUpstream

                    up = RolesUpstream(r.local.run, r.local.roles, r.local.system, poll=r.local.poll).open()
            else:
                u = r.upstream
                assert u is not None  # a route has a local model or an upstream
                up = LiteLLMUpstream(u.model, u.api_base, u.api_key_env, u.timeout, u.max_retries, dict(u.params))
            route = Route(r.name, list(r.match or []), up, r.system, sticky=r.sticky)
            routes.append(route)
            followed = r.local if r.local is not None else r.evolve
            if followed is not None:
                from evolve.deploy.canary import CanaryView

                route.canary = CanaryView(followed.run, poll=followed.poll, route=r.name)
                route.canary.log = log
            if r.evolve is not None:
                from evolve.gateway.apply import Rule, SystemSource

                route.source = SystemSource(r.evolve.run, r.evolve.system, r.evolve.poll).open()
                route.rules = [Rule(x.component, x.how, x.message) for x in r.evolve.apply]
                if r.evolve.recall is not None:
                    from evolve.gateway.apply import RecallRule

                    rc = r.evolve.recall
                    route.recall = RecallRule(rc.message, rc.how, rc.header, rc.format)
                if r.evolve.tools is not None:
                    from evolve.gateway.tools import ServedTools

                    tc = r.evolve.tools
                    route.tools = ServedTools(
                        None if tc.serve == "all" else list(tc.serve),
                        tc.max_rounds,
                        [p.resolve() for p in tc.read_roots],
                        tc.sandbox,
                        dict(tc.limits),
                    )
        gateway = Gateway(
            routes,
            TraceStore(cfg.store),
            api_key=key,
            log=log,
            loopback=is_loopback(cfg.host),
            allow_origins=cfg.allow_origins,
        )
        if cfg.otel is not None:
            from evolve.gateway.otel import SpanExport

            gateway.spans = SpanExport(
                cfg.otel.endpoint, capture_content=cfg.otel.capture_content, service=cfg.otel.service
            )
        return gateway
    except BaseException:
        close_routes(routes)
        raise


def close_routes(routes: list[Route]) -> None:
    for r in routes:
        r.close()


class GatewayServer(HTTPGateway):
    """``with GatewayServer(cfg) as gw: gw.url`` serves on a background thread (``port=0``: a
    free port); :meth:`run` serves in the calling thread until interrupted."""

    def __init__(self, cfg: GatewayConfig, *, log: Any = None) -> None:
        self.cfg = cfg
        super().__init__(build(cfg, log=log), cfg.host, cfg.port, "evolve gateway")


__all__ = ["GatewayServer", "build"]
