"""The HTTP side: one standard-library server that answers OpenAI chat-completions requests.

:class:`OpenAIServer` is a ``ThreadingHTTPServer`` (HTTP/1.1, keep-alive, exact
``Content-Length``) with one handler for these paths::

    GET  /v1/models                      POST /v1/chat/completions
    GET  /s/<session>/v1/models          POST /s/<session>/v1/chat/completions
    GET  /r/<token>/v1/models            POST /r/<token>/v1/chat/completions

A *router* ``router(kind, key)`` (kind ``None``, ``"s"`` or ``"r"``; key the session or the
token) returns the :class:`Target` that answers, or ``None`` (404). A target maps a parsed
:class:`~evolve.serve.protocol.ChatRequest` onto any object with the LLM protocol
(:class:`LLMTarget` for one plain LLM). Every failure is answered in the OpenAI error format
and never ends the server thread.

Binding to a non-loopback address needs an API key (``Authorization: Bearer <key>``, compared
in constant time); on loopback without a key every request is accepted.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Protocol

from evolve.errors import ConfigError, LLMError
from evolve.llm.base import Completion
from evolve.serve.protocol import (
    APIError,
    ChatRequest,
    chat_chunks,
    chat_response,
    models_list,
    parse_chat_request,
)
from evolve.types import LLMCall

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Self

MAX_BODY = 32 << 20
_PATH = re.compile(r"^(?:/(s|r)/([A-Za-z0-9_.~-]{1,128}))?/v1/(models|chat/completions)/?$")


@dataclass
class Answer:
    """What a target gives back for one request: one completion per choice."""

    completions: list[Completion]
    model: str
    fingerprint: str | None = None
    tokenizer: Any = None


class Target(Protocol):
    def model_names(self) -> list[str]: ...

    def accepts(self, model: str | None) -> bool: ...

    def chat(self, req: ChatRequest) -> Answer: ...


Router = Callable[[str | None, str | None], "Target | None"]


def tokenizer_of(llm: Any) -> Any:
    """The tokenizer behind an LLM (``.tokenizer``, as :class:`~evolve.policy.local.LocalLM` has), if it
    can name tokens (``token_text``); looks through a rollout's recording wrapper."""
    for obj in (llm, getattr(llm, "_llm", None)):
        tok = getattr(obj, "tokenizer", None)
        if tok is not None and callable(getattr(tok, "token_text", None)):
            return tok
    return None


def complete_n(llm: Any, req: ChatRequest, *, role: str = "policy", default_temperature: float | None = None,
               on_call: Callable[[LLMCall], None] | None = None) -> list[Completion]:
    """``req.n`` calls of ``llm.complete`` (seeds ``seed, seed+1, ...`` when a seed is given);
    each becomes an :class:`~evolve.types.LLMCall` passed to ``on_call``."""
    outs = []
    for i in range(req.n):
        t0 = time.perf_counter()
        out = llm.complete(req.messages, temperature=req.temperature, max_tokens=req.max_tokens, stop=req.stop,
                           seed=None if req.seed is None else (req.seed + i) % 2**63)
        if on_call is not None:
            temp = req.temperature if req.temperature is not None else out.extra.get("temperature", default_temperature)
            on_call(LLMCall(
                role=role, model=out.model, messages=req.messages, output=out.text,
                prompt_token_ids=out.prompt_token_ids, token_ids=out.token_ids, logprobs=out.logprobs,
                temperature=None if temp is None else float(temp), finish_reason=out.finish_reason,
                prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens, cost=out.cost,
                duration=time.perf_counter() - t0,
            ))
        outs.append(out)
    return outs


@dataclass
class LLMTarget:
    """Serve one LLM object. ``names`` are the model ids it answers to (and lists);
    ``any_model`` accepts every model id; ``fingerprint`` is sent as ``system_fingerprint``."""

    llm: Any
    names: Sequence[str] = ()
    fingerprint: str | None = None
    any_model: bool = False
    role: str = "policy"
    on_call: Callable[[LLMCall], None] | None = None
    _tok: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.names = list(self.names) or [str(getattr(self.llm, "name", "model"))]
        self._tok = tokenizer_of(self.llm)

    def model_names(self) -> list[str]:
        return list(self.names)

    def accepts(self, model: str | None) -> bool:
        return self.any_model or model is None or model in self.names

    def chat(self, req: ChatRequest) -> Answer:
        outs = complete_n(self.llm, req, role=self.role, on_call=self.on_call)
        return Answer(outs, model=outs[0].model if outs else self.names[0], fingerprint=self.fingerprint,
                      tokenizer=self._tok)


