"""Answering a chat call and recording it: the upstream asked for a whole answer, a stream, or
rounds through the system's served tools (:mod:`evolve.gateway.tools`), the answer sent in the
agent's API, and the call recorded (:class:`Recorder`) before the last byte of its answer is sent,
so a call the agent saw finish is never lost, whatever happens to the gateway after. A call that
fails is recorded as failed; a stream the client leaves is recorded with status 499.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from evolve.gateway.apply import Applied
from evolve.gateway.records import CallRecord, answer_message, chain_key
from evolve.gateway.sessions import new_call_id
from evolve.gateway.surface import json_response
from evolve.gateway.traces import TraceStore
from evolve.gateway.upstream import Result, Route, StreamAnswer, upstream_error
from evolve.gateway.wire import AnthropicStream, GatewayError, Request, anthropic_message


class Recorder:
    """Where a gateway's calls go: its trace store (None: nowhere) and, where one is set, its span
    export (:class:`evolve.gateway.otel.SpanExport`: each stored call also sent as a span)."""

    def __init__(self, store: TraceStore | None, log: Callable[[str], None] | None = None) -> None:
        self.store, self.log = store, log
        self.spans: Any = None

    async def record(self, call: CallRecord) -> None:
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

    async def failed(self, call: CallRecord, err: GatewayError, t0: float) -> None:
        """Record ``call`` as failed with ``err``, started at ``t0`` (``time.perf_counter``)."""
        call.status, call.error, call.latency_s = "error", f"{err.status}: {err.message}", time.perf_counter() - t0
        try:
            await self.record(call)
        except Exception as e:  # noqa: BLE001 - the error answer matters more than its record
            if self.log:
                self.log(f"could not record a failed call: {e}")


def call_record(
    api: str, req: Request, route: Route, body: Any, applied: Applied, *, session: str, call_id: str, ts: float
) -> CallRecord:
    """The record of a call not yet answered: ``req`` as the system answers it, ``body`` as the agent
    sent it."""
    call = CallRecord(
        session_id=session,
        api=api,
        messages=req.messages,
        model=req.model,
        route=route.name,
        upstream_model=route.upstream.target(req.model),
        stream=req.stream,
        tools=req.tools,
        params={k: v for k, v in req.params.items() if k != "tools"},
        request=body,
        system_id=applied.system_id,
        id=call_id,
        ts=ts,
    )
    if route.source is not None:
        call.params["evolve_applied"] = applied.rules
        if route.recall is not None:
            call.params["memory_recalled"] = applied.recalled
    return call


def call_headers(call: CallRecord) -> dict[str, str]:
    return {"x-evolve-call-id": call.id, "x-evolve-session": call.session_id, "x-evolve-system": call.system_id or ""}


@dataclass
class Exchange:
    """One chat call in flight: ``req`` (as the system answers it) on ``route``, its record ``call``,
    started at ``t0`` (``time.perf_counter``), ``sent`` the messages as the agent sent them (what a
    later call continuing the conversation is matched against). A round through served tools moves
    ``call`` and ``t0`` on to the next model call."""

    api: str
    req: Request
    route: Route
    call: CallRecord
    t0: float
    sent: list[dict]
    recorder: Recorder

    async def respond(self, served: dict[str, Any]) -> Any:
        """The answer (a starlette response), with the system's ``served`` tools (by name) run here."""
        if served:
            return await self._tool_rounds(served)
        if self.req.stream:
            chunks = self.route.upstream.stream(self.req)
            try:  # the first chunk before the answer starts: an upstream that fails gets its own status
                first = await chunks.__anext__()
            except StopAsyncIteration:
                first = None
            except GatewayError as e:
                await self.recorder.failed(self.call, e, self.t0)
                raise
            except Exception as e:  # noqa: BLE001
                err = upstream_error(e, self.route.upstream.describe())
                await self.recorder.failed(self.call, err, self.t0)
                raise err from None
            return self._streamed(first, chunks)
        res = await self._complete()
        self._fill(res)
        return await self._whole(res)

    async def _complete(self) -> Result:
        try:
            return await self.route.upstream.complete(self.req)
        except GatewayError as e:
            await self.recorder.failed(self.call, e, self.t0)
            raise

    def _fill(self, res: Result) -> None:
        """The answer ``res`` into the call's record."""
        call = self.call
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
        call.latency_s = time.perf_counter() - self.t0
        call.chain_key = chain_key([*self.sent, answer_message(call)])

    async def _whole(self, res: Result) -> Any:
        """A whole answer in the agent's API, recorded before it is sent."""
        call, req = self.call, self.req
        if self.api == "openai":
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
            out = anthropic_message(
                call.id,
                req.model,
                res.text,
                res.tool_calls,
                res.finish_reason,
                res.prompt_tokens,
                res.completion_tokens,
            )
        call.response = out
        await self.recorder.record(call)
        return json_response(200, out, call_headers(call))

    async def _tool_rounds(self, served: dict[str, Any]) -> Any:
        """Answer a request whose model may call the system's served tools: each round a model call
        recorded in the session; the served tools run in the sandbox; the last round offers only the
        agent's tools."""
        import anyio

        from evolve.gateway.tools import served_calls

        req, route, api = self.req, self.route, self.api
        tools, stream, req.stream = route.tools, req.stream, False
        agent_tools = [t for t in req.tools or [] if (t.get("function") or {}).get("name") not in served]
        for n in range(tools.max_rounds):
            if n == tools.max_rounds - 1:  # the model must answer now: none of the served tools on offer
                req.params = {k: v for k, v in req.params.items() if k not in ("tools", "tool_choice") or agent_tools}
                if agent_tools:
                    req.params["tools"] = agent_tools
            res = await self._complete()
            ours, theirs = served_calls(res.tool_calls, served)
            if ours and (theirs or n == tools.max_rounds - 1):  # the agent sees only what it can run
                self.call.params["gateway_tools_dropped"] = [c["function"]["name"] for c in ours]
                res.tool_calls, ours = theirs or None, []
                if not theirs and res.finish_reason == "tool_calls":
                    res.finish_reason = "stop"
            self._fill(res)
            if not ours:
                break
            results = []
            for c in ours:
                results.append(await anyio.to_thread.run_sync(tools.run, served[c["function"]["name"]], c))
            call = self.call
            call.params["gateway_tools"] = [c["function"]["name"] for c in ours]
            call.response = {
                "text": res.text,
                "tool_calls": res.tool_calls,
                "finish_reason": res.finish_reason,
                "gateway_round": n,
            }
            await self.recorder.record(call)
            answers = (
                {"role": "tool", "tool_call_id": c["id"], "content": r} for c, r in zip(ours, results, strict=True)
            )
            req.messages = [*req.messages, {"role": "assistant", "content": res.text, "tool_calls": ours}, *answers]
            self.t0 = time.perf_counter()
            self.call = CallRecord(
                session_id=call.session_id,
                api=api,
                messages=req.messages,
                model=req.model,
                route=route.name,
                upstream_model=call.upstream_model,
                stream=stream,
                tools=req.tools,
                params={k: v for k, v in call.params.items() if k not in ("gateway_tools", "served_by")},
                request=call.request,
                system_id=call.system_id,
                id=new_call_id(api),
                ts=time.time(),
            )
        if not stream:
            return await self._whole(res)
        self.call.response = {
            "streamed": True,
            "text": res.text,
            "tool_calls": res.tool_calls,
            "finish_reason": res.finish_reason,
        }
        await self.recorder.record(self.call)
        return self._replayed(res)

    def _replayed(self, res: Result) -> Any:
        """A whole answer sent as the stream the agent asked for."""
        from starlette.responses import StreamingResponse

        call, req = self.call, self.req

        async def events() -> AsyncIterator[str]:
            if self.api == "anthropic":
                a = AnthropicStream(call.id, req.model)
                yield a.start(res.prompt_tokens)
                if res.text:
                    yield a.text(res.text)
                for c in res.tool_calls or []:
                    yield a.tool_block(c)
                yield a.finish(res.finish_reason, res.completion_tokens, res.prompt_tokens)
                return
            base = {
                "id": call.id,
                "object": "chat.completion.chunk",
                "created": int(call.ts),
                "model": req.model,
                "system_fingerprint": call.system_id,
            }
            delta: dict[str, Any] = {"role": "assistant", "content": res.text or ""}
            if res.tool_calls:
                delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(res.tool_calls)]
            for chunk in (
                {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": res.finish_reason}]},
            ):
                yield f"data: {json.dumps({**base, **chunk}, ensure_ascii=False)}\n\n"
            if req.include_usage:
                usage = {
                    "prompt_tokens": res.prompt_tokens or 0,
                    "completion_tokens": res.completion_tokens or 0,
                    "total_tokens": (res.prompt_tokens or 0) + (res.completion_tokens or 0),
                }
                yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={**call_headers(call), "cache-control": "no-cache"}
        )

    def _streamed(self, first: Any, chunks: Any) -> Any:
        """The upstream's stream passed on in the agent's API (``first``: its first chunk, already
        read; None: it had none), the call recorded before the stream's last event."""
        import anyio
        from starlette.responses import StreamingResponse

        call, req, api = self.call, self.req, self.api

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
                self._fill(res)
                if res.finish_reason is None:
                    call.status, call.error = "error", "the upstream's stream ended without a finish reason"
                call.response = {
                    "streamed": True,
                    "text": res.text,
                    "tool_calls": res.tool_calls,
                    "finish_reason": res.finish_reason,
                    "usage": answer.usage or None,
                }
                await self.recorder.record(call)  # before the stream's last event: a finished call is a stored call
                recorded = True
                if astream is not None:
                    for c in res.tool_calls or []:  # whole: the id and name are known, the input is valid JSON
                        yield astream.tool_block(c)
                    yield astream.finish(res.finish_reason, res.completion_tokens, res.prompt_tokens)
                else:
                    yield "data: [DONE]\n\n"
            except Exception as e:  # noqa: BLE001 - never leave a stream hanging without an error event
                err = e if isinstance(e, GatewayError) else upstream_error(e, self.route.upstream.describe())
                if not recorded:
                    await self.recorder.failed(call, err, self.t0)
                yield astream.error(err) if astream is not None else f"data: {json.dumps(err.openai())}\n\n"
            except BaseException:  # the client went away (cancelled): the call is recorded as such
                if not recorded:
                    with anyio.CancelScope(shield=True):
                        await self.recorder.failed(
                            call, GatewayError(499, "the client closed the stream before its end"), self.t0
                        )
                raise

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={**call_headers(call), "cache-control": "no-cache"}
        )


__all__ = ["Exchange", "Recorder", "call_headers", "call_record"]
