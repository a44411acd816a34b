"""Routes answered by a model in this process: one LLM object (:class:`LLMUpstream`,
:func:`serve_llm`), a run's current system (:mod:`evolve.gateway.run_route`) and each rollout's
own endpoint (:mod:`evolve.gateway.rollout_route`), all on :class:`ModelUpstream`. They answer
with the exact token ids and log-probs of every answer (``prompt_token_ids`` at the top of an
OpenAI answer, ``token_ids`` and, asked for with ``logprobs``, ``logprobs.content`` in each
choice, with each token's ``top_logprobs`` likeliest alternatives when asked), ``n`` choices
(seeded ``seed, seed+1, ...``; submitted at once, so a local server batches them), and refuse with a 400 what a local model cannot honour
(``response_format`` other than text, ``logit_bias``, non-text content, ``top_logprobs`` from a
model whose ``complete`` does not take it).

Tool calling on a local model is done in the prompt, in this format (the one Hermes- and
Qwen-style chat models are trained on):

* the tools offered are appended to the system message::

      You may call tools. To call one, answer with only
      <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>
      Tools: <tools>[{"name": ..., "description": ..., "parameters": {...}}]</tools>

* an earlier assistant tool call is shown as that ``<tool_call>`` text, and a tool's result as a
  user message ``<tool_response>{"name": ..., "content": ...}</tool_response>``;
* an answer holding ``<tool_call>...</tool_call>`` blocks whose JSON parses into a name the request
  offered becomes OpenAI ``tool_calls`` (finish reason ``tool_calls``), the text around them the
  content; anything else stays text.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from evolve.gateway.asgi import check_bind, is_loopback, need_http
from evolve.gateway.upstream import Result, Route, Upstream
from evolve.gateway.wire import GatewayError, Request, text_of
from evolve.llm.base import takes
from evolve.types import LLMCall, Message

if TYPE_CHECKING:  # pragma: no cover
    from evolve.gateway.app import HTTPGateway

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
TOOLS_PREAMBLE = (
    'You may call tools. To call one, answer with only\n<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>\n'
)
MAX_N = 64


def render(messages: list[dict], tools: list[dict] | None) -> list[dict[str, str]]:
    """OpenAI chat messages (with tools, tool calls, tool results) as plain role/content messages."""
    out: list[dict[str, str]] = []
    names: dict[str, str] = {}
    for m in messages:
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role == "assistant" and m.get("tool_calls"):
            parts = [text_of(m.get("content"))] if m.get("content") else []
            for c in m["tool_calls"]:
                fn = c.get("function") or {}
                names[c.get("id", "")] = fn.get("name", "")
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except json.JSONDecodeError:
                    args = fn.get("arguments")
                parts.append("<tool_call>" + json.dumps({"name": fn.get("name"), "arguments": args}) + "</tool_call>")
            out.append({"role": "assistant", "content": "\n".join(parts)})
        elif role in ("tool", "function"):
            name = names.get(m.get("tool_call_id", ""), m.get("name", ""))
            out.append(
                {
                    "role": "user",
                    "content": "<tool_response>"
                    + json.dumps({"name": name, "content": text_of(m.get("content"))})
                    + "</tool_response>",
                }
            )
        else:
            out.append({"role": role or "user", "content": text_of(m.get("content"))})
    if tools:
        specs = [
            {
                "name": t["function"]["name"],
                "description": t["function"].get("description", ""),
                "parameters": t["function"].get("parameters", {}),
            }
            for t in tools
        ]
        block = TOOLS_PREAMBLE + "Tools: <tools>" + json.dumps(specs) + "</tools>"
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def parse_tool_calls(text: str, tools: list[dict] | None) -> tuple[str | None, list[dict] | None]:
    """(content, tool_calls) of a local model's answer; tool calls only for tools that were offered."""
    if not tools or "<tool_call>" not in text:
        return text, None
    offered = {t["function"]["name"] for t in tools}
    calls = []
    for m in _CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or obj.get("name") not in offered:
            continue
        args = obj.get("arguments", {})
        calls.append(
            {
                "id": "call_" + secrets.token_hex(12),
                "type": "function",
                "function": {"name": obj["name"], "arguments": json.dumps(args if args is not None else {})},
            }
        )
    if not calls:
        return text, None
    rest = _CALL.sub("", text).strip()
    return rest or None, calls


# ----------------------------------------------------------------------------- a model in this process