# ----------------------------------------------------------------------------- binding


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_blank(secret: str | None, what: str) -> None:
    """A key or token that was given but is empty or only whitespace is a mistake wherever the server
    binds (an unset variable expanded into ``--api-key "$KEY"``, a stray space): refuse it, naming
    ``what`` (e.g. "evolve serve: --api-key"), instead of starting a server that anyone can call."""
    if secret is not None and not secret.strip():
        raise ConfigError(f"{what} is blank ({'empty' if not secret else 'only whitespace'}); give the real key or "
                          "token, or leave it out and bind to 127.0.0.1")


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to expose a model beyond this machine without an API key, and a blank key anywhere."""
    refuse_blank(api_key, "evolve serve: the API key (--api-key or EVOLVE_SERVE_API_KEY)")
    if not api_key and not is_loopback(host):
        raise ConfigError(
            f"evolve serve: binding to {host!r} exposes the model beyond this machine and needs an API key; "
            "pass --api-key KEY (or set EVOLVE_SERVE_API_KEY), or bind to 127.0.0.1"
        )


# ----------------------------------------------------------------------------- HTTP


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    router: Router
    api_key: str | None
    log: Callable[[str], None] | None
    closed: bool = False


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "evolve-serve/1"
    timeout = 120  # an idle keep-alive connection is dropped after this many seconds
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.log is not None:
            self.server.log(f"{self.address_string()} {format % args}")

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _handle(self, method: str) -> None:
        self._body_read = method != "POST"
        try:
            try:
                self._dispatch(method)
            except APIError as e:
                self._send_json(e.status, e.body())
            except LLMError as e:
                self._send_json(500, APIError(500, str(e), type="server_error", code="model_error").body())
            except Exception as e:  # noqa: BLE001 - the server must outlive any failure
                msg = f"evolve serve: internal error: {type(e).__name__}: {e}"
                self._send_json(500, APIError(500, msg, type="server_error").body())
        except OSError:  # the client went away mid-answer
            self.close_connection = True

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            if self.headers.get("Transfer-Encoding"):
                raise APIError(411, "chunked request bodies are not supported; send a Content-Length")
            self._body_read = True
            return b""
        try:
            n = int(length)
        except ValueError:
            raise APIError(400, f"bad Content-Length {length!r}") from None
        if n < 0 or n > MAX_BODY:
            raise APIError(413, f"the request body is over {MAX_BODY} bytes")
        data = self.rfile.read(n)
        self._body_read = True
        return data

    def _authorized(self) -> bool:
        key = self.server.api_key
        if not key:
            return True
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode("utf-8", "replace"), f"Bearer {key}".encode())

    def _dispatch(self, method: str) -> None:
        body = self._read_body() if method == "POST" else b""
        if self.server.closed:
            self.close_connection = True
            raise APIError(503, "evolve serve is shutting down", type="server_error")
        if not self._authorized():
            raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                           type="invalid_request_error", code="invalid_api_key")
        path = self.path.split("?", 1)[0]
        m = _PATH.match(path)
        want = "GET" if m and m.group(3) == "models" else "POST"
        target = self.server.router(m.group(1), m.group(2)) if m else None
        if target is None:
            raise APIError(404, f"Invalid URL ({method} {path})", code="not_found")
        if method != want:
            raise APIError(405, f"{method} is not allowed on {path}; use {want}")
        if want == "GET":
            self._send_json(200, models_list(target.model_names()))
            return
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise APIError(400, f"the request body is not valid JSON: {e}") from None
        req = parse_chat_request(data)
        if not target.accepts(req.model):
            raise APIError(404, f"the model {req.model!r} does not exist here; served: {target.model_names()}",
                           param="model", code="model_not_found")
        ans = target.chat(req)
        kw = {"model": req.model or ans.model, "fingerprint": ans.fingerprint, "tokenizer": ans.tokenizer}
        if not req.stream:
            self._send_json(200, chat_response(req, ans.completions, **kw))
            return
        events = [f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in chat_chunks(req, ans.completions, **kw)]
        self._send(200, "".join(events + ["data: [DONE]\n\n"]).encode(), "text/event-stream; charset=utf-8",
                   {"Cache-Control": "no-cache"})

    def _send_json(self, status: int, value: Any) -> None:
        self._send(status, json.dumps(value, ensure_ascii=False).encode(), "application/json")

    def _send(self, status: int, data: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        if not self._body_read:  # the rest of the request was not read: do not reuse the connection
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


class OpenAIServer:
    """An OpenAI-compatible chat-completions server over ``router``; ``start()`` runs it on a
    daemon thread, ``serve_forever()`` in the calling thread. ``port=0`` picks a free port."""

    def __init__(self, router: Router, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        check_bind(host, api_key)
        cls = _HTTPServer6 if ":" in host else _HTTPServer
        try:
            self._httpd = cls((host.strip("[]"), int(port)), _Handler)
        except OSError as e:
            raise ConfigError(f"evolve serve: cannot listen on {host}:{port}: {e}") from None
        self._httpd.router, self._httpd.api_key, self._httpd.log = router, api_key or None, log
        self.host = host
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """The base URL to give OpenAI clients (ends in ``/v1``)."""
        host = self.host if self.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return f"http://{host}:{self.port}/v1"

    def start(self) -> OpenAIServer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                            name=f"evolve-serve-{self.port}", daemon=True)
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever(poll_interval=0.2)

    def close(self) -> None:
        """Stop accepting; requests already running finish on their own threads."""
        if self._httpd.closed:
            return
        self._httpd.closed = True
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=10)
        self._httpd.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_llm(llm: Any, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
              names: Sequence[str] = (), fingerprint: str | None = None,
              on_call: Callable[[LLMCall], None] | None = None) -> OpenAIServer:
    """Serve one LLM object (started; ``close()`` it). Sessions (``/s/<name>/v1``) share it."""
    target = LLMTarget(llm, names=names, fingerprint=fingerprint, on_call=on_call)
    return OpenAIServer(lambda kind, key: target if kind in (None, "s") else None,
                        host=host, port=port, api_key=api_key).start()


__all__ = ["Answer", "LLMTarget", "OpenAIServer", "Target", "check_bind", "complete_n", "is_loopback", "refuse_blank", "serve_llm",
           "tokenizer_of"]
