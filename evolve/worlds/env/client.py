"""Clients of an OpenEnv-style environment server: one episode, ``reset(seed)`` then ``step(action)``.

Two transports, each checked against what openenv-core's server (``openenv.core.env_server``)
sends and accepts:

* ``ws`` — the OpenEnv protocol over a WebSocket at ``<url>/ws`` (one environment per
  connection): send ``{"type": "reset", "data": {"seed": ...}}`` and ``{"type": "step", "data":
  <action>}``, receive ``{"type": "observation", "data": {"observation", "reward", "done"}}`` or
  ``{"type": "error", "data": {"message", "code"}}``; ``{"type": "close"}`` ends the session.
* ``http`` — ``POST <url>/reset`` with ``{"seed": ...}`` answering ``{"observation", "reward",
  "done"}`` and, from a server that keeps the episode between calls, a ``session_id``; then
  ``POST <url>/step`` with ``{"action": <action>}`` (plus ``"session_id"`` when one was given).
  A stock OpenEnv server builds a fresh environment for each HTTP request, so over HTTP only
  one-step episodes work there: ``auto`` takes the WebSocket whenever the server has one.

What goes wrong is told apart (:mod:`evolve.failures`): the server down, a timeout, a 5xx, an
answer that is not the protocol (not JSON, no ``observation``, a reward that is not a number)
raise :class:`~evolve.errors.InfraError` naming the URL and what was wrong (the world failing:
never a score); the server refusing the *action* (HTTP 422, an OpenEnv ``VALIDATION_ERROR`` on
a step) raises :class:`ActionRejected`, the agent's own failure.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from evolve.errors import ConfigError, InfraError, MissingDependency
from evolve.failures import http_category

TRANSPORTS = ("auto", "ws", "http")
_SNIPPET = 200


@dataclass(frozen=True)
class StepResult:
    """What the environment answered to a reset or a step."""

    observation: Any
    reward: float | None
    done: bool
    info: dict[str, Any]  # the answer's other top-level fields (e.g. session_id)

    def as_json(self) -> dict[str, Any]:
        return {"observation": self.observation, "reward": self.reward, "done": self.done}


class ActionRejected(Exception):
    """The server refused the action (it does not fit the environment's action schema): the
    agent's own failure, not the world's."""


# ----------------------------------------------------------------------------- URLs


def check_url(url: Any, where: str = "dataset.params.url") -> str:
    """``url`` as an http(s) base URL without a trailing slash (``ws://`` and ``wss://`` are
    taken as their http twins), or ConfigError saying what is wrong."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(
            f"the environment server's URL must be a non-empty string like 'http://127.0.0.1:8000', got {url!r}",
            path=where,
        )
    raw = url.strip()
    parts = urlsplit(raw)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme.lower(), parts.scheme.lower())
    if scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{raw!r} is not an environment server URL; write it as http://HOST:PORT (or https://, "
            "ws://, wss://), e.g. http://127.0.0.1:8000",
            path=where,
        )
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ConfigError(f"{raw!r} has a bad port; write it as http://HOST:PORT", path=where) from None
    if parts.query or parts.fragment:
        raise ConfigError(f"{raw!r}: an environment server URL takes no query or fragment", path=where)
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def ws_url(base: str) -> str:
    parts = urlsplit(base)
    return urlunsplit(({"http": "ws", "https": "wss"}[parts.scheme], parts.netloc, parts.path + "/ws", "", ""))


def _loopback(base: str) -> bool:
    from evolve.gateway.asgi import is_loopback

    return is_loopback(urlsplit(base).hostname or "")


def _snippet(text: Any) -> str:
    s = text if isinstance(text, str) else repr(text)
    s = " ".join(s.split())
    return s if len(s) <= _SNIPPET else s[: _SNIPPET - 1] + "…"


# ----------------------------------------------------------------------------- answers


def parse_result(payload: Any, *, where: str) -> StepResult:
    """An answer's ``{"observation", "reward", "done"}``, or InfraError(server) saying what is
    wrong with it. ``reward`` may be missing or null (no reward yet: OpenEnv's default), a number
    or a bool; ``done`` missing is False."""
    if not isinstance(payload, dict):
        raise InfraError(
            f"{where} answered {type(payload).__name__} {_snippet(payload)}, not an object with "
            "'observation', 'reward' and 'done'",
            category="server",
        )
    if "observation" not in payload:
        raise InfraError(
            f"{where} answered without 'observation' (keys: {sorted(payload)[:10]}); an OpenEnv-style "
            'server answers {"observation": ..., "reward": ..., "done": ...}',
            category="server",
        )
    reward = payload.get("reward")
    if reward is not None:
        if isinstance(reward, bool):
            reward = float(reward)
        elif isinstance(reward, (int, float)):
            reward = float(reward)
            if not math.isfinite(reward):
                raise InfraError(f"{where} answered a reward of {reward}, not a finite number", category="server")
        else:
            raise InfraError(
                f"{where} answered a reward of {_snippet(reward)} ({type(reward).__name__}), not a number",
                category="server",
            )
    done = payload.get("done", False)
    if done is None:
        done = False
    if isinstance(done, int) and not isinstance(done, bool) and done in (0, 1):
        done = bool(done)
    if not isinstance(done, bool):
        raise InfraError(f"{where} answered done={_snippet(done)}, not true or false", category="server")
    info = {k: v for k, v in payload.items() if k not in ("observation", "reward", "done")}
    return StepResult(payload["observation"], reward, done, info)


