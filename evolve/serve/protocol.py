"""The OpenAI chat-completions wire format: parse a request, build a response or SSE chunks.

Pure functions over JSON values (no sockets): :func:`parse_chat_request` turns a request body
into a :class:`ChatRequest` or raises :class:`APIError` (an HTTP status and an OpenAI-shaped
error); :func:`chat_response` and :func:`chat_chunks` turn :class:`~evolve.llm.base.Completion`\\ s
back into a ``chat.completion`` object or ``chat.completion.chunk`` objects.

Extensions to the OpenAI schema (in the spirit of vLLM's): ``prompt_token_ids`` at the top
level and ``token_ids`` in each choice (exactly what the sampler drew, the final EOS included),
and ``system_fingerprint`` set to the id of the evolve system that answered.

Other request fields (``top_p``, penalties, ``user``, ``metadata``, ``stream_options`` beyond
``include_usage``, ...) are accepted and ignored; fields naming features this server lacks
(``tools``, ``functions``, non-text ``response_format``, ``logit_bias``, ``top_logprobs`` > 0,
audio, ...) are refused with a 400 that says so.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evolve.llm.base import Completion
from evolve.types import Message

# request fields naming features this server does not have: a 400 that says so
UNSUPPORTED = {
    "tools": "tool calling is not supported by evolve serve; describe tools in the prompt and parse the reply",
    "functions": "function calling is not supported by evolve serve",
    "function_call": "function calling is not supported by evolve serve",
    "audio": "audio output is not supported by evolve serve",
    "prediction": "predicted outputs are not supported by evolve serve",
    "web_search_options": "web search is not supported by evolve serve",
}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_N = 64


class APIError(Exception):
    """An error answered in the OpenAI format: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


@dataclass(frozen=True)
class ChatRequest:
    """What this server takes from a chat-completions request."""

    messages: tuple[Message, ...]
    model: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    seed: int | None = None
    n: int = 1
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False


def _content(value: Any, i: int) -> str:
    where = f"messages[{i}].content"
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad(f"{where}[{j}]: only text content parts are supported, got {kind!r}", where)
        return "\n".join(texts)
    raise bad(f"{where} must be a string or a list of text parts", where)


def parse_messages(value: Any) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value:
        raise bad("'messages' is required: a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object with 'role' and 'content'", f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"messages[{i}].role {role!r} is not supported; use one of {sorted(ROLES)}", f"messages[{i}].role")
        if m.get("tool_calls") or m.get("function_call"):
            raise bad(f"messages[{i}]: tool calls are not supported by evolve serve", f"messages[{i}].tool_calls")
        out.append(Message(role=ROLES[role], content=_content(m.get("content"), i)))  # type: ignore[arg-type]
    return tuple(out)


def _number(body: dict, key: str, lo: float, hi: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise bad(f"'{key}' must be a number in [{lo:g}, {hi:g}], got {v!r}", key)
    return float(v)


def _int(body: dict, key: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise bad(f"'{key}' must be an integer {rng}, got {v!r}", key)
    return v


def _bool(body: dict, key: str) -> bool:
    v = body.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise bad(f"'{key}' must be true or false, got {v!r}", key)
    return v


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a decoded request body; raises :class:`APIError` (400) on anything wrong."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    for key, why in UNSUPPORTED.items():
        if body.get(key):
            raise bad(why, key)
    if body.get("tool_choice") not in (None, "none"):
        raise bad(UNSUPPORTED["tools"], "tool_choice")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise bad("response_format other than {\"type\": \"text\"} is not supported by evolve serve", "response_format")
    if body.get("logit_bias"):
        raise bad("logit_bias is not supported by evolve serve", "logit_bias")
    if _int(body, "top_logprobs", 0, 20):
        raise bad("top_logprobs > 0 is not supported by evolve serve (logprobs=true gives the sampled tokens')",
                  "top_logprobs")
    mods = body.get("modalities")
    if mods is not None and mods != ["text"]:
        raise bad("only the text modality is supported by evolve serve", "modalities")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("'model' must be a string", "model")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stop = tuple(stop)
    elif stop is not None:
        raise bad("'stop' must be a string or a list of strings", "stop")
    max_tokens = _int(body, "max_completion_tokens", 0)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 0)
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad("'stream_options' must be an object", "stream_options")
    return ChatRequest(
        messages=parse_messages(body.get("messages")), model=model,
        temperature=_number(body, "temperature", 0.0, 100.0), max_tokens=max_tokens, stop=stop,
        seed=_int(body, "seed", -(2**63), 2**63 - 1), n=_int(body, "n", 1, MAX_N) or 1,
        logprobs=_bool(body, "logprobs"), stream=_bool(body, "stream"),
        include_usage=bool((opts or {}).get("include_usage")),
    )


# ----------------------------------------------------------------------------- responses


def token_text(tokenizer: Any, token_id: int) -> str:
    fn = getattr(tokenizer, "token_text", None)
    if fn is not None:
        try:
            return str(fn(int(token_id)))
        except Exception:  # noqa: BLE001 - a token the tokenizer cannot name
            return str(token_id)
    return str(token_id)


def logprobs_content(c: Completion, tokenizer: Any) -> list[dict[str, Any]] | None:
    """``choices[i].logprobs.content``: one entry per sampled token (None without log-probs)."""
    if c.token_ids is None or c.logprobs is None:
        return None
    out = []
    for tid, lp in zip(c.token_ids, c.logprobs):
        text = token_text(tokenizer, tid)
        out.append({"token": text, "logprob": float(lp), "bytes": list(text.encode("utf-8")), "top_logprobs": []})
    return out


def usage(completions: Sequence[Completion]) -> dict[str, int]:
    prompt = completions[0].prompt_tokens if completions else 0
    done = sum(c.completion_tokens for c in completions)
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}


