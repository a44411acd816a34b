"""The two APIs an agent may speak to the gateway, and the one format the gateway thinks in.

The gateway works in the OpenAI chat-completions format (what litellm takes and returns, and
what the trace store records). :func:`openai_request` checks an OpenAI request body;
:func:`anthropic_request` checks an Anthropic Messages body and translates it; the
``anthropic_*`` functions turn an answer (whole, or streamed) back into Anthropic's shape.

Errors are :class:`GatewayError`: an HTTP status and a message, rendered in the shape of the API
the agent spoke (:meth:`GatewayError.openai`, :meth:`GatewayError.anthropic`).
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

# the request params passed on to the upstream (others are recorded and dropped)
OPENAI_PARAMS = (
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "n",
    "seed",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "user",
    "reasoning_effort",
)
OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool", "function")

_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
    529: "overloaded_error",
}
_OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class GatewayError(Exception):
    """A request the gateway answers with an error: ``status``, ``message``, the ``param`` at fault."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def openai(self) -> dict[str, Any]:
        kind = _OPENAI_ERROR_TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def anthropic(self) -> dict[str, Any]:
        kind = _ANTHROPIC_ERROR_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}


TOOL_ERROR = "[tool error] "  # a failed tool result, as the OpenAI format carries it (no is_error there)


def bad(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param)


@dataclass
class Request:
    """A request in the gateway's own terms (the OpenAI chat format)."""

    api: str  # "openai" | "anthropic"
    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)  # passed on to the upstream
    stream: bool = False
    include_usage: bool = False  # OpenAI: stream_options.include_usage
    session_hint: str | None = None  # metadata.session_id / user / metadata.user_id
    raw: Any = None  # the body as the agent sent it
    system: str | None = None  # the system this request must be answered by (a session's own), if not the current
    session: str | None = None  # the session the gateway put the call in (set before the route answers)

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        return self.params.get("tools")


def _finite(body: dict, key: str, lo: float, hi: float, where: str = "") -> None:
    v = body.get(key)
    if v is not None and (
        isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi
    ):
        raise bad(f"'{where}{key}' must be a number in [{lo:g}, {hi:g}], got {v!r}", key)


def _positive_int(body: dict, key: str) -> None:
    v = body.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise bad(f"'{key}' must be a positive integer, got {v!r}", key)


def _check_openai_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise bad('\'tools\' must be a list of {"type": "function", "function": {...}} objects', "tools")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(
                f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}}}',
                f"tools[{i}]",
            )


def openai_request(body: Any) -> Request:
    """An OpenAI chat-completions body, checked; raises :class:`GatewayError` (400) naming what is wrong."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required: a string naming the model (a route of this gateway)", "model")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' is required: a non-empty list of {role, content} objects", "messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object with 'role' and 'content'", f"messages[{i}]")
        if m.get("role") not in OPENAI_ROLES:
            raise bad(f"messages[{i}].role {m.get('role')!r} is not one of {list(OPENAI_ROLES)}", f"messages[{i}].role")
        c = m.get("content")
        if c is not None and not isinstance(c, (str, list)):
            raise bad(f"messages[{i}].content must be a string or a list of content parts", f"messages[{i}].content")
        if m["role"] == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise bad(
                f"messages[{i}]: a tool message needs 'tool_call_id' (the id of the call it answers)",
                f"messages[{i}].tool_call_id",
            )
        calls = m.get("tool_calls")
        if calls is not None and (
            not isinstance(calls, list)
            or not all(
                isinstance(c, dict)
                and isinstance(c.get("function"), dict)
                and isinstance(c["function"].get("name"), str)
                for c in calls
            )
        ):
            raise bad(
                f'messages[{i}].tool_calls must be a list of {{"id", "type": "function", "function": '
                '{"name", "arguments"}}}',
                f"messages[{i}].tool_calls",
            )
    _finite(body, "temperature", 0.0, 2.0)
    _finite(body, "top_p", 0.0, 1.0)
    for key in ("max_tokens", "max_completion_tokens", "n"):
        _positive_int(body, key)
    _check_openai_tools(body.get("tools"))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad(f"'stream' must be true or false, got {stream!r}", "stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad("'stream_options' must be an object", "stream_options")
    meta = body.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise bad("'metadata' must be an object of string values", "metadata")
    hint = (meta or {}).get("session_id") or body.get("user")
    params = {k: body[k] for k in OPENAI_PARAMS if body.get(k) is not None}
    return Request(
        "openai",
        model,
        [dict(m) for m in msgs],
        params,
        stream,
        bool((opts or {}).get("include_usage")),
        str(hint) if hint else None,
        body,
    )


# ----------------------------------------------------------------------------- Anthropic Messages

_STOP_TO_ANTHROPIC = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text of its parts (other parts skipped)."""
    if isinstance(content, list):
        return "\n".join(
            p if isinstance(p, str) else str(p.get("text", "")) for p in content if isinstance(p, (str, dict))
        )
    return str(content or "")


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for j, b in enumerate(content):
            if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
                kind = b.get("type") if isinstance(b, dict) else type(b).__name__
                raise bad(f"{where}[{j}]: only text blocks are supported here, got {kind!r}", where)
            out.append(b["text"])
        return "\n".join(out)
    raise bad(f"{where} must be a string or a list of text blocks", where)