def tokenizer_of(llm: Any) -> Any:
    """The tokenizer behind an LLM (``.tokenizer``, as :class:`~evolve.policy.local.LocalLM` has), if it
    can name tokens (``token_text``); looks through a rollout's recording wrapper."""
    for obj in (llm, getattr(llm, "_llm", None)):
        tok = getattr(obj, "tokenizer", None)
        if tok is not None and callable(getattr(tok, "token_text", None)):
            return tok
    return None


def _token_text(tokenizer: Any, token_id: int) -> str:
    fn = getattr(tokenizer, "token_text", None)
    if fn is not None:
        try:
            return str(fn(int(token_id)))
        except Exception:  # noqa: BLE001 - a token the tokenizer cannot name
            return str(token_id)
    return str(token_id)


def logprobs_content(out: Any, tokenizer: Any) -> list[dict[str, Any]] | None:
    """``choices[i].logprobs.content``: one entry per sampled token (None without log-probs), with
    its ``top_logprobs`` where the completion has them."""
    if out.token_ids is None or out.logprobs is None:
        return None

    def entry(tid: int, lp: float) -> dict[str, Any]:
        text = _token_text(tokenizer, tid)
        return {"token": text, "logprob": float(lp), "bytes": list(text.encode("utf-8"))}

    tops = getattr(out, "top_logprobs", None) or ()
    return [
        {**entry(tid, lp), "top_logprobs": [entry(t, v) for t, v in (tops[k] if k < len(tops) else ())]}
        for k, (tid, lp) in enumerate(zip(out.token_ids, out.logprobs))
    ]


# what OpenAI takes for top_logprobs
MAX_TOP_LOGPROBS = 20


def top_logprobs_of(req: Request) -> int:
    """The request's ``top_logprobs`` (0 when not asked): a 400 unless it is an integer from 0 to
    :data:`MAX_TOP_LOGPROBS` asked with ``logprobs: true``."""
    k = req.params.get("top_logprobs")
    if k is None:
        return 0
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOP_LOGPROBS:
        raise GatewayError(
            400, f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {k!r}", param="top_logprobs"
        )
    if k and not req.params.get("logprobs"):
        raise GatewayError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return k


def refuse_top_logprobs(what: str) -> GatewayError:
    return GatewayError(
        400, f"top_logprobs is not supported by {what} (its complete() takes no top_logprobs)", param="top_logprobs"
    )


def top_logprobs_kw(top: int, llm: Any, what: str) -> dict[str, int]:
    """What ``llm.complete`` gets for a request's ``top_logprobs``: nothing when not asked, else the
    keyword; a 400 (:func:`refuse_top_logprobs`) when its ``complete`` does not take it."""
    if not top:
        return {}
    if not takes(llm, "top_logprobs"):
        raise refuse_top_logprobs(what)
    return {"top_logprobs": top}


def _ids(values: Sequence[int] | None) -> list[int] | None:
    return None if values is None else [int(v) for v in values]


def _checked(req: Request) -> tuple[int, int | None, list[str] | None]:
    """(n, seed, stop) of a request a local model can answer; a 400 naming what it cannot honour."""
    p = req.params
    n = p.get("n") or 1
    if n > MAX_N:
        raise GatewayError(400, f"'n' must be at most {MAX_N}, got {n}", param="n")
    seed = p.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise GatewayError(400, f"'seed' must be an integer, got {seed!r}", param="seed")
    stop = p.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    elif stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise GatewayError(400, "'stop' must be a string or a list of strings", param="stop")
    fmt = p.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise GatewayError(
            400,
            'response_format other than {"type": "text"} is not supported by a local model',
            param="response_format",
        )
    if p.get("logit_bias"):
        raise GatewayError(400, "logit_bias is not supported by a local model", param="logit_bias")
    top_logprobs_of(req)
    for i, m in enumerate(req.messages):
        content = m.get("content")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if not (isinstance(part, str) or (isinstance(part, dict) and part.get("type") == "text")):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise GatewayError(
                    400,
                    f"messages[{i}].content[{j}]: only text content parts are supported by a local model, got {kind!r}",
                    param=f"messages[{i}].content",
                )
    return int(n), seed, stop