def _head(kind: str, model: str, fingerprint: str | None, rid: str | None, created: int | None) -> dict[str, Any]:
    return {"id": rid or "chatcmpl-" + secrets.token_hex(12), "object": kind,
            "created": created or int(time.time()), "model": model, "system_fingerprint": fingerprint}


def _ids(values: Sequence[int] | None) -> list[int] | None:
    return None if values is None else [int(v) for v in values]


def chat_response(req: ChatRequest, completions: Sequence[Completion], *, model: str, fingerprint: str | None = None,
                  tokenizer: Any = None) -> dict[str, Any]:
    """A ``chat.completion`` object for ``completions`` (one per choice)."""
    out = _head("chat.completion", model, fingerprint, None, None)
    out["choices"] = [
        {"index": i, "message": {"role": "assistant", "content": c.text},
         "logprobs": {"content": logprobs_content(c, tokenizer)} if req.logprobs else None,
         "finish_reason": c.finish_reason or "stop", "token_ids": _ids(c.token_ids)}
        for i, c in enumerate(completions)
    ]
    out["usage"] = usage(completions)
    out["prompt_token_ids"] = _ids(completions[0].prompt_token_ids) if completions else None
    return out


def chat_chunks(req: ChatRequest, completions: Sequence[Completion], *, model: str, fingerprint: str | None = None,
                tokenizer: Any = None) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed answer. The answer is generated whole
    first, then sent per choice as: the role, the text (with its log-probs and token ids), the
    finish reason; then a usage chunk when ``stream_options.include_usage`` asked for one."""
    rid, created = "chatcmpl-" + secrets.token_hex(12), int(time.time())
    chunks = []

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> None:
        c = _head("chat.completion.chunk", model, fingerprint, rid, created)
        c["choices"] = choices
        if req.include_usage:
            c["usage"] = None
        c.update(extra)
        chunks.append(c)

    for i, c in enumerate(completions):
        first = {"prompt_token_ids": _ids(c.prompt_token_ids)} if i == 0 else {}
        chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
              **first)
        chunk([{"index": i, "delta": {"content": c.text},
                "logprobs": {"content": logprobs_content(c, tokenizer)} if req.logprobs else None,
                "finish_reason": None, "token_ids": _ids(c.token_ids)}])
        chunk([{"index": i, "delta": {}, "logprobs": None, "finish_reason": c.finish_reason or "stop"}])
    if req.include_usage:
        chunk([], usage=usage(completions))
    return chunks


def models_list(names: Sequence[str], owner: str = "evolve") -> dict[str, Any]:
    now = int(time.time())
    return {"object": "list", "data": [{"id": n, "object": "model", "created": now, "owned_by": owner} for n in names]}


__all__ = ["APIError", "ChatRequest", "chat_chunks", "chat_response", "logprobs_content", "models_list",
           "parse_chat_request", "parse_messages", "token_text", "usage"]
