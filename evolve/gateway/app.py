"""The gateway's HTTP app (starlette, served by uvicorn): OpenAI and Anthropic endpoints in front
of the routes, every call recorded in the trace store, feedback taken at any later time.

Paths (the first three also under ``/s/<session>/``, which names the session)::

    POST /v1/chat/completions     OpenAI chat completions (stream, tools)
    POST /v1/messages             Anthropic Messages (stream, tools)
    GET  /v1/models               the routes' model names
    GET  /v1/evolve/system        ?model=NAME[&session=ID]: the system that answers, its prompts
    POST /v1/feedback             {session_id | call_id, score, components, text, id} (with a trace store)
    GET  /healthz

A gateway given ``by_token`` also answers the first three under ``/r/<token>/``: the route that
token names (a rollout's own model, :mod:`evolve.gateway.rollout_route`), whatever the model name.
A gateway without a trace store (``store=None``: ``evolve serve``, the rollouts' endpoint) records
nothing itself (its routes record their calls where they belong) and puts a call that names no
session in session ``default``.

A chat call is answered in four steps, each in its own module: this one checks who calls and reads
the request; :mod:`~evolve.gateway.sessions` finds its session (the ``/s/<session>/`` path, the
``X-Evolve-Session`` header, the body's user or metadata, else the conversation it continues);
:mod:`~evolve.gateway.assign` decides which system answers (a session's first, a canary's share);
:mod:`~evolve.gateway.apply` makes the request that system's and :mod:`~evolve.gateway.exchange`
answers and records it. Every answer carries
``X-Evolve-Call-Id``, ``X-Evolve-Session`` and ``X-Evolve-System`` headers; the call id is also
the response's ``id``, which feedback may name. A call's recorded ``messages`` are what the model
saw (a route's evolved prompt components applied); ``request`` is the body as the agent sent it.

A call is written to the store before the last byte of its answer is sent, so a call the agent
saw finish is never lost, whatever happens to the gateway after.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from evolve.errors import UserError
from evolve.gateway.apply import apply_system
from evolve.gateway.asgi import ASGIServer
from evolve.gateway.assign import assigned_system, first_system
from evolve.gateway.exchange import Exchange, Recorder, call_record
from evolve.gateway.sessions import SESSION_HEADER, new_call_id, session_of
from evolve.gateway.surface import authorized, check_origin, error_response, json_response, read_json
from evolve.gateway.traces import TraceStore
from evolve.gateway.upstream import Route, pick
from evolve.gateway.wire import GatewayError, anthropic_request, openai_request

_NO_KEY = "invalid or missing API key"


class Gateway:
    """The gateway's state: its routes, its trace store (None: none kept), its API key (None: none
    asked); ``by_token(token)`` gives the route of a ``/r/<token>/`` path (None: 404)."""

    def __init__(
        self,
        routes: list[Route],
        store: TraceStore | None,
        *,
        api_key: str | None = None,
        log: Any = None,
        loopback: bool = True,
        allow_origins: list[str] | tuple[str, ...] = (),
        by_token: Callable[[str], Route | None] | None = None,
    ) -> None:
        if not routes and by_token is None:
            raise UserError("the gateway needs at least one route (an upstream model to send calls to)")
        self.routes, self.store, self.api_key, self.log = routes, store, api_key, log
        self.loopback, self.allow_origins, self.by_token = loopback, tuple(allow_origins), by_token
        self.recorder = Recorder(store, log)

    @property
    def spans(self) -> Any:
        """The span export (:class:`evolve.gateway.otel.SpanExport`): each stored call also sent as a span."""
        return self.recorder.spans

    @spans.setter
    def spans(self, value: Any) -> None:
        self.recorder.spans = value

    def close(self) -> None:
        """Close the routes (their models, followers), the span export and the trace store."""
        for r in self.routes:
            r.close()
        if self.spans is not None:
            self.spans.close()
            self.spans = None
        if self.store is not None:
            self.store.close()

    def app(self) -> Any:
        """The ASGI app (starlette)."""
        from starlette.applications import Starlette
        from starlette.routing import Route as HTTPRoute

        routes = []
        for prefix in ("", "/s/{session}", *(["/r/{token}"] if self.by_token is not None else [])):
            routes += [
                HTTPRoute(prefix + "/v1/chat/completions", self._openai, methods=["POST"]),
                HTTPRoute(prefix + "/v1/messages", self._anthropic, methods=["POST"]),
                HTTPRoute(prefix + "/v1/models", self._models, methods=["GET"]),
            ]
        if self.store is not None:
            routes.append(HTTPRoute("/v1/feedback", self._feedback, methods=["POST"]))
        routes += [
            HTTPRoute("/v1/evolve/system", self._system, methods=["GET"]),
            HTTPRoute("/healthz", self._health, methods=["GET"]),
        ]
        return Starlette(routes=routes, exception_handlers={404: self._not_found, 405: self._not_allowed})

    # -- what every endpoint checks ----------------------------------------------------------------

    async def _not_found(self, request: Any, exc: Any) -> Any:
        api = "anthropic" if request.url.path.endswith("/messages") else "openai"
        return error_response(
            api, GatewayError(404, f"Invalid URL ({request.method} {request.url.path})", code="not_found")
        )

    async def _not_allowed(self, request: Any, exc: Any) -> Any:
        api = "anthropic" if request.url.path.endswith("/messages") else "openai"
        return error_response(api, GatewayError(405, f"{request.method} is not allowed on {request.url.path}"))

    def _authorized(self, request: Any) -> bool:
        return authorized(request, self.api_key)

    def _check_origin(self, request: Any) -> None:
        check_origin(request, self.allow_origins, self.loopback)

    def _token_route(self, token: str) -> Route:
        route = self.by_token(token) if self.by_token is not None else None
        if route is None:
            raise GatewayError(404, "no such endpoint: its rollout has ended (or the URL is wrong)", code="not_found")
        return route

    # -- endpoints ---------------------------------------------------------------------------------

    async def _health(self, request: Any) -> Any:
        return json_response(200, {"ok": True, "routes": [r.name for r in self.routes]})

    async def _models(self, request: Any) -> Any:
        if not self._authorized(request):
            return error_response("openai", GatewayError(401, _NO_KEY, code="invalid_api_key"))
        token = request.path_params.get("token")
        try:
            routes = self.routes if token is None else [self._token_route(token)]
        except GatewayError as e:
            return error_response("openai", e)
        names = list(dict.fromkeys(p for r in routes for p in r.names()))
        return json_response(
            200,
            {
                "object": "list",
                "data": [{"id": n, "object": "model", "created": 0, "owned_by": "evolve-gateway"} for n in names],
            },
        )

    async def _system(self, request: Any) -> Any:
        """The system a model name's route answers with now: its id and prompt components."""
        if not self._authorized(request):
            return error_response("openai", GatewayError(401, _NO_KEY, code="invalid_api_key"))
        model = request.query_params.get("model")
        if not model:
            return error_response(
                "openai", GatewayError(400, "give ?model=<the model name the agent sends>", param="model")
            )
        try:
            route = pick(self.routes, model)
        except GatewayError as e:
            return error_response("openai", e)
        import anyio

        prompts: dict[str, str] = {}
        pinned = None
        session = request.query_params.get("session")
        if session and route.sticky and self.store is not None:  # what this session is served: its own system
            pinned, _ = await first_system(route, session, self.store)
        sid = pinned or route.current_system()
        if route.source is not None:
            sid, prompts, _ = await anyio.to_thread.run_sync(route.source.resolve, pinned)
        return json_response(
            200, {"route": route.name, "system_id": sid, "prompts": prompts, "apply": [r.__dict__ for r in route.rules]}
        )

    async def _feedback(self, request: Any) -> Any:
        if not self._authorized(request):
            return error_response("openai", GatewayError(401, _NO_KEY, code="invalid_api_key"))
        try:
            self._check_origin(request)
            body = await read_json(request)
            if not isinstance(body, dict):
                raise GatewayError(
                    400, "feedback must be a JSON object: {session_id | call_id, score, components, text, id}"
                )
            unknown = set(body) - {"session_id", "call_id", "score", "components", "text", "id", "source"}
            if unknown:
                raise GatewayError(
                    400,
                    f"unknown feedback field(s) {sorted(unknown)}; known: session_id, call_id, "
                    "score, components, text, id, source",
                )
            import anyio

            store = self.store
            assert store is not None  # the endpoint is routed only on a gateway with a store
            fb, new = await anyio.to_thread.run_sync(lambda: store.feedback(**body))  # checks it too
            if new:
                await self._after_feedback()
        except UserError as e:
            return error_response("openai", GatewayError(400, str(e)))
        except GatewayError as e:
            return error_response("openai", e)
        except Exception as e:  # noqa: BLE001 - an answer in the API's shape, whatever broke
            return error_response(
                "openai", GatewayError(500, f"evolve gateway: internal error ({type(e).__name__}: {e})")
            )
        return json_response(
            200 if not new else 201, {"id": fb.id, "session_id": fb.session_id, "call_id": fb.call_id, "recorded": new}
        )

    async def _after_feedback(self) -> None:
        """A canary under way is tested on the new feedback (its decision acts at once)."""
        import anyio

        for route in self.routes:
            if route.canary is None:
                continue
            try:
                await anyio.to_thread.run_sync(route.canary.check, self.store)
            except Exception as e:  # noqa: BLE001 - feedback is recorded whatever the test does
                if self.log:
                    self.log(f"canary check on route {route.name} failed: {type(e).__name__}: {e}")

    async def _openai(self, request: Any) -> Any:
        return await self._chat(request, "openai")

    async def _anthropic(self, request: Any) -> Any:
        return await self._chat(request, "anthropic")

    async def _chat(self, request: Any, api: str) -> Any:
        try:
            return await self._chat_checked(request, api)
        except GatewayError as e:
            return error_response(api, e)
        except Exception as e:  # noqa: BLE001 - whatever broke, the agent gets an answer in its API's shape
            if self.log:
                self.log(f"internal error on {request.url.path}: {type(e).__name__}: {e}")
            return error_response(
                api,
                GatewayError(500, f"evolve gateway: internal error ({type(e).__name__}: {e})", code="internal_error"),
            )

    async def _chat_checked(self, request: Any, api: str) -> Any:
        """A chat call: who calls and what they ask; which session; which system answers; the answer."""
        t0, wall = time.perf_counter(), time.time()  # a call's time and latency both start here
        if not self._authorized(request):
            raise GatewayError(
                401, f"{_NO_KEY}: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'", code="invalid_api_key"
            )
        self._check_origin(request)
        body = await read_json(request)
        req = openai_request(body) if api == "openai" else anthropic_request(body)
        token = request.path_params.get("token")
        route = pick(self.routes, req.model) if token is None else self._token_route(token)
        sent = req.messages  # as the agent sent them: sessions are found by these, whatever system answers
        call_id = new_call_id(api)
        session = req.session = await session_of(request, req, self.store, call_id)
        pinned = await assigned_system(route, session, self.store)
        applied = await apply_system(route, req, pinned, sent, self.log)
        call = call_record(api, req, route, body, applied, session=session, call_id=call_id, ts=wall)
        return await Exchange(api, req, route, call, t0, sent, self.recorder).respond(applied.tools)


class HTTPGateway(ASGIServer):
    """A :class:`Gateway` answering HTTP under uvicorn (:meth:`start` on a background thread,
    :meth:`run` in the calling thread); :attr:`url` is the OpenAI base URL (``.../v1``), :attr:`base`
    the Anthropic one. Closing it closes the gateway (``on_close`` to do otherwise)."""

    def __init__(
        self,
        gateway: Gateway,
        host: str = "127.0.0.1",
        port: int = 0,
        what: str = "evolve gateway",
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.gateway = gateway
        super().__init__(gateway.app(), host, port, what, on_close or gateway.close)

    @property
    def url(self) -> str:
        """The OpenAI base URL (``.../v1``); Anthropic clients take :attr:`base`."""
        return self.base + "/v1"


__all__ = ["Gateway", "HTTPGateway", "SESSION_HEADER"]