# ----------------------------------------------------------------------------- HTTP


def _httpx() -> Any:
    try:
        import httpx
    except ImportError:
        raise MissingDependency(
            "world: env needs the Python package 'httpx', which is not installed; "
            "install it with: pip install 'evolvekit[env]'"
        ) from None
    return httpx


class HTTPEnv:
    """One episode over ``POST /reset`` and ``POST /step``."""

    transport = "http"

    def __init__(self, base: str, *, timeout: float = 30.0) -> None:
        httpx = _httpx()
        self.base = base
        self.session_id: str | int | None = None
        self._client = httpx.Client(base_url=base, timeout=timeout, trust_env=not _loopback(base))

    def _post(self, path: str, body: dict[str, Any], *, stepping: bool) -> StepResult:
        httpx = _httpx()
        where = f"environment server {self.base} (POST {path})"
        try:
            r = self._client.post(path, json=body)
        except httpx.TimeoutException as e:
            raise InfraError(
                f"{where} timed out: {type(e).__name__}: {e}", category="timeout", retryable=True
            ) from None
        except httpx.TransportError as e:  # refused, reset, a broken answer
            raise InfraError(
                f"{where} is unreachable: {type(e).__name__}: {e}", category="unreachable", retryable=True
            ) from None
        if r.status_code >= 400:
            detail = _detail(r)
            cat = http_category(r.status_code)
            if stepping and r.status_code in (400, 422):
                raise ActionRejected(f"the environment refused the action (HTTP {r.status_code}): {detail}")
            if r.status_code == 404 and not stepping:
                raise InfraError(
                    f"{where} answered 404: the server has no /reset (an OpenEnv server in production "
                    f"mode serves only /ws: use transport: ws): {detail}",
                    category="not_found",
                )
            if r.status_code == 404:  # the episode's session is gone (expired, evicted, server restarted)
                raise InfraError(
                    f"{where} answered 404, the episode's session is gone: {detail}", category="server", retryable=True
                )
            if cat == "request":
                cat = "config"
            raise InfraError(
                f"{where} answered HTTP {r.status_code}: {detail}",
                category=cat,
                retryable=cat in ("server", "rate_limit", "timeout"),
            )
        try:
            payload = r.json()
        except ValueError:
            kind = r.headers.get("content-type", "no content type")
            raise InfraError(
                f"{where} answered something that is not JSON (HTTP {r.status_code}, {kind}): {_snippet(r.text)!r}",
                category="server",
            ) from None
        return parse_result(payload, where=where)

    def reset(self, **params: Any) -> StepResult:
        result = self._post("/reset", params, stepping=False)
        sid = result.info.get("session_id")
        self.session_id = sid if isinstance(sid, (str, int)) else None
        return result

    def step(self, action: dict[str, Any]) -> StepResult:
        body: dict[str, Any] = {"action": action}
        if self.session_id is not None:
            body["session_id"] = self.session_id
        return self._post("/step", body, stepping=True)

    def close(self) -> None:
        self._client.close()


def _detail(r: Any) -> str:
    try:
        body = r.json()
    except ValueError:
        return _snippet(r.text) or "(no body)"
    if isinstance(body, dict) and "detail" in body:
        body = body["detail"]
    return _snippet(body if isinstance(body, str) else json.dumps(body))


# ----------------------------------------------------------------------------- WebSocket


def _websockets() -> Any:
    try:
        import websockets
        import websockets.exceptions  # noqa: F401
        import websockets.sync.client  # noqa: F401
    except ImportError:
        raise MissingDependency(
            "world: env with transport 'ws' needs the Python package 'websockets', which is "
            "not installed; install it with: pip install 'evolvekit[env]' (or use transport: "
            "http)"
        ) from None
    return websockets


class NoWebSocket(Exception):
    """The server answered the WebSocket handshake with an HTTP status: it has no /ws."""


# WebSocket error codes of OpenEnv (WSErrorCode) that are not the world failing
_ACTION_CODES = {"VALIDATION_ERROR"}


