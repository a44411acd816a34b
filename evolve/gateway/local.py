"""Routes answered by a model in this process: a run's current system (its base and LoRA
adapter, followed as the archive promotes or rolls back: :class:`LocalUpstream`, over a
:class:`ServeApp`), or one LLM object (:class:`LLMUpstream`, :func:`serve_llm`). The rollouts'
own endpoint (:mod:`evolve.gateway.rollout_route`) is one more. They answer with the exact token
ids and log-probs of every answer (``prompt_token_ids`` at the top of an OpenAI answer,
``token_ids`` and, asked for with ``logprobs``, ``logprobs.content`` in each choice), ``n``
choices (seeded ``seed, seed+1, ...``), and refuse with a 400 what a local model cannot honour
(``response_format`` other than text, ``logit_bias``, ``top_logprobs``, non-text content).

``evolve serve RUN_DIR`` is the gateway with one such route on the run (:meth:`ServeApp.start`):
no trace store, every call recorded as an :class:`~evolve.types.LLMCall` in
``RUN_DIR/serve/calls.jsonl``, in its session (``/s/<session>/v1``, else ``default``).

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

import collections
import json
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.errors import UserError
from evolve.gateway.asgi import check_bind, is_loopback, need_http
from evolve.gateway.upstream import Result, Route
from evolve.gateway.wire import GatewayError, Request, text_of
from evolve.types import LLMCall, Message

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Self

    from evolve.gateway.app import HTTPGateway

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
TOOLS_PREAMBLE = ("You may call tools. To call one, answer with only\n"
                  '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>\n')
CALLS_FILE = Path("serve") / "calls.jsonl"
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
    """``choices[i].logprobs.content``: one entry per sampled token (None without log-probs)."""
    if out.token_ids is None or out.logprobs is None:
        return None
    entries = []
    for tid, lp in zip(out.token_ids, out.logprobs):
        text = _token_text(tokenizer, tid)
        entries.append({"token": text, "logprob": float(lp), "bytes": list(text.encode("utf-8")), "top_logprobs": []})
    return entries


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
        raise GatewayError(400, "response_format other than {\"type\": \"text\"} is not supported by a local model",
                           param="response_format")
    if p.get("logit_bias"):
        raise GatewayError(400, "logit_bias is not supported by a local model", param="logit_bias")
    if p.get("top_logprobs"):
        raise GatewayError(400, "top_logprobs > 0 is not supported by a local model (logprobs=true gives the "
                           "sampled tokens')", param="top_logprobs")
    for i, m in enumerate(req.messages):
        for j, part in enumerate(m.get("content") if isinstance(m.get("content"), list) else ()):
            if not (isinstance(part, str) or (isinstance(part, dict) and part.get("type") == "text")):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise GatewayError(400, f"messages[{i}].content[{j}]: only text content parts are supported by a "
                                   f"local model, got {kind!r}", param=f"messages[{i}].content")
    return int(n), seed, stop


class ModelUpstream:
    """What answers a route with a model in this process: :meth:`generate` (one completion, in a
    worker thread) is each kind's own; the rest (``n`` choices, tools in the prompt, token ids and
    log-probs in the answer, a stream sent once the answer is whole) is shared."""

    role: str = "policy"
    _cap: Any = None

    def generate(self, messages: list[dict[str, str]], *, temperature: float | None, max_tokens: int | None,
                 stop: list[str] | None, seed: int | None, req: Request) -> tuple[Any, str | None, Any]:
        """One completion: (the :class:`~evolve.llm.base.Completion`, the id of the system that
        answered or None, the tokenizer that names its tokens or None)."""
        raise NotImplementedError

    def recorded(self, req: Request, call: LLMCall, system_id: str | None) -> None:
        """Each completion as an :class:`~evolve.types.LLMCall`, where this kind records it (if anywhere)."""

    records: bool = False  # whether recorded() wants the calls (they are built only then)

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

        def run() -> tuple[list[Any], str | None, Any, dict | None]:
            outs, sid, tok = [], None, None
            for i in range(n):
                t0 = time.perf_counter()
                out, sid, tok = self.generate(msgs, temperature=temperature, max_tokens=max_tokens, stop=stop,
                                              seed=None if seed is None else (seed + i) % 2**63, req=req)
                if self.records:
                    used = temperature if temperature is not None else out.extra.get("temperature")
                    self.recorded(req, LLMCall(
                        role=self.role, model=out.model, messages=msgs, output=out.text,
                        prompt_token_ids=out.prompt_token_ids, token_ids=out.token_ids, logprobs=out.logprobs,
                        temperature=None if used is None else float(used), finish_reason=out.finish_reason,
                        prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens, cost=out.cost,
                        duration=time.perf_counter() - t0), sid)
                outs.append(out)
            return outs, sid, tok, self.served(sid)

        try:
            outs, sid, tok, served = await anyio.to_thread.run_sync(run, limiter=self._limiter())
        except LLMError as e:
            status = 400 if getattr(e, "category", None) == "request" else 500
            raise GatewayError(status, f"the local model failed: {e}", code="model_error") from None
        except (TypeError, ValueError) as e:
            raise GatewayError(400, f"the local model cannot take this request: {e}") from None
        logprobs = bool(req.params.get("logprobs"))
        choices = []
        for i, out in enumerate(outs):
            content, calls = parse_tool_calls(out.text, req.tools)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            choices.append({"index": i, "message": message,
                            "logprobs": {"content": logprobs_content(out, tok)} if logprobs else None,
                            "finish_reason": "tool_calls" if calls else (out.finish_reason or "stop"),
                            "token_ids": _ids(out.token_ids)})
        first = outs[0]
        done = sum(o.completion_tokens for o in outs)
        raw = {"object": "chat.completion", "created": int(time.time()), "model": first.model, "choices": choices,
               "usage": {"prompt_tokens": first.prompt_tokens, "completion_tokens": done,
                         "total_tokens": first.prompt_tokens + done},
               "prompt_token_ids": _ids(first.prompt_token_ids)}
        one = choices[0]
        return Result(text=one["message"]["content"], tool_calls=one["message"].get("tool_calls"),
                      finish_reason=one["finish_reason"], model=first.model, prompt_tokens=first.prompt_tokens,
                      completion_tokens=done, cost=None, raw=raw, prompt_token_ids=_ids(first.prompt_token_ids),
                      token_ids=_ids(first.token_ids),
                      logprobs=[float(x) for x in first.logprobs] if first.logprobs is not None else None,
                      system_id=sid, served=served)

    async def stream(self, req: Request) -> AsyncIterator[dict[str, Any] | Result]:
        """The whole answer first, then sent as chunks (a local model samples an answer at once)."""
        res = await self.complete(req)
        base = {"object": "chat.completion.chunk", "created": res.raw["created"], "model": res.model}
        for c in res.raw["choices"]:
            i, msg = c["index"], c["message"]
            head = {"prompt_token_ids": res.raw["prompt_token_ids"]} if i == 0 else {}
            yield {**base, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                        "finish_reason": None}], **head}
            if msg["content"] is not None:
                yield {**base, "choices": [{"index": i, "delta": {"content": msg["content"]}, "logprobs": c["logprobs"],
                                            "finish_reason": None, "token_ids": c["token_ids"]}]}
            for k, call in enumerate(msg.get("tool_calls") or []):
                yield {**base, "choices": [{"index": i, "delta": {"tool_calls": [{"index": k, **call}]}}]}
            yield {**base, "choices": [{"index": i, "delta": {}, "logprobs": None, "finish_reason": c["finish_reason"]}]}
        yield {**base, "choices": [], "usage": res.raw["usage"]}
        yield res  # the whole answer, token ids and all, for the record (not sent)


@dataclass
class LocalUpstream(ModelUpstream):
    """``role`` of a run's current system (or of ``system``, pinned), served by a :class:`ServeApp`
    (which builds its model and follows the archive). ``record``: each call also in
    ``RUN_DIR/serve/calls.jsonl`` (``evolve serve``; the gateway records in its trace store)."""

    run: Path
    role: str = "policy"
    system: str | None = None
    follow: bool = True
    poll: float = 1.0
    record: bool = False
    _app: Any = field(default=None, init=False, repr=False)
    _owned: bool = field(default=True, init=False, repr=False)  # closed with the route (not when given one)
    _cap: Any = field(default=None, init=False, repr=False)

    @classmethod
    def of(cls, app: ServeApp, *, record: bool = True) -> LocalUpstream:
        """A route over an open :class:`ServeApp` (which its owner closes)."""
        up = cls(app.run_dir, app.role, follow=False, poll=app.poll, record=record)
        up._app, up._owned = app, False
        return up

    @property
    def records(self) -> bool:  # type: ignore[override]
        return self.record

    def open(self) -> LocalUpstream:
        if self._app is None:
            self._app = ServeApp(self.run, role=self.role, system=self.system, follow=self.follow, poll=self.poll,
                                 keep_earlier=2)
        return self

    def close(self) -> None:
        if self._app is not None and self._owned:
            self._app.close()
            self._app = None

    def describe(self) -> str:
        return f"the local model of {self.run} ({self.role})"

    def model_names(self) -> list[str]:
        return self.open()._app.model_names()

    @property
    def system_id(self) -> str | None:
        return None if self._app is None else self._app.system_id

    def generate(self, messages: list[dict[str, str]], *, temperature: float | None, max_tokens: int | None,
                 stop: list[str] | None, seed: int | None, req: Request) -> tuple[Any, str | None, Any]:
        from evolve.errors import LLMError

        self.open()
        kw = dict(temperature=temperature, max_tokens=max_tokens, stop=stop, seed=seed)
        try:
            out, sid = self._app.complete(messages, system_id=req.system, **kw)
        except (LLMError, TypeError, ValueError):
            raise
        except Exception as e:  # noqa: BLE001 - the session's own system cannot be served: the current one
            if req.system is None:
                raise
            self._app.log(f"cannot serve system {req.system[:12]} to its session ({type(e).__name__}: {e}); "
                          "serving the current system")
            out, sid = self._app.complete(messages, **kw)
        return out, sid, self._app.tokenizer(sid)

    def recorded(self, req: Request, call: LLMCall, system_id: str | None) -> None:
        self._app.record(req.session or "default", system_id or "", call)

    def served(self, system_id: str | None) -> dict[str, Any] | None:
        return None if system_id is None else self._app.spec_of(system_id)


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

    def generate(self, messages: list[dict[str, str]], *, temperature: float | None, max_tokens: int | None,
                 stop: list[str] | None, seed: int | None, req: Request) -> tuple[Any, str | None, Any]:
        out = self.llm.complete([Message(**m) for m in messages], temperature=temperature, max_tokens=max_tokens,
                                stop=stop, seed=seed)
        return out, None, self._tok


def serve_llm(llm: Any, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
              names: Sequence[str] = (), fingerprint: str | None = None, any_model: bool = False,
              on_call: Callable[[LLMCall], None] | None = None) -> HTTPGateway:
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


# ----------------------------------------------------------------------------- a run's current system


@dataclass(eq=False)
class _Handle:
    """One built LLM of one system; closed when retired and no request holds it."""

    system_id: str
    llm: Any
    names: list[str]
    temperature: float | None
    tokenizer: Any = None
    refs: int = 0
    retired: bool = False
    closed: bool = field(default=False, repr=False)


class ServeApp:
    """Serve ``role`` of a run's current system (or of ``system``, a unique id prefix or
    ``best``/``baseline``; a pinned system is never swapped). Use as a context manager, or
    call :meth:`close`. :meth:`start` begins answering HTTP (the gateway, on a daemon thread).

    The LLM is built through :data:`evolve.registry.llm_backends` with the run's artifact store.
    With ``follow=True`` (and no pinned system) a daemon thread polls the archive's current pointer
    every ``poll`` seconds; when the engine promotes another system (or ``evolve archive rollback``
    moves the pointer) it builds that system's LLM and swaps it in: requests already running finish
    on the old handle, which is closed after the last of them. Calls recorded (:meth:`record`) are
    appended as one JSON line ``{"session", "system_id", "time", "call": <LLMCall>}`` to
    ``<run_dir>/serve/calls.jsonl`` and kept in memory (the last ``keep`` per session) for :meth:`calls`."""

    def __init__(self, run_dir: str | Path, *, role: str = "policy", system: str | None = None, follow: bool = True,
                 poll: float = 1.0, keep: int = 10_000, log: Callable[[str], None] | None = None,
                 keep_earlier: int = 0) -> None:
        from evolve.archive import Archive

        self.run_dir = Path(run_dir)
        self.role = role
        self.poll = max(0.01, float(poll))
        self.pinned = system not in (None, "current")
        self.log = log or (lambda msg: print(f"evolve serve: {msg}", file=sys.stderr, flush=True))
        self.server: HTTPGateway | None = None
        self._keep = max(1, int(keep))
        self._calls: dict[str, collections.deque[LLMCall]] = {}
        self._lock = threading.Lock()
        self._file_lock = threading.Lock()
        self._file: Any = None
        self._stop = threading.Event()
        self.keep_earlier = max(0, int(keep_earlier))  # earlier systems' models kept for sessions that began on them
        self._others: collections.OrderedDict[str, _Handle] = collections.OrderedDict()
        self._build_lock = threading.Lock()
        self._failed: str | None = None  # a system whose LLM could not be built (not retried until it changes)
        self.archive = Archive(self.run_dir, create=False)
        try:
            self._handle = self._build(self.archive.resolve(system or "current"))
        except BaseException:
            self.archive.close()
            raise
        self._follower: threading.Thread | None = None
        if follow and not self.pinned:
            self._follower = threading.Thread(target=self._follow, name="evolve-serve-follow", daemon=True)
            self._follower.start()

    # ------------------------------------------------------------------ the served LLM

    @property
    def system_id(self) -> str:
        """The id of the system being served now."""
        return self._handle.system_id

    def _build(self, system_id: str) -> _Handle:
        from evolve.llm.cache import build_llm

        system = self.archive.get_system(system_id)
        spec = system.models.get(self.role)
        if spec is None:
            raise UserError(f"system {system_id[:12]} has no model role {self.role!r}; it has "
                            f"{sorted(system.models)}: pass --role")
        llm = build_llm(spec, self.archive.artifacts)  # a new one: the old handle closes after its requests
        names = list(dict.fromkeys([self.role, spec.name, system_id]))
        temp = spec.params.get("temperature")
        return _Handle(system_id, llm, names, None if temp is None else float(temp), tokenizer_of(llm))

    def swap_to(self, system_id: str) -> None:
        """Build the LLM of another system (an id prefix or a word) and serve it from now on (an
        earlier system's model still kept is taken back, not built again)."""
        sid = self.archive.resolve(system_id)
        with self._lock:
            kept = self._others.pop(sid, None)
        new = kept if kept is not None and not kept.closed else self._build(sid)
        new.retired = False
        to_close = []
        with self._lock:
            old, self._handle = self._handle, new
            if self.keep_earlier:
                self._others[old.system_id] = old
                to_close = self._evict()
            else:
                old.retired = True
                if old.refs == 0:
                    to_close = [old]
        for h in to_close:
            self._close_handle(h)
        self.log(f"now serving system {new.system_id[:12]} (was {old.system_id[:12]})")

    def _follow(self) -> None:
        while not self._stop.wait(self.poll):
            cur = None
            try:
                cur = self.archive.current()
                if cur is None or cur == self._handle.system_id or cur == self._failed:
                    continue
                self.swap_to(cur)
                self._failed = None
            except Exception as e:  # noqa: BLE001 - keep serving the old system
                if self._stop.is_set():
                    return
                self._failed = cur
                self.log(f"cannot serve the new current system {str(cur)[:12]}: {type(e).__name__}: {e}; "
                         f"still serving {self._handle.system_id[:12]}")

    def _acquire(self) -> _Handle:
        with self._lock:
            h = self._handle
            h.refs += 1
            return h

    def _evict(self) -> list[_Handle]:
        """Under the lock: retire the least recent kept models past ``keep_earlier``; those no request
        holds are returned to be closed (the others close on their last release)."""
        out = []
        while len(self._others) > self.keep_earlier:
            _, old = self._others.popitem(last=False)
            old.retired = True
            if old.refs == 0:
                out.append(old)
        return out

    def _acquire_other(self, system_id: str) -> _Handle:
        """A handle on an earlier system, kept (at most ``keep_earlier``) while sessions that began on
        it go on; one build at a time, so concurrent requests for it wait for one model."""
        with self._lock:
            h = self._others.get(system_id)
            if h is not None and not h.closed:
                self._others.move_to_end(system_id)
                h.refs += 1
                return h
        with self._build_lock:
            with self._lock:  # built by another request while this one waited
                h = self._others.get(system_id)
                if h is not None and not h.closed:
                    h.refs += 1
                    return h
            new = self._build(system_id)
            with self._lock:
                self._others[system_id] = new
                new.refs += 1
                evicted = self._evict() if self.keep_earlier else []
                if not self.keep_earlier:  # nothing is kept: this one closes after its request
                    self._others.pop(system_id, None)
                    new.retired = True
        for old in evicted:
            self._close_handle(old)
        return new

    def _release(self, h: _Handle) -> None:
        with self._lock:
            h.refs -= 1
            close_now = h.retired and h.refs == 0
        if close_now:
            self._close_handle(h)

    def _close_handle(self, h: _Handle) -> None:
        with self._lock:
            if h.closed:
                return
            h.closed = True
        try:
            h.llm.close()
        except Exception as e:  # noqa: BLE001
            self.log(f"closing the model of {h.system_id[:12]} failed: {type(e).__name__}: {e}")

    def complete(self, messages: Any, *, temperature: float | None = None, max_tokens: int | None = None,
                 stop: Any = None, seed: int | None = None, system_id: str | None = None) -> tuple[Any, str]:
        """One completion by the system served now (or by ``system_id``: a session that began on an
        earlier system stays on it), unrecorded (its route records it: :meth:`record`, or the trace store): (the
        :class:`~evolve.llm.base.Completion`, the id of the system that answered)."""
        h = self._acquire() if system_id is None or system_id == self._handle.system_id else self._acquire_other(system_id)
        try:
            out = h.llm.complete(messages, temperature=h.temperature if temperature is None else temperature,
                                 max_tokens=max_tokens, stop=stop, seed=seed)
        finally:
            self._release(h)
        return out, h.system_id

    def spec_of(self, system_id: str) -> dict[str, Any]:
        """What a recorded call needs to say about the model that answered: its base and adapter
        (artifact refs), so token ids are only ever trained on with the tokenizer they came from."""
        spec = self.archive.get_system(system_id).models.get(self.role)
        def sha(ref: Any) -> str | None:
            return None if ref is None else ref.sha256

        return {"role": self.role, "base": sha(getattr(spec, "base", None)), "adapter": sha(getattr(spec, "adapter", None))}

    # ------------------------------------------------------------------ recording

    def record(self, session: str, system_id: str, call: LLMCall) -> None:
        """Keep ``call`` (answered by ``system_id`` in ``session``) and append it to ``serve/calls.jsonl``."""
        line = json.dumps({"session": session, "system_id": system_id, "time": time.time(),
                           "call": call.model_dump(mode="json")}, ensure_ascii=False)
        with self._lock:
            calls = self._calls.get(session)
            if calls is None:
                calls = self._calls[session] = collections.deque(maxlen=self._keep)
            calls.append(call)
        with self._file_lock:
            if self._file is None:
                path = self.run_dir / CALLS_FILE
                path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            self._file.write(line + "\n")
            self._file.flush()

    def calls(self, session: str = "default") -> list[LLMCall]:
        """The calls recorded in this process for ``session`` (the last ``keep``), oldest first."""
        with self._lock:
            return list(self._calls.get(session, ()))

    def sessions(self) -> list[str]:
        with self._lock:
            return sorted(self._calls)

    def model_names(self) -> list[str]:
        """The model names the served system answers to: the role, its model's name, its id."""
        return list(self._handle.names)

    def tokenizer(self, system_id: str | None) -> Any:
        """The tokenizer of ``system_id``'s model (served now, or kept for its sessions), if it names tokens."""
        with self._lock:
            h = self._handle if system_id in (None, self._handle.system_id) else self._others.get(system_id)
        return None if h is None else h.tokenizer

    # ------------------------------------------------------------------ HTTP

    def start(self, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
              log: Callable[[str], None] | None = None) -> HTTPGateway:
        """Answer HTTP on a daemon thread: the gateway with one route, this run's model (no trace
        store: calls go to ``serve/calls.jsonl``); ``api_key`` defaults to ``$EVOLVE_SERVE_API_KEY``."""
        from evolve.gateway.app import Gateway, HTTPGateway

        if self.server is not None:
            raise RuntimeError("this ServeApp is serving already")
        key = api_key if api_key is not None else os.environ.get("EVOLVE_SERVE_API_KEY") or None
        check_bind(host, key)
        need_http("evolve serve")
        route = Route("local", [], LocalUpstream.of(self))
        gateway = Gateway([route], None, api_key=key or None, log=log or self.log, loopback=is_loopback(host))
        self.server = HTTPGateway(gateway, host, port, "evolve serve").start()
        return self.server

    def close(self) -> None:
        """Stop the follower and the server, close the model (after running requests) and the archive."""
        self._stop.set()
        if self._follower is not None:
            self._follower.join(timeout=30)
        if self.server is not None:
            self.server.close()
        self._release(self._acquire_for_close())
        with self._lock:
            others = list(self._others.values())
            self._others.clear()
            idle = []
            for h in others:
                h.retired = True
                if h.refs == 0:
                    idle.append(h)
        for h in idle:
            self._close_handle(h)
        self.archive.close()
        with self._file_lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _acquire_for_close(self) -> _Handle:
        with self._lock:
            h = self._handle
            h.retired = True
            h.refs += 1
            return h

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



__all__ = ["CALLS_FILE", "LLMUpstream", "LocalUpstream", "ModelUpstream", "ServeApp", "TOOLS_PREAMBLE", "logprobs_content",
           "parse_tool_calls", "render", "serve_llm", "tokenizer_of"]
