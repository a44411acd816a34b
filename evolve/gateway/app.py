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

A call's session is, in this order: the ``/s/<session>/`` path prefix, the ``X-Evolve-Session``
header, the OpenAI body's ``metadata.session_id`` or ``user``, the Anthropic body's
``metadata.user_id``; without any, a call whose conversation continues an earlier call's (its
messages up to the last assistant message are that call's messages and answer) joins that call's
session, and any other call starts a session of its own. Every answer carries
``X-Evolve-Call-Id``, ``X-Evolve-Session`` and ``X-Evolve-System`` headers; the call id is also
the response's ``id``, which feedback may name. A call's recorded ``messages`` are what the model
saw (a route's evolved prompt components applied); ``request`` is the body as the agent sent it.

A call is written to the store before the last byte of its answer is sent, so a call the agent
saw finish is never lost, whatever happens to the gateway after.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from evolve.errors import UserError
from evolve.gateway.asgi import ASGIServer
from evolve.gateway.traces import CallRecord, TraceStore
from evolve.gateway.upstream import Result, Route, StreamAnswer, pick, upstream_error
from evolve.gateway.wire import (
    AnthropicStream,
    GatewayError,
    Request,
    anthropic_message,
    anthropic_request,
    openai_request,
)

MAX_BODY = 32 << 20
_SESSION = re.compile(r"^[A-Za-z0-9_.:@~-]{1,200}$")
SESSION_HEADER = "x-evolve-session"


class Gateway:
    """The gateway's state: its routes, its trace store (None: none kept), its API key (None: none
    asked); ``by_token(token)`` gives the route of a ``/r/<token>/`` path (None: 404)."""

    def __init__(self, routes: list[Route], store: TraceStore | None, *, api_key: str | None = None,
                 log: Any = None, loopback: bool = True, allow_origins: list[str] | tuple[str, ...] = (),
                 by_token: Callable[[str], Route | None] | None = None) -> None:
        if not routes and by_token is None:
            raise UserError("the gateway needs at least one route (an upstream model to send calls to)")
        self.routes, self.store, self.api_key, self.log = routes, store, api_key, log
        self.loopback, self.allow_origins, self.by_token = loopback, tuple(allow_origins), by_token
        self.spans: Any = None  # evolve.gateway.otel.SpanExport: each stored call also sent as a span

    def close(self) -> None:
        """Close the routes (their models, followers), the span export and the trace store."""
        for r in self.routes:
            r.close()
        if self.spans is not None:
            self.spans.close()
            self.spans = None
        if self.store is not None:
            self.store.close()

    # -- the ASGI app ------------------------------------------------------------------------------

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route as HTTPRoute

        routes = []
        for prefix in ("", "/s/{session}", *(["/r/{token}"] if self.by_token is not None else [])):
            routes += [HTTPRoute(prefix + "/v1/chat/completions", self._openai, methods=["POST"]),
                       HTTPRoute(prefix + "/v1/messages", self._anthropic, methods=["POST"]),
                       HTTPRoute(prefix + "/v1/models", self._models, methods=["GET"])]
        if self.store is not None:
            routes.append(HTTPRoute("/v1/feedback", self._feedback, methods=["POST"]))
        routes += [HTTPRoute("/v1/evolve/system", self._system, methods=["GET"]),
                   HTTPRoute("/healthz", self._health, methods=["GET"])]
        return Starlette(routes=routes, exception_handlers={404: self._not_found, 405: self._not_allowed})

    # -- helpers -----------------------------------------------------------------------------------

    @staticmethod
    def _json(status: int, value: Any, headers: dict[str, str] | None = None) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse(value, status_code=status, headers=headers)

    def _error(self, api: str, err: GatewayError) -> Any:
        return self._json(err.status, err.anthropic() if api == "anthropic" else err.openai())

    async def _not_found(self, request: Any, exc: Any) -> Any:
        api = "anthropic" if request.url.path.endswith("/messages") else "openai"
        return self._error(api, GatewayError(404, f"Invalid URL ({request.method} {request.url.path})",
                                             code="not_found"))

    async def _not_allowed(self, request: Any, exc: Any) -> Any:
        api = "anthropic" if request.url.path.endswith("/messages") else "openai"
        return self._error(api, GatewayError(405, f"{request.method} is not allowed on {request.url.path}"))

    def _authorized(self, request: Any) -> bool:
        if not self.api_key:
            return True
        want = self.api_key.encode()
        bearer = request.headers.get("authorization", "")
        given = bearer[7:] if bearer.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        return hmac.compare_digest(given.encode("utf-8", "replace"), want)

    async def _body(self, request: Any) -> Any:
        ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if ctype != "application/json" and not ctype.endswith("+json"):
            raise GatewayError(415, f"the request body must be JSON (Content-Type: application/json), not {ctype!r}")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY:
            raise GatewayError(413, f"the request body is over {MAX_BODY} bytes")
        parts, size = [], 0
        async for part in request.stream():  # a chunked body is bounded too
            size += len(part)
            if size > MAX_BODY:
                raise GatewayError(413, f"the request body is over {MAX_BODY} bytes")
            parts.append(part)
        try:
            return json.loads(b"".join(parts))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
            raise GatewayError(400, f"the request body is not valid JSON: {type(e).__name__}: {str(e)[:200]}") from None

    async def _session(self, request: Any, req: Request, sent: list[dict], call_id: str) -> str:
        for value, where in ((request.path_params.get("session"), "the /s/<session>/ path"),
                             (request.headers.get(SESSION_HEADER), f"the {SESSION_HEADER} header")):
            if value:
                if not _SESSION.match(str(value)):
                    raise GatewayError(400, f"the session id from {where} must be 1-200 characters of letters, "
                                       f"digits and _.:@~-; got {str(value)[:80]!r}")
                return str(value)
        if req.session_hint:  # the body's user / metadata field: any string the API takes is fine
            hint = str(req.session_hint)
            if _SESSION.match(hint):
                return hint
            import hashlib

            return "u-" + hashlib.sha256(hint.encode("utf-8", "replace")).hexdigest()[:32]
        if self.store is None:
            return "default"
        import anyio

        # no session named: a conversation that continues an earlier call's joins its session
        found = await anyio.to_thread.run_sync(self.store.continued_session, sent)
        return found or call_id

    async def _record(self, call: CallRecord) -> None:
        import anyio

        if self.store is None:
            return
        await anyio.to_thread.run_sync(self.store.record, call)
        if self.spans is not None:
            try:
                self.spans.send([call])  # queued: the batch processor sends it off this thread
            except Exception as e:  # noqa: BLE001 - telemetry never fails a call
                if self.log:
                    self.log(f"could not export a span: {type(e).__name__}: {e}")

    def _headers(self, call: CallRecord) -> dict[str, str]:
        return {"x-evolve-call-id": call.id, "x-evolve-session": call.session_id,
                "x-evolve-system": call.system_id or ""}

    # -- endpoints ---------------------------------------------------------------------------------

    async def _health(self, request: Any) -> Any:
        return self._json(200, {"ok": True, "routes": [r.name for r in self.routes]})

    async def _models(self, request: Any) -> Any:
        if not self._authorized(request):
            return self._error("openai", GatewayError(401, "invalid or missing API key", code="invalid_api_key"))
        token = request.path_params.get("token")
        try:
            routes = self.routes if token is None else [self._token_route(token)]
        except GatewayError as e:
            return self._error("openai", e)
        names = list(dict.fromkeys(p for r in routes for p in r.names()))
        return self._json(200, {"object": "list", "data": [{"id": n, "object": "model", "created": 0,
                                                            "owned_by": "evolve-gateway"} for n in names]})

    async def _system(self, request: Any) -> Any:
        """The system a model name's route answers with now: its id and prompt components."""
        if not self._authorized(request):
            return self._error("openai", GatewayError(401, "invalid or missing API key", code="invalid_api_key"))
        model = request.query_params.get("model")
        if not model:
            return self._error("openai", GatewayError(400, "give ?model=<the model name the agent sends>",
                                                      param="model"))
        try:
            route = pick(self.routes, model)
        except GatewayError as e:
            return self._error("openai", e)
        import anyio

        prompts: dict[str, str] = {}
        pinned = None
        session = request.query_params.get("session")
        if session and route.sticky and self.store is not None:  # what this session is served: its own system
            first = await anyio.to_thread.run_sync(self.store.session_first, session)
            if first is not None and first[1] == route.name:
                pinned = first[0]
        sid = pinned or route.current_system()
        if route.source is not None:
            sid, prompts, _ = await anyio.to_thread.run_sync(route.source.resolve, pinned)
        return self._json(200, {"route": route.name, "system_id": sid, "prompts": prompts,
                                "apply": [r.__dict__ for r in route.rules]})

    async def _feedback(self, request: Any) -> Any:
        if not self._authorized(request):
            return self._error("openai", GatewayError(401, "invalid or missing API key", code="invalid_api_key"))
        try:
            self._check_origin(request)
            body = await self._body(request)
            if not isinstance(body, dict):
                raise GatewayError(400, "feedback must be a JSON object: {session_id | call_id, score, components, "
                                   "text, id}")
            unknown = set(body) - {"session_id", "call_id", "score", "components", "text", "id", "source"}
            if unknown:
                raise GatewayError(400, f"unknown feedback field(s) {sorted(unknown)}; known: session_id, call_id, "
                                   "score, components, text, id, source")
            import anyio

            fb, new = await anyio.to_thread.run_sync(lambda: self.store.feedback(**body))  # checks it too
            if new:
                await self._after_feedback()
        except UserError as e:
            return self._error("openai", GatewayError(400, str(e)))
        except GatewayError as e:
            return self._error("openai", e)
        except Exception as e:  # noqa: BLE001 - an answer in the API's shape, whatever broke
            return self._error("openai", GatewayError(500, f"evolve gateway: internal error ({type(e).__name__}: {e})"))
        return self._json(200 if not new else 201, {"id": fb.id, "session_id": fb.session_id, "call_id": fb.call_id,
                                                    "recorded": new})

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
            return self._error(api, e)
        except Exception as e:  # noqa: BLE001 - whatever broke, the agent gets an answer in its API's shape
            if self.log:
                self.log(f"internal error on {request.url.path}: {type(e).__name__}: {e}")
            return self._error(api, GatewayError(500, f"evolve gateway: internal error ({type(e).__name__}: {e})",
                                                 code="internal_error"))

    async def _chat_checked(self, request: Any, api: str) -> Any:
        import anyio

        t0, wall = time.perf_counter(), time.time()  # a call's time and latency both start here
        if not self._authorized(request):
            raise GatewayError(401, "invalid or missing API key: send 'Authorization: Bearer <key>' or "
                               "'x-api-key: <key>'", code="invalid_api_key")
        self._check_origin(request)
        body = await self._body(request)
        req = openai_request(body) if api == "openai" else anthropic_request(body)
        token = request.path_params.get("token")
        route = pick(self.routes, req.model) if token is None else self._token_route(token)
        sent = req.messages  # as the agent sent them: sessions are found by these, whatever system answers
        call_id = ("chatcmpl-" if api == "openai" else "msg_") + secrets.token_hex(12)
        session = req.session = await self._session(request, req, sent, call_id)
        pinned, new = None, True
        if route.sticky and self.store is not None and (route.source is not None
                                                        or hasattr(route.upstream, "system_id")):
            # a session stays with the system that answered its first call on this route: a promotion
            # serves new sessions
            first = await anyio.to_thread.run_sync(self.store.session_first, session)
            if first is not None and first[1] == route.name:
                pinned, new = first[0], False
        if route.canary is not None:  # the run's deployment: a canary's share of new sessions, rolled-back systems
            to_candidate, blocked = await anyio.to_thread.run_sync(route.canary.split, session if new else None,
                                                                   self.store)
            if pinned in blocked:
                pinned = None
            if to_candidate is not None:
                pinned = to_candidate
        applied: list[str] = []
        recalled: list[str] = []
        system_id = pinned or route.current_system()
        if route.source is not None:
            from evolve.gateway.apply import apply_recall, apply_rules

            system_id, prompts, memory = await anyio.to_thread.run_sync(route.source.resolve, pinned)
            req.messages, applied = apply_rules(req.messages, route.rules, prompts)
            if route.recall is not None:
                try:
                    req.messages, recalled = await anyio.to_thread.run_sync(
                        lambda: apply_recall(req.messages, memory, route.recall, sent))
                except Exception as e:  # noqa: BLE001 - memory that cannot be read never fails the call
                    recalled = []
                    if self.log:
                        self.log(f"recall failed on route {route.name} ({type(e).__name__}: {e}); answered without")
        served: dict[str, Any] = {}
        if route.tools is not None and route.source is not None:  # the system's own tools, run here
            system = await anyio.to_thread.run_sync(route.source.get, system_id)
            served = route.tools.offered(system, req.tools)
            if served:
                req.params["tools"] = [*(req.tools or []), *(route.tools.schema(t) for t in served.values())]
        if hasattr(route.upstream, "system_id"):  # a local route answers with the session's own system
            req.system = pinned
        call = CallRecord(session_id=session, api=api, messages=req.messages, model=req.model, route=route.name,
                          upstream_model=route.upstream.target(req.model), stream=req.stream, tools=req.tools,
                          params={k: v for k, v in req.params.items() if k != "tools"}, request=body,
                          system_id=system_id, id=call_id, ts=wall)
        if route.source is not None:
            call.params["evolve_applied"] = applied
            if route.recall is not None:
                call.params["memory_recalled"] = recalled
        if served:
            return await self._tool_rounds(api, req, route, call, t0, sent, served)
        if req.stream:
            chunks = route.upstream.stream(req)
            try:  # the first chunk before the answer starts: an upstream that fails gets its own status
                first = await chunks.__anext__()
            except StopAsyncIteration:
                first = None
            except GatewayError as e:
                await self._failed(call, e, t0)
                raise
            except Exception as e:  # noqa: BLE001
                err = upstream_error(e, route.upstream.describe())
                await self._failed(call, err, t0)
                raise err from None
            return self._streamed(api, req, route, call, t0, sent, first, chunks)
        try:
            res = await route.upstream.complete(req)
        except GatewayError as e:
            await self._failed(call, e, t0)
            raise
        self._fill(call, res, t0, sent)
        return await self._answer(api, req, call, res)

    async def _answer(self, api: str, req: Request, call: CallRecord, res: Result) -> Any:
        """A whole answer in the agent's API, recorded before it is sent."""
        if api == "openai":
            out = dict(res.raw)
            out["id"], out["model"] = call.id, req.model
            out["system_fingerprint"] = call.system_id
            choices = [dict(c) for c in out.get("choices") or []]
            if choices:  # the tool calls the client sees are the ones recorded, with their ids
                msg = {k: v for k, v in (choices[0].get("message") or {}).items() if k != "tool_calls"}
                if res.tool_calls:
                    msg["tool_calls"] = res.tool_calls
                choices[0] = {**choices[0], "message": msg, "finish_reason": res.finish_reason}
                out["choices"] = choices
        else:
            out = anthropic_message(call.id, req.model, res.text, res.tool_calls, res.finish_reason,
                                    res.prompt_tokens, res.completion_tokens)
        call.response = out
        await self._record(call)
        return self._json(200, out, self._headers(call))

    async def _tool_rounds(self, api: str, req: Request, route: Route, call: CallRecord, t0: float,
                           sent: list[dict], served: dict[str, Any]) -> Any:
        """Answer a request whose model may call the system's served tools (see
        :mod:`evolve.gateway.tools`): each round a model call recorded in the session; the served
        tools run in the sandbox; the last round offers only the agent's tools."""
        import anyio

        from evolve.gateway.tools import served_calls

        tools, stream, req.stream = route.tools, req.stream, False
        agent_tools = [t for t in req.tools or [] if (t.get("function") or {}).get("name") not in served]
        for n in range(tools.max_rounds):
            if n == tools.max_rounds - 1:  # the model must answer now: none of the served tools on offer
                req.params = {k: v for k, v in req.params.items() if k not in ("tools", "tool_choice")
                              or agent_tools}
                if agent_tools:
                    req.params["tools"] = agent_tools
            try:
                res = await route.upstream.complete(req)
            except GatewayError as e:
                await self._failed(call, e, t0)
                raise
            ours, theirs = served_calls(res.tool_calls, served)
            if ours and (theirs or n == tools.max_rounds - 1):  # the agent sees only what it can run
                call.params["gateway_tools_dropped"] = [c["function"]["name"] for c in ours]
                res.tool_calls, ours = theirs or None, []
                if not theirs and res.finish_reason == "tool_calls":
                    res.finish_reason = "stop"
            self._fill(call, res, t0, sent)
            if not ours:
                break
            results = []
            for c in ours:
                results.append(await anyio.to_thread.run_sync(tools.run, served[c["function"]["name"]], c))
            call.params["gateway_tools"] = [c["function"]["name"] for c in ours]
            call.response = {"text": res.text, "tool_calls": res.tool_calls, "finish_reason": res.finish_reason,
                             "gateway_round": n}
            await self._record(call)
            req.messages = [*req.messages, {"role": "assistant", "content": res.text, "tool_calls": ours},
                            *({"role": "tool", "tool_call_id": c["id"], "content": r} for c, r in zip(ours, results))]
            t0 = time.perf_counter()
            call = CallRecord(session_id=call.session_id, api=api, messages=req.messages, model=req.model,
                              route=route.name, upstream_model=call.upstream_model, stream=stream, tools=req.tools,
                              params={k: v for k, v in call.params.items() if k not in ("gateway_tools", "served_by")},
                              request=call.request, system_id=call.system_id,
                              id=("chatcmpl-" if api == "openai" else "msg_") + secrets.token_hex(12), ts=time.time())
        if not stream:
            return await self._answer(api, req, call, res)
        call.response = {"streamed": True, "text": res.text, "tool_calls": res.tool_calls,
                         "finish_reason": res.finish_reason}
        await self._record(call)
        return self._replayed(api, req, call, res)

    def _replayed(self, api: str, req: Request, call: CallRecord, res: Result) -> Any:
        """A whole answer sent as the stream the agent asked for."""
        from starlette.responses import StreamingResponse

        async def events() -> AsyncIterator[str]:
            if api == "anthropic":
                a = AnthropicStream(call.id, req.model)
                yield a.start(res.prompt_tokens)
                if res.text:
                    yield a.text(res.text)
                for c in res.tool_calls or []:
                    yield a.tool_block(c)
                yield a.finish(res.finish_reason, res.completion_tokens, res.prompt_tokens)
                return
            base = {"id": call.id, "object": "chat.completion.chunk", "created": int(call.ts), "model": req.model,
                    "system_fingerprint": call.system_id}
            delta: dict[str, Any] = {"role": "assistant", "content": res.text or ""}
            if res.tool_calls:
                delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(res.tool_calls)]
            for chunk in ({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                          {"choices": [{"index": 0, "delta": {}, "finish_reason": res.finish_reason}]}):
                yield f"data: {json.dumps({**base, **chunk}, ensure_ascii=False)}\n\n"
            if req.include_usage:
                usage = {"prompt_tokens": res.prompt_tokens or 0, "completion_tokens": res.completion_tokens or 0,
                         "total_tokens": (res.prompt_tokens or 0) + (res.completion_tokens or 0)}
                yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={
            **self._headers(call), "cache-control": "no-cache"})

    def _token_route(self, token: str) -> Route:
        route = self.by_token(token) if self.by_token is not None else None
        if route is None:
            raise GatewayError(404, "no such endpoint: its rollout has ended (or the URL is wrong)", code="not_found")
        return route

    def _check_origin(self, request: Any) -> None:
        """A web page must not drive a gateway on this machine: requests from a browser (an Origin
        header) are refused unless allowed, and on loopback the Host must name loopback (DNS rebinding)."""
        origin = request.headers.get("origin")
        if origin and origin not in self.allow_origins:
            raise GatewayError(403, f"requests from web pages are refused (Origin {origin!r}); list the origin in "
                               "the gateway's allow_origins to permit it", code="origin_not_allowed")
        if self.loopback:
            host = (request.headers.get("host") or "").rsplit(":", 1)[0].strip("[]").lower()
            if host and host not in ("localhost", "127.0.0.1", "::1") and not host.startswith("127."):
                raise GatewayError(403, f"Host {host!r} is not this machine's loopback; the gateway is bound to "
                                   "loopback", code="host_not_allowed")

    async def _failed(self, call: CallRecord, err: GatewayError, t0: float) -> None:
        call.status, call.error, call.latency_s = "error", f"{err.status}: {err.message}", time.perf_counter() - t0
        try:
            await self._record(call)
        except Exception as e:  # noqa: BLE001 - the error answer matters more than its record
            if self.log:
                self.log(f"could not record a failed call: {e}")

    @staticmethod
    def _fill(call: CallRecord, res: Result, t0: float, sent: list[dict]) -> None:
        from evolve.gateway.traces import answer_message, chain_key

        for c in res.tool_calls or []:
            if not c.get("id"):
                c["id"] = "call_" + secrets.token_hex(12)
        call.output, call.tool_calls, call.finish_reason = res.text, res.tool_calls, res.finish_reason
        call.prompt_tokens, call.completion_tokens, call.cost = res.prompt_tokens, res.completion_tokens, res.cost
        call.token_ids, call.prompt_token_ids, call.logprobs = res.token_ids, res.prompt_token_ids, res.logprobs
        call.upstream_model = res.model or call.upstream_model
        call.system_id = res.system_id or call.system_id
        if res.served is not None:
            call.params["served_by"] = res.served
        call.latency_s = time.perf_counter() - t0
        call.chain_key = chain_key([*sent, answer_message(call)])

    def _streamed(self, api: str, req: Request, route: Route, call: CallRecord, t0: float, sent: list[dict],
                  first: Any, chunks: Any) -> Any:
        import anyio
        from starlette.responses import StreamingResponse

        async def upstream_chunks() -> AsyncIterator[Any]:
            if first is None:
                return
            yield first
            async for chunk in chunks:
                yield chunk

        async def events() -> AsyncIterator[str]:
            answer, whole = StreamAnswer(), None
            astream = AnthropicStream(call.id, req.model) if api == "anthropic" else None
            if astream is not None:
                yield astream.start()
            recorded = False
            try:
                async for chunk in upstream_chunks():
                    if isinstance(chunk, Result):  # a local route's whole answer, for the record
                        whole = chunk
                        continue
                    piece = answer.add(chunk)
                    if astream is not None:
                        if piece:
                            yield astream.text(piece)
                        continue
                    if not chunk.get("choices") and chunk.get("usage") and not req.include_usage:
                        continue
                    out = {**chunk, "id": call.id, "model": req.model, "system_fingerprint": call.system_id}
                    out.setdefault("object", "chat.completion.chunk")
                    if not req.include_usage:
                        out.pop("usage", None)
                    yield f"data: {json.dumps(out, ensure_ascii=False)}\n\n"
                res = whole or answer.result()
                self._fill(call, res, t0, sent)
                if res.finish_reason is None:
                    call.status, call.error = "error", "the upstream's stream ended without a finish reason"
                call.response = {"streamed": True, "text": res.text, "tool_calls": res.tool_calls,
                                 "finish_reason": res.finish_reason, "usage": answer.usage or None}
                await self._record(call)  # before the stream's last event: a finished call is a stored call
                recorded = True
                if astream is not None:
                    for c in res.tool_calls or []:  # whole: the id and name are known, the input is valid JSON
                        yield astream.tool_block(c)
                    yield astream.finish(res.finish_reason, res.completion_tokens, res.prompt_tokens)
                else:
                    yield "data: [DONE]\n\n"
            except Exception as e:  # noqa: BLE001 - never leave a stream hanging without an error event
                err = e if isinstance(e, GatewayError) else upstream_error(e, route.upstream.describe())
                if not recorded:
                    await self._failed(call, err, t0)
                yield astream.error(err) if astream is not None else f"data: {json.dumps(err.openai())}\n\n"
            except BaseException:  # the client went away (cancelled): the call is recorded as such
                if not recorded:
                    with anyio.CancelScope(shield=True):
                        await self._failed(call, GatewayError(499, "the client closed the stream before its end"), t0)
                raise

        return StreamingResponse(events(), media_type="text/event-stream", headers={
            **self._headers(call), "cache-control": "no-cache"})


class HTTPGateway(ASGIServer):
    """A :class:`Gateway` answering HTTP under uvicorn (:meth:`start` on a background thread,
    :meth:`run` in the calling thread); :attr:`url` is the OpenAI base URL (``.../v1``), :attr:`base`
    the Anthropic one. Closing it closes the gateway (``on_close`` to do otherwise)."""

    def __init__(self, gateway: Gateway, host: str = "127.0.0.1", port: int = 0, what: str = "evolve gateway",
                 on_close: Callable[[], None] | None = None) -> None:
        self.gateway = gateway
        super().__init__(gateway.app(), host, port, what, on_close or gateway.close)

    @property
    def url(self) -> str:
        """The OpenAI base URL (``.../v1``); Anthropic clients take :attr:`base`."""
        return self.base + "/v1"


__all__ = ["Gateway", "HTTPGateway", "SESSION_HEADER"]