class WSEnv:
    """One episode over the OpenEnv WebSocket protocol at ``<url>/ws``."""

    transport = "ws"

    def __init__(self, base: str, *, timeout: float = 30.0) -> None:
        ws = _websockets()
        self.base, self.url, self.timeout = base, ws_url(base), timeout
        where = f"environment server {self.url}"
        try:
            self._ws = ws.sync.client.connect(
                self.url,
                open_timeout=timeout,
                close_timeout=2,
                max_size=64 * 1024 * 1024,
                **({"proxy": None} if _loopback(base) else {}),
            )
        except ws.exceptions.InvalidStatus as e:
            raise NoWebSocket(f"{where} answered the WebSocket handshake with HTTP {e.response.status_code}") from None
        except TimeoutError as e:
            raise InfraError(
                f"{where} timed out opening the WebSocket: {e}", category="timeout", retryable=True
            ) from None
        except (OSError, ws.exceptions.InvalidHandshake, ws.exceptions.ConnectionClosed) as e:
            raise InfraError(
                f"{where} is unreachable: {type(e).__name__}: {e}", category="unreachable", retryable=True
            ) from None

    def _ask(self, message: dict[str, Any], what: str) -> StepResult:
        ws = _websockets()
        where = f"environment server {self.url} ({what})"
        try:
            self._ws.send(json.dumps(message))
            raw = self._ws.recv(timeout=self.timeout)
        except TimeoutError:
            raise InfraError(
                f"{where} sent no answer within {self.timeout:g}s", category="timeout", retryable=True
            ) from None
        except (OSError, ws.exceptions.ConnectionClosed) as e:
            raise InfraError(
                f"{where}: the connection broke: {type(e).__name__}: {e}", category="unreachable", retryable=True
            ) from None
        try:
            answer = json.loads(raw)
        except (ValueError, TypeError):
            raise InfraError(
                f"{where} answered something that is not JSON: {_snippet(raw)!r}", category="server"
            ) from None
        if not isinstance(answer, dict) or "type" not in answer:
            raise InfraError(
                f"{where} answered {_snippet(answer)}, not an OpenEnv message "
                '({"type": "observation" | "error", "data": ...})',
                category="server",
            )
        data = answer.get("data")
        if answer["type"] == "error":
            err = data if isinstance(data, dict) else {}
            text, code = _snippet(err.get("message", data)), str(err.get("code") or "")
            if what == "step" and code in _ACTION_CODES:
                raise ActionRejected(f"the environment refused the action ({code}): {text}")
            if code in _ACTION_CODES or code == "INVALID_JSON":
                raise InfraError(f"{where} refused the request ({code}): {text}", category="config")
            raise InfraError(
                f"{where} answered an error{f' ({code})' if code else ''}: {text}", category="server", retryable=True
            )
        if answer["type"] != "observation":
            raise InfraError(
                f"{where} answered a message of type {_snippet(answer['type'])}, not 'observation'", category="server"
            )
        return parse_result(data, where=where)

    def reset(self, **params: Any) -> StepResult:
        return self._ask({"type": "reset", "data": params}, "reset")

    def step(self, action: dict[str, Any]) -> StepResult:
        return self._ask({"type": "step", "data": action}, "step")

    def close(self) -> None:
        try:
            self._ws.send(json.dumps({"type": "close"}))
        except Exception:  # noqa: BLE001 - best effort, as OpenEnv's own client
            pass
        try:
            self._ws.close()
        except Exception:  # noqa: BLE001
            pass


# ----------------------------------------------------------------------------- choosing one

_chosen: dict[str, str] = {}  # base URL -> the transport "auto" found there
_chosen_lock = threading.Lock()


def connect(base: str, transport: str = "auto", *, timeout: float = 30.0) -> HTTPEnv | WSEnv:
    """A client of the server at ``base`` over ``transport``: ``ws``, ``http``, or ``auto`` (the
    WebSocket when the package ``websockets`` is installed and the server accepts the handshake,
    else HTTP; what it found is remembered per URL)."""
    if transport not in TRANSPORTS:
        raise ConfigError(f"transport {transport!r} is not one of {list(TRANSPORTS)}", path="dataset.params.transport")
    if transport == "auto":
        with _chosen_lock:
            transport = _chosen.get(base, "auto")
        if transport == "auto":
            try:
                _websockets()
            except MissingDependency:
                transport = "http"
            else:
                try:
                    env = WSEnv(base, timeout=timeout)
                except NoWebSocket:
                    transport = "http"
                else:
                    with _chosen_lock:
                        _chosen[base] = "ws"
                    return env
            with _chosen_lock:
                _chosen[base] = transport
    if transport == "ws":
        try:
            return WSEnv(base, timeout=timeout)
        except NoWebSocket as e:
            raise InfraError(
                f"{e}: it has no OpenEnv WebSocket endpoint; use transport: http if it serves /reset and /step",
                category="not_found",
            ) from None
    return HTTPEnv(base, timeout=timeout)


__all__ = [
    "TRANSPORTS",
    "ActionRejected",
    "HTTPEnv",
    "StepResult",
    "WSEnv",
    "check_url",
    "connect",
    "parse_result",
    "ws_url",
]