def anthropic_request(body: Any) -> Request:
    """An Anthropic Messages body, checked and translated to the OpenAI chat format."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model: Field required (a string naming the model, a route of this gateway)", "model")
    mt = body.get("max_tokens")
    if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
        raise bad("max_tokens: Field required (a positive integer)", "max_tokens")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages: Field required (a non-empty list of {role, content})", "messages")
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text_of(system, "system")})
    for i, m in enumerate(msgs):
        where = f"messages.{i}"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad(f"{where}.role: must be 'user' or 'assistant'", f"{where}.role")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise bad(f"{where}.content: must be a string or a list of content blocks", f"{where}.content")
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for j, b in enumerate(content):
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "text" and isinstance(b.get("text"), str):
                texts.append(b["text"])
            elif kind == "tool_use" and m["role"] == "assistant":
                if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                    raise bad(f"{where}.content.{j}: a tool_use block needs 'id' and 'name'", f"{where}.content.{j}")
                calls.append(
                    {
                        "id": b["id"],
                        "type": "function",
                        "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})},
                    }
                )
            elif kind == "tool_result" and m["role"] == "user":
                if not isinstance(b.get("tool_use_id"), str):
                    raise bad(f"{where}.content.{j}: a tool_result block needs 'tool_use_id'", f"{where}.content.{j}")
                text = _text_of(b.get("content") or "", f"{where}.content.{j}.content")
                if b.get("is_error"):
                    text = TOOL_ERROR + text
                results.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": text})
            elif kind in ("thinking", "redacted_thinking"):
                continue  # a model's earlier thinking is not sent on
            else:
                raise bad(
                    f"{where}.content.{j}: block type {kind!r} is not supported by the gateway "
                    "(text, tool_use, tool_result are)",
                    f"{where}.content.{j}",
                )
        out.extend(results)
        if texts or calls:
            msg: dict[str, Any] = {"role": m["role"], "content": "\n".join(texts) if texts else None}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    params: dict[str, Any] = {"max_tokens": mt}
    _finite(body, "temperature", 0.0, 1.0)
    _finite(body, "top_p", 0.0, 1.0)
    for k in ("temperature", "top_p"):
        if body.get(k) is not None:
            params[k] = body[k]
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise bad("stop_sequences: must be a list of strings", "stop_sequences")
        params["stop"] = stops
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad("tools: must be a list of {name, description, input_schema}", "tools")
        conv = []
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                raise bad(f"tools.{i}: a tool needs 'name' and 'input_schema'", f"tools.{i}")
            if t.get("type") not in (None, "custom") and "input_schema" not in t:
                raise bad(f"tools.{i}: server tools ({t.get('type')!r}) are not supported by the gateway", f"tools.{i}")
            conv.append(
                {
                    "type": "function",
                    "function": {
                        "name": t["name"],
                        "description": t.get("description", ""),
                        "parameters": t.get("input_schema") or {"type": "object"},
                    },
                }
            )
        params["tools"] = conv
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind == "auto":
            params["tool_choice"] = "auto"
        elif kind == "any":
            params["tool_choice"] = "required"
        elif kind == "none":
            params["tool_choice"] = "none"
        elif kind == "tool" and isinstance(choice.get("name"), str):
            params["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        else:
            raise bad("tool_choice: must be {type: auto | any | none} or {type: tool, name}", "tool_choice")
        if isinstance(choice, dict) and choice.get("disable_parallel_tool_use"):
            params["parallel_tool_calls"] = False
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream: must be true or false", "stream")
    meta = body.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise bad("metadata: must be an object", "metadata")
    hint = (meta or {}).get("user_id")
    return Request("anthropic", model, out, params, stream, True, str(hint) if hint else None, body)


def anthropic_content(text: str | None, tool_calls: list[dict] | None) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if text:
        blocks.append({"type": "text", "text": text})
    for c in tool_calls or []:
        fn = c.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            args = {"_raw": fn.get("arguments")}
        blocks.append(
            {
                "type": "tool_use",
                "id": c.get("id") or "toolu_" + secrets.token_hex(12),
                "name": fn.get("name"),
                "input": args,
            }
        )
    return blocks


def anthropic_message(
    mid: str,
    model: str,
    text: str | None,
    tool_calls: list[dict] | None,
    finish_reason: str | None,
    prompt_tokens: int | None,
    completion_tokens: int | None,
) -> dict[str, Any]:
    """A whole answer as an Anthropic ``message`` object."""
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": anthropic_content(text, tool_calls),
        "stop_reason": _STOP_TO_ANTHROPIC.get(finish_reason or "stop", "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": int(prompt_tokens or 0), "output_tokens": int(completion_tokens or 0)},
    }


class AnthropicStream:
    """Turns OpenAI stream deltas into Anthropic's server-sent events, one call at a time."""

    def __init__(self, mid: str, model: str) -> None:
        self.mid, self.model = mid, model
        self.index = -1
        self.open: str | None = None  # the open block: "text" | "tool"

    @staticmethod
    def event(kind: str, data: dict[str, Any]) -> str:
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def start(self, prompt_tokens: int | None = None) -> str:
        return self.event(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": self.mid,
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": int(prompt_tokens or 0), "output_tokens": 0},
                },
            },
        )

    def _close(self) -> str:
        if self.open is None:
            return ""
        self.open = None
        return self.event("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def text(self, delta: str) -> str:
        out = ""
        if self.open != "text":
            out += self._close()
            self.index += 1
            self.open = "text"
            out += self.event(
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": {"type": "text", "text": ""}},
            )
        return out + self.event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self.index, "delta": {"type": "text_delta", "text": delta}},
        )

    def tool_block(self, call: dict[str, Any]) -> str:
        """One whole tool_use block (sent once the call's id, name and arguments are all known)."""
        fn = call.get("function") or {}
        args = fn.get("arguments") or "{}"
        try:
            json.loads(args)
        except json.JSONDecodeError:
            args = json.dumps({"_raw": args})
        out = self._close()
        self.index += 1
        self.open = "tool"
        block: dict[str, Any] = {
            "type": "tool_use",
            "id": call.get("id") or "toolu_" + secrets.token_hex(12),
            "name": fn.get("name") or "",
            "input": {},
        }
        out += self.event(
            "content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block}
        )
        out += self.event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": self.index,
                "delta": {"type": "input_json_delta", "partial_json": args},
            },
        )
        return out + self._close()

    def finish(self, finish_reason: str | None, completion_tokens: int | None, prompt_tokens: int | None = None) -> str:
        usage = {"output_tokens": int(completion_tokens or 0)}
        if prompt_tokens is not None:
            usage["input_tokens"] = int(prompt_tokens)
        return (
            self._close()
            + self.event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": _STOP_TO_ANTHROPIC.get(finish_reason or "stop", "end_turn"),
                        "stop_sequence": None,
                    },
                    "usage": usage,
                },
            )
            + self.event("message_stop", {"type": "message_stop"})
        )

    def error(self, err: GatewayError) -> str:
        return self.event("error", err.anthropic())


__all__ = [
    "AnthropicStream",
    "GatewayError",
    "Request",
    "anthropic_message",
    "anthropic_request",
    "bad",
    "openai_request",
    "text_of",
]
