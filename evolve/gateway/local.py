"""A route answered by the project's own local model: the current system of a run (its base and
LoRA adapter), followed as the archive promotes or rolls back, with the exact token ids and
log-probs of every answer recorded for training.

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
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve.gateway.upstream import Result
from evolve.gateway.wire import GatewayError, Request, text_of

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
TOOLS_PREAMBLE = ("You may call tools. To call one, answer with only\n"
                  '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>\n')


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
            out.append({"role": "user", "content": "<tool_response>" + json.dumps(
                {"name": name, "content": text_of(m.get("content"))}) + "</tool_response>"})
        else:
            out.append({"role": role or "user", "content": text_of(m.get("content"))})
    if tools:
        specs = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                  "parameters": t["function"].get("parameters", {})} for t in tools]
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
        calls.append({"id": "call_" + secrets.token_hex(12), "type": "function",
                      "function": {"name": obj["name"], "arguments": json.dumps(args if args is not None else {})}})
    if not calls:
        return text, None
    rest = _CALL.sub("", text).strip()
    return rest or None, calls


@dataclass
class LocalUpstream:
    """``role`` of a run's current system (or of ``system``, pinned), served by
    :class:`~evolve.serve.app.ServeApp` (which builds its model and follows the archive)."""

    run: Path
    role: str = "policy"
    system: str | None = None
    follow: bool = True
    poll: float = 1.0
    _app: Any = field(default=None, init=False, repr=False)
    _cap: Any = field(default=None, init=False, repr=False)  # local generations' own threads (see _limiter)

    def open(self) -> LocalUpstream:
        from evolve.serve.app import ServeApp

        if self._app is None:
            self._app = ServeApp(self.run, role=self.role, system=self.system, follow=self.follow, poll=self.poll,
                                 keep_earlier=2)
        return self

    def _limiter(self) -> Any:
        """Local generations have threads of their own, so that they never hold up the trace store's."""
        import anyio

        if self._cap is None:
            self._cap = anyio.CapacityLimiter(16)
        return self._cap

    def close(self) -> None:
        if self._app is not None:
            self._app.close()
            self._app = None

    def target(self, asked: str) -> str:
        return f"local:{self.role}"

    def describe(self) -> str:
        return f"the local model of {self.run} ({self.role})"

    @property
    def system_id(self) -> str | None:
        return None if self._app is None else self._app.system_id

    async def complete(self, req: Request) -> Result:
        import anyio

        from evolve.errors import LLMError

        self.open()
        if int(req.params.get("n") or 1) != 1:
            raise GatewayError(400, "n > 1 is not supported on a local route; send n requests", param="n")
        msgs = render(req.messages, req.tools)
        stop = req.params.get("stop")
        max_tokens = req.params.get("max_completion_tokens") or req.params.get("max_tokens")
        def run() -> tuple[Any, str, dict]:
            kw = dict(temperature=req.params.get("temperature"), max_tokens=max_tokens,
                      stop=[stop] if isinstance(stop, str) else stop, seed=req.params.get("seed"))
            try:
                out, sid = self._app.complete(msgs, system_id=req.system, **kw)
            except (LLMError, TypeError, ValueError):
                raise
            except Exception as e:  # noqa: BLE001 - the session's own system cannot be served: the current one
                if req.system is None:
                    raise
                self._app.log(f"cannot serve system {req.system[:12]} to its session ({type(e).__name__}: {e}); "
                              "serving the current system")
                out, sid = self._app.complete(msgs, **kw)
            return out, sid, self._app.spec_of(sid)

        try:
            out, sid, served = await anyio.to_thread.run_sync(run, limiter=self._limiter())
        except LLMError as e:
            status = 400 if getattr(e, "category", None) == "request" else 500
            raise GatewayError(status, f"the local model failed: {e}") from None
        except (TypeError, ValueError) as e:
            raise GatewayError(400, f"the local model cannot take this request: {e}") from None
        content, calls = parse_tool_calls(out.text, req.tools)
        finish = "tool_calls" if calls else (out.finish_reason or "stop")
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        raw = {"object": "chat.completion", "created": 0, "model": out.model,
               "choices": [{"index": 0, "message": message, "finish_reason": finish,
                            "token_ids": list(out.token_ids) if out.token_ids is not None else None}],
               "usage": {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
                         "total_tokens": out.prompt_tokens + out.completion_tokens},
               "prompt_token_ids": list(out.prompt_token_ids) if out.prompt_token_ids is not None else None}
        return Result(text=content, tool_calls=calls, finish_reason=finish, model=out.model,
                      prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens, cost=None, raw=raw,
                      prompt_token_ids=list(out.prompt_token_ids) if out.prompt_token_ids is not None else None,
                      token_ids=list(out.token_ids) if out.token_ids is not None else None,
                      logprobs=[float(x) for x in out.logprobs] if out.logprobs is not None else None,
                      system_id=sid, served=served)

    async def stream(self, req: Request) -> AsyncIterator[dict[str, Any] | Result]:
        """The whole answer first, then sent as chunks (the local model samples an answer at once)."""
        res = await self.complete(req)
        base = {"object": "chat.completion.chunk", "created": 0, "model": res.model}
        yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        if res.text:
            yield {**base, "choices": [{"index": 0, "delta": {"content": res.text}}]}
        for i, c in enumerate(res.tool_calls or []):
            yield {**base, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, **c}]}}]}
        yield {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": res.finish_reason}]}
        yield {**base, "choices": [], "usage": res.raw["usage"]}
        yield res  # the whole answer, token ids and all, for the record (not sent)


__all__ = ["LocalUpstream", "TOOLS_PREAMBLE", "parse_tool_calls", "render"]
