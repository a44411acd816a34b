"""The gateway's HTTP app (starlette, served by uvicorn): OpenAI and Anthropic endpoints in front
of the routes, every call recorded in the trace store, feedback taken at any later time.

Paths (each also under ``/s/<session>/``, which names the session)::

    POST /v1/chat/completions     OpenAI chat completions (stream, tools)
    POST /v1/messages             Anthropic Messages (stream, tools)
    GET  /v1/models               the routes' model names
    GET  /v1/evolve/system        ?model=NAME: the system that route answers with, its prompts
    POST /v1/feedback             {session_id | call_id, score, components, text, id}
    GET  /healthz

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
from collections.abc import AsyncIterator
from typing import Any

from evolve.errors import UserError
from evolve.gateway.traces import CallRecord, TraceStore, check_feedback
from evolve.gateway.upstream import Result, Route, pick, upstream_error
from evolve.gateway.wire import (
    AnthropicStream,
    GatewayError,
    Request,
    anthropic_message,
    anthropic_request,
    message_id,
    openai_request,
)

MAX_BODY = 32 << 20
_SESSION = re.compile(r"^[A-Za-z0-9_.:@~-]{1,200}$")
SESSION_HEADER = "x-evolve-session"


class Gateway:
    """The gateway's state: its routes, its trace store, its API key (None: none asked)."""

    def __init__(self, routes: list[Route], store: TraceStore, *, api_key: str | None = None,
                 log: Any = None) -> None:
        if not routes:
            raise UserError("the gateway needs at least one route (an upstream model to send calls to)")
        self.routes, self.store, self.api_key, self.log = routes, store, api_key, log

    # -- the ASGI app ------------------------------------------------------------------------------

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route as HTTPRoute

        routes = []
        for prefix in ("", "/s/{session}"):
            routes += [HTTPRoute(prefix + "/v1/chat/completions", self._openai, methods=["POST"]),
                       HTTPRoute(prefix + "/v1/messages", self._anthropic, methods=["POST"]),
                       HTTPRoute(prefix + "/v1/models", self._models, methods=["GET"])]
        routes += [HTTPRoute("/v1/feedback", self._feedback, methods=["POST"]),
                   HTTPRoute("/v1/evolve/system", self._system, methods=["GET"]),
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
        return self._error("openai", GatewayError(405, f"{request.method} is not allowed on {request.url.path}"))

    def _authorized(self, request: Any) -> bool:
        if not self.api_key:
            return True
        want = self.api_key.encode()
        bearer = request.headers.get("authorization", "")
        given = bearer[7:] if bearer.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        return hmac.compare_digest(given.encode("utf-8", "replace"), want)

    async def _body(self, request: Any) -> Any:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY:
            raise GatewayError(413, f"the request body is over {MAX_BODY} bytes")
        data = await request.body()
        if len(data) > MAX_BODY:
            raise GatewayError(413, f"the request body is over {MAX_BODY} bytes")
        try:
            return json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise GatewayError(400, f"the request body is not valid JSON: {e}") from None

    async def _session(self, request: Any, req: Request, call_id: str) -> str:
        for value, where in ((request.path_params.get("session"), "the /s/<session>/ path"),
                             (request.headers.get(SESSION_HEADER), f"the {SESSION_HEADER} header"),
                             (req.session_hint, "the body's session field")):
            if value:
                if not _SESSION.match(str(value)):
                    raise GatewayError(400, f"the session id from {where} must be 1-200 characters of letters, "
                                       f"digits and _.:@~-; got {str(value)[:80]!r}")
                return str(value)
        import anyio

        # no session named: a conversation that continues an earlier call's joins its session
        found = await anyio.to_thread.run_sync(self.store.continued_session, req.messages)
        return found or call_id

    async def _record(self, call: CallRecord) -> None:
        import anyio

        await anyio.to_thread.run_sync(self.store.record, call)

    def _headers(self, call: CallRecord) -> dict[str, str]:
        return {"x-evolve-call-id": call.id, "x-evolve-session": call.session_id,
                "x-evolve-system": call.system_id or ""}

    # -- endpoints ---------------------------------------------------------------------------------

    async def _health(self, request: Any) -> Any:
        return self._json(200, {"ok": True, "routes": [r.name for r in self.routes]})

    async def _models(self, request: Any) -> Any:
        if not self._authorized(request):
            return self._error("openai", GatewayError(401, "invalid or missing API key", code="invalid_api_key"))
        names = sorted({p for r in self.routes for p in r.match})
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
        prompts: dict[str, str] = {}
        sid = route.current_system()
        if route.source is not None:
            import anyio

            sid, prompts = await anyio.to_thread.run_sync(route.source.current)
        return self._json(200, {"route": route.name, "system_id": sid, "prompts": prompts,
                                "apply": [r.__dict__ for r in route.rules]})

    async def _feedback(self, request: Any) -> Any:
        if not self._authorized(request):
            return self._error("openai", GatewayError(401, "invalid or missing API key", code="invalid_api_key"))
        try:
            body = await self._body(request)
            if not isinstance(body, dict):
                raise GatewayError(400, "feedback must be a JSON object: {session_id | call_id, score, components, "
                                   "text, id}")
            unknown = set(body) - {"session_id", "call_id", "score", "components", "text", "id", "source"}
            if unknown:
                raise GatewayError(400, f"unknown feedback field(s) {sorted(unknown)}; known: session_id, call_id, "
                                   "score, components, text, id, source")
            import anyio

            check_feedback(**{k: body.get(k) for k in ("session_id", "call_id", "score", "components", "text", "id",
                                                       "source")})
            fb, new = await anyio.to_thread.run_sync(lambda: self.store.feedback(**body))
        except UserError as e:
            return self._error("openai", GatewayError(400, str(e)))
        except GatewayError as e:
            return self._error("openai", e)
        return self._json(200 if not new else 201, {"id": fb.id, "session_id": fb.session_id, "call_id": fb.call_id,
                                                    "recorded": new})

    async def _openai(self, request: Any) -> Any:
        return await self._chat(request, "openai")

    async def _anthropic(self, request: Any) -> Any:
        return await self._chat(request, "anthropic")

    async def _chat(self, request: Any, api: str) -> Any:
        t0 = time.perf_counter()
        try:
            if not self._authorized(request):
                raise GatewayError(401, "invalid or missing API key: send 'Authorization: Bearer <key>' or "
                                   "'x-api-key: <key>'", code="invalid_api_key")
            body = await self._body(request)
            req = openai_request(body) if api == "openai" else anthropic_request(body)
            route = pick(self.routes, req.model)
            applied: list[str] = []
            system_id = route.current_system()
            if route.source is not None:
                import anyio

                from evolve.gateway.apply import apply_rules

                system_id, prompts = await anyio.to_thread.run_sync(route.source.current)
                req.messages, applied = apply_rules(req.messages, route.rules, prompts)
            call_id = ("chatcmpl-" if api == "openai" else "msg_") + secrets.token_hex(12)
            call = CallRecord(session_id=await self._session(request, req, call_id), api=api, messages=req.messages,
                              model=req.model, route=route.name, upstream_model=route.upstream.target(req.model),
                              stream=req.stream, tools=req.tools,
                              params={k: v for k, v in req.params.items() if k != "tools"}, request=body,
                              system_id=system_id, id=call_id)
            if route.source is not None:
                call.params["evolve_applied"] = applied
        except GatewayError as e:
            return self._error(api, e)
        if req.stream:
            return self._streamed(api, req, route, call, t0)
        try:
            res = await route.upstream.complete(req)
        except GatewayError as e:
            await self._failed(call, e, t0)
            return self._error(api, e)
        self._fill(call, res, t0)
        if api == "openai":
            out = dict(res.raw)
            out["id"], out["model"] = call.id, req.model
            out["system_fingerprint"] = call.system_id
        else:
            out = anthropic_message(call.id, req.model, res.text, res.tool_calls, res.finish_reason,
                                    res.prompt_tokens, res.completion_tokens)
        call.response = out
        await self._record(call)
        return self._json(200, out, self._headers(call))

    async def _failed(self, call: CallRecord, err: GatewayError, t0: float) -> None:
        call.status, call.error, call.latency_s = "error", f"{err.status}: {err.message}", time.perf_counter() - t0
        try:
            await self._record(call)
        except Exception as e:  # noqa: BLE001 - the error answer matters more than its record
            if self.log:
                self.log(f"could not record a failed call: {e}")

    @staticmethod
    def _fill(call: CallRecord, res: Result, t0: float) -> None:
        call.output, call.tool_calls, call.finish_reason = res.text, res.tool_calls, res.finish_reason
        call.prompt_tokens, call.completion_tokens, call.cost = res.prompt_tokens, res.completion_tokens, res.cost
        call.token_ids, call.prompt_token_ids, call.logprobs = res.token_ids, res.prompt_token_ids, res.logprobs
        call.upstream_model = res.model or call.upstream_model
        call.system_id = res.system_id or call.system_id
        call.latency_s = time.perf_counter() - t0

    def _streamed(self, api: str, req: Request, route: Route, call: CallRecord, t0: float) -> Any:
        from starlette.responses import StreamingResponse

        async def events() -> AsyncIterator[str]:
            text: list[str] = []
            calls: dict[int, dict[str, Any]] = {}
            finish, usage, model = None, {}, None
            astream = AnthropicStream(call.id, req.model) if api == "anthropic" else None
            if astream is not None:
                yield astream.start()
            try:
                whole: Result | None = None
                async for chunk in route.upstream.stream(req):
                    if isinstance(chunk, Result):  # a local route's whole answer, for the record
                        whole = chunk
                        continue
                    model = chunk.get("model") or model
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices") or []:
                        if choice.get("index", 0) != 0:
                            continue
                        delta = choice.get("delta") or {}
                        piece = delta.get("content")
                        if piece:
                            text.append(piece)
                            if astream is not None:
                                yield astream.text(piece)
                        for tc in delta.get("tool_calls") or []:
                            i = int(tc.get("index", 0))
                            slot = calls.setdefault(i, {"id": None, "type": "function",
                                                        "function": {"name": "", "arguments": ""}})
                            fn = tc.get("function") or {}
                            slot["id"] = tc.get("id") or slot["id"]
                            slot["function"]["name"] += fn.get("name") or ""
                            slot["function"]["arguments"] += fn.get("arguments") or ""
                            if astream is not None:
                                yield astream.tool(i, slot["id"], slot["function"]["name"], fn.get("arguments"))
                        finish = choice.get("finish_reason") or finish
                    if api == "openai":
                        if not chunk.get("choices") and chunk.get("usage") and not req.include_usage:
                            continue
                        out = dict(chunk)
                        out["id"], out["model"] = call.id, req.model
                        out.setdefault("object", "chat.completion.chunk")
                        if not req.include_usage:
                            out.pop("usage", None)
                        yield f"data: {json.dumps(out, ensure_ascii=False)}\n\n"
            except GatewayError as e:
                await self._failed(call, e, t0)
                yield astream.error(e) if astream is not None else f"data: {json.dumps(e.openai())}\n\n"
                return
            except Exception as e:  # noqa: BLE001 - never leave a stream hanging without an error event
                err = upstream_error(e, route.upstream.describe())
                await self._failed(call, err, t0)
                yield astream.error(err) if astream is not None else f"data: {json.dumps(err.openai())}\n\n"
                return
            tool_calls = [calls[i] for i in sorted(calls)] or None
            res = whole or Result(text="".join(text) if text else None, tool_calls=tool_calls, finish_reason=finish,
                                  model=model, prompt_tokens=usage.get("prompt_tokens"),
                                  completion_tokens=usage.get("completion_tokens"))
            self._fill(call, res, t0)
            call.response = {"streamed": True, "text": res.text, "tool_calls": res.tool_calls,
                             "finish_reason": res.finish_reason, "usage": usage or None}
            await self._record(call)  # before the stream's last event: a finished call is a stored call
            if astream is not None:
                yield astream.finish(finish, res.completion_tokens)
            else:
                yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={
            **self._headers(call), "cache-control": "no-cache"})


__all__ = ["Gateway", "SESSION_HEADER", "message_id"]