class ModelUpstream(Upstream):
    """What answers a route with a model in this process: :meth:`generate` (one completion, in a
    worker thread) is each kind's own; the rest (``n`` choices, tools in the prompt, token ids and
    log-probs in the answer, a stream sent once the answer is whole) is shared."""

    role: str = "policy"
    _cap: Any = None

    def generate(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float | None,
        max_tokens: int | None,
        stop: list[str] | None,
        seed: int | None,
        req: Request,
    ) -> tuple[Any, str | None, Any]:
        """One completion: (the :class:`~evolve.llm.base.Completion`, the id of the system that
        answered or None, the tokenizer that names its tokens or None)."""
        raise NotImplementedError

    def recorded(self, req: Request, call: LLMCall, system_id: str | None) -> None:
        """Each completion as an :class:`~evolve.types.LLMCall`, where this kind records it (if anywhere)."""

    records: bool = False  # whether recorded() wants the calls (they are built only then)
    # whether the n choices of a request are generated at once (concurrent calls of generate(), which a
    # local server batches) rather than one after another
    concurrent_choices: bool = True

    def served(self, system_id: str | None) -> dict[str, Any] | None:
        return None

    def model_names(self) -> list[str]:
        return [self.role]

    def target(self, asked: str) -> str:
        return f"local:{self.role}"

    def describe(self) -> str:
        return f"the local model ({self.role})"

    def _limiter(self) -> Any:
        """Local generations have threads of their own, so that they never hold up the trace store's."""
        import anyio

        if self._cap is None:
            self._cap = anyio.CapacityLimiter(16)
        return self._cap

    async def complete(self, req: Request) -> Result:
        import anyio

        from evolve.errors import LLMError

        n, seed, stop = _checked(req)
        msgs = render(req.messages, req.tools)
        temperature = req.params.get("temperature")
        max_tokens = req.params.get("max_completion_tokens") or req.params.get("max_tokens")

        def one(i: int) -> tuple[Any, str | None, Any, float]:
            t0 = time.perf_counter()
            out, sid, tok = self.generate(
                msgs,
                temperature=temperature,
                max_tokens=max_tokens,
                stop=stop,
                seed=None if seed is None else (seed + i) % 2**63,
                req=req,
            )
            return out, sid, tok, time.perf_counter() - t0

        def run() -> tuple[list[Any], str | None, Any, dict | None]:
            if n > 1 and self.concurrent_choices:  # submitted at once: a local server samples them in one batch
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(n, thread_name_prefix="evolve-choice") as pool:
                    got = list(pool.map(one, range(n)))
            else:
                got = [one(i) for i in range(n)]
            for out, sid, _tok, took in got:  # recorded in the choices' order
                if self.records:
                    used = temperature if temperature is not None else out.extra.get("temperature")
                    self.recorded(
                        req,
                        LLMCall(
                            role=self.role,
                            model=out.model,
                            messages=msgs,
                            output=out.text,
                            prompt_token_ids=out.prompt_token_ids,
                            token_ids=out.token_ids,
                            logprobs=out.logprobs,
                            temperature=None if used is None else float(used),
                            finish_reason=out.finish_reason,
                            prompt_tokens=out.prompt_tokens,
                            completion_tokens=out.completion_tokens,
                            cost=out.cost,
                            duration=took,
                        ),
                        sid,
                    )
            _, sid, tok, _ = got[-1]
            return [g[0] for g in got], sid, tok, self.served(sid)

        try:
            outs, sid, tok, served = await anyio.to_thread.run_sync(run, limiter=self._limiter())
        except LLMError as e:
            status = 400 if getattr(e, "category", None) == "request" else 500
            raise GatewayError(status, f"the local model failed: {e}", code="model_error") from None
        except (TypeError, ValueError) as e:
            raise GatewayError(400, f"the local model cannot take this request: {e}") from None
        logprobs = bool(req.params.get("logprobs"))
        choices: list[dict[str, Any]] = []
        for i, out in enumerate(outs):
            content, calls = parse_tool_calls(out.text, req.tools)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": {"content": logprobs_content(out, tok)} if logprobs else None,
                    "finish_reason": "tool_calls" if calls else (out.finish_reason or "stop"),
                    "token_ids": _ids(out.token_ids),
                }
            )
        first = outs[0]
        done = sum(o.completion_tokens for o in outs)
        raw = {
            "object": "chat.completion",
            "created": int(time.time()),
            "model": first.model,
            "choices": choices,
            "usage": {
                "prompt_tokens": first.prompt_tokens,
                "completion_tokens": done,
                "total_tokens": first.prompt_tokens + done,
            },
            "prompt_token_ids": _ids(first.prompt_token_ids),
        }
        answer = choices[0]
        return Result(
            text=answer["message"]["content"],
            tool_calls=answer["message"].get("tool_calls"),
            finish_reason=answer["finish_reason"],
            model=first.model,
            prompt_tokens=first.prompt_tokens,
            completion_tokens=done,
            cost=None,
            raw=raw,
            prompt_token_ids=_ids(first.prompt_token_ids),
            token_ids=_ids(first.token_ids),
            logprobs=[float(x) for x in first.logprobs] if first.logprobs is not None else None,
            system_id=sid,
            served=served,
        )

    async def stream(self, req: Request) -> AsyncIterator[dict[str, Any] | Result]:
        """The whole answer first, then sent as chunks (a local model samples an answer at once)."""
        res = await self.complete(req)
        base = {"object": "chat.completion.chunk", "created": res.raw["created"], "model": res.model}
        for c in res.raw["choices"]:
            i, msg = c["index"], c["message"]
            head = {"prompt_token_ids": res.raw["prompt_token_ids"]} if i == 0 else {}
            yield {
                **base,
                "choices": [
                    {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                ],
                **head,
            }
            if msg["content"] is not None:
                yield {
                    **base,
                    "choices": [
                        {
                            "index": i,
                            "delta": {"content": msg["content"]},
                            "logprobs": c["logprobs"],
                            "finish_reason": None,
                            "token_ids": c["token_ids"],
                        }
                    ],
                }
            for k, call in enumerate(msg.get("tool_calls") or []):
                yield {**base, "choices": [{"index": i, "delta": {"tool_calls": [{"index": k, **call}]}}]}
            yield {
                **base,
                "choices": [{"index": i, "delta": {}, "logprobs": None, "finish_reason": c["finish_reason"]}],
            }
        yield {**base, "choices": [], "usage": res.raw["usage"]}
        yield res  # the whole answer, token ids and all, for the record (not sent)


@dataclass
class LLMUpstream(ModelUpstream):
    """One LLM object, answering to ``names`` (its own is not closed with the route)."""

    llm: Any
    names: list[str]
    role: str = "policy"
    on_call: Callable[[LLMCall], None] | None = None
    _tok: Any = field(default=None, init=False, repr=False)
    _cap: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._tok = tokenizer_of(self.llm)

    @property
    def records(self) -> bool:  # type: ignore[override]
        return self.on_call is not None

    def recorded(self, req: Request, call: LLMCall, system_id: str | None) -> None:
        self.on_call(call)  # type: ignore[misc]

    def model_names(self) -> list[str]:
        return list(self.names)

    def describe(self) -> str:
        return f"the model {self.names[0]!r}"

    def generate(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float | None,
        max_tokens: int | None,
        stop: list[str] | None,
        seed: int | None,
        req: Request,
    ) -> tuple[Any, str | None, Any]:
        out = self.llm.complete(
            [Message(**m) for m in messages],
            temperature=temperature,
            max_tokens=max_tokens,
            stop=stop,
            seed=seed,
            **top_logprobs_kw(top_logprobs_of(req), self.llm, self.describe()),
        )
        return out, None, self._tok


def serve_llm(
    llm: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    names: Sequence[str] = (),
    fingerprint: str | None = None,
    any_model: bool = False,
    on_call: Callable[[LLMCall], None] | None = None,
) -> HTTPGateway:
    """Serve one LLM object behind the gateway's OpenAI (and Anthropic) endpoints, started on a
    background thread; ``close()`` it (the LLM stays open). ``names`` are the model names it answers
    to (``any_model``: every name), ``fingerprint`` is sent as ``system_fingerprint``, ``on_call``
    gets each completion as an :class:`~evolve.types.LLMCall`. Sessions (``/s/<name>/v1``) share it."""
    from evolve.gateway.app import Gateway, HTTPGateway

    check_bind(host, api_key)
    need_http("serving a model")
    up = LLMUpstream(llm, list(names) or [str(getattr(llm, "name", "model"))], on_call=on_call)
    route = Route("model", [*up.names, "*"] if any_model else [], up, system_id=fingerprint)
    gateway = Gateway([route], None, api_key=api_key or None, loopback=is_loopback(host))
    return HTTPGateway(gateway, host, port, "evolve serve").start()


__all__ = [
    "LLMUpstream",
    "MAX_TOP_LOGPROBS",
    "ModelUpstream",
    "TOOLS_PREAMBLE",
    "logprobs_content",
    "parse_tool_calls",
    "refuse_top_logprobs",
    "render",
    "serve_llm",
    "tokenizer_of",
    "top_logprobs_kw",
    "top_logprobs_of",
]
