"""A scripted OpenAI-compatible upstream for the gateway's tests: a real HTTP server on loopback
(starlette under uvicorn) that answers chat completions, whole or streamed, with tool calls.

What it answers, deterministically:

* the user's text is ``call:<tool> <JSON arguments>`` and that tool is offered: that call;
* tools offered and the last message is the user's: a call of the first tool, its first
  parameter set to the user's text (``{"<param>": "<text>"}``);
* the last message is a tool result: ``"the tool said: <result>"``;
* otherwise: ``"echo: <last user text>"``.

Model names steer failures: ``fail-500`` answers 500, ``fail-429`` 429 (``fail-<code>``: that
status), ``slow-<ms>`` waits that long first, ``drip-<ms>`` waits that long between stream chunks. Every request body is kept in ``.requests`` (and its headers in ``.headers``).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _last_user_text(messages: list[dict]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, list):
                return " ".join(p.get("text", "") for p in c if isinstance(p, dict))
            return str(c or "")
    return ""


def answer(body: dict) -> tuple[str | None, list[dict] | None, str]:
    """(text, tool_calls, finish_reason) for a request body."""
    msgs = body.get("messages") or []
    last = msgs[-1] if msgs else {}
    tools = body.get("tools") or []
    if last.get("role") == "tool":
        return f"the tool said: {last.get('content')}", None, "stop"
    text = _last_user_text(msgs)
    named = {t["function"]["name"]: t["function"] for t in tools}
    if last.get("role") == "user" and text.startswith("call:") and text[5:].split(" ", 1)[0] in named:
        name, _, args = text[5:].partition(" ")
        return (
            None,
            [
                {
                    "id": f"call_{abs(hash(text)) % 10**8}",
                    "type": "function",
                    "function": {"name": name, "arguments": args or "{}"},
                }
            ],
            "tool_calls",
        )
    if tools and last.get("role") == "user" and body.get("tool_choice") != "none":
        fn = tools[0]["function"]
        props = list(((fn.get("parameters") or {}).get("properties") or {}).keys()) or ["input"]
        args = json.dumps({props[0]: _last_user_text(msgs)})
        n = sum(1 for m in msgs if m.get("role") == "tool")
        return (
            None,
            [
                {
                    "id": f"call_{n}_{abs(hash(args)) % 10**8}",
                    "type": "function",
                    "function": {"name": fn["name"], "arguments": args},
                }
            ],
            "tool_calls",
        )
    return f"echo: {_last_user_text(msgs)}", None, "stop"


class ScriptedUpstream:
    """Start with ``with ScriptedUpstream() as up: up.url``; ``up.url`` ends in ``/v1``."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        async def chat(request: Any) -> Any:
            body = await request.json()
            self.requests.append(body)
            self.headers.append(dict(request.headers))
            model = str(body.get("model", ""))
            if model.startswith("slow-"):
                await asyncio.sleep(int(model.split("-", 1)[1]) / 1000)
            if model == "fail-500":
                return JSONResponse({"error": {"message": "upstream exploded", "type": "server_error"}}, 500)
            if model == "fail-429":
                return JSONResponse({"error": {"message": "slow down", "type": "rate_limit_error"}}, 429)
            if model.startswith("fail-") and model[5:].isdigit():
                return JSONResponse({"error": {"message": f"scripted {model[5:]}", "type": "scripted"}}, int(model[5:]))
            text, calls, finish = answer(body)
            prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in body.get("messages") or [])
            completion_tokens = len((text or "").split()) + (len(calls) * 5 if calls else 0)
            rid, created = f"chatcmpl-up{len(self.requests)}", int(time.time())
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            }
            if not body.get("stream"):
                msg: dict[str, Any] = {"role": "assistant", "content": text}
                if calls:
                    msg["tool_calls"] = calls
                return JSONResponse(
                    {
                        "id": rid,
                        "object": "chat.completion",
                        "created": created,
                        "model": model,
                        "choices": [{"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}],
                        "usage": usage,
                    }
                )

            def chunk(delta: dict, finish_reason: str | None = None, **extra: Any) -> str:
                c = {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
                    **extra,
                }
                return f"data: {json.dumps(c)}\n\n"

            drip = int(model.split("-", 1)[1]) / 1000 if model.startswith("drip-") else 0.0

            async def events() -> Any:
                yield chunk({"role": "assistant", "content": ""})
                if text:
                    words = text.split(" ")
                    for i, w in enumerate(words):
                        if drip:
                            await asyncio.sleep(drip)
                        yield chunk({"content": w + (" " if i < len(words) - 1 else "")})
                for i, c in enumerate(calls or []):
                    yield chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": i,
                                    "id": c["id"],
                                    "type": "function",
                                    "function": {"name": c["function"]["name"], "arguments": ""},
                                }
                            ]
                        }
                    )
                    args = c["function"]["arguments"]
                    for k in range(0, len(args), 7):
                        yield chunk({"tool_calls": [{"index": i, "function": {"arguments": args[k : k + 7]}}]})
                yield chunk({}, finish)
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield f"data: {json.dumps({'id': rid, 'object': 'chat.completion.chunk', 'created': created, 'model': model, 'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        async def models(request: Any) -> Any:
            return JSONResponse(
                {"object": "list", "data": [{"id": "scripted", "object": "model", "created": 0, "owned_by": "tests"}]}
            )

        return Starlette(
            routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models, methods=["GET"])]
        )

    def __enter__(self) -> ScriptedUpstream:
        import uvicorn

        config = uvicorn.Config(self.app(), host="127.0.0.1", port=self.port, log_level="error", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.time() + 20
        while not self._server.started:
            if time.time() > deadline:
                raise RuntimeError("the scripted upstream did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "look a thing up",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
]
ATOOLS = [
    {
        "name": "lookup",
        "description": "look a thing up",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    }
]


def post(url: str, body, headers: dict | None = None) -> tuple[int, dict]:
    """POST JSON (or raw bytes) with the standard library: (status, the decoded answer)."""
    import urllib.error
    import urllib.request

    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
