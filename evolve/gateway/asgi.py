"""Serving an ASGI app with uvicorn, in the calling thread or on a background thread, and the
checks on where a server may bind. The port is checked before serving (a taken port is the user's
to fix, named), ``port=0`` takes a free one. The gateway (``evolve gateway``, ``evolve serve``, the
rollouts' endpoint) and the dashboard serve through it."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from evolve.errors import ConfigError

_Server = TypeVar("_Server", bound="ASGIServer")  # start() and ``with`` give back the subclass they are called on


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
        raise ConfigError(
            f"{what} is blank ({'empty' if not secret else 'only whitespace'}); give the real key or "
            "token, or leave it out and bind to 127.0.0.1"
        )


def check_bind(host: str, api_key: str | None) -> None:
    """``evolve serve``'s rule: no model exposed beyond this machine without an API key, and no blank key anywhere."""
    refuse_blank(api_key, "evolve serve: the API key (--api-key or EVOLVE_SERVE_API_KEY)")
    if not api_key and not is_loopback(host):
        raise ConfigError(
            f"evolve serve: binding to {host!r} exposes the model beyond this machine and needs an API key; "
            "pass --api-key KEY (or set EVOLVE_SERVE_API_KEY), or bind to 127.0.0.1"
        )


def need_http(what: str, extra: str = "gateway", names: tuple[str, ...] = ("starlette", "uvicorn")) -> None:
    """Refuse, naming the extra to install, when the HTTP stack is not installed."""
    from evolve.errors import MissingDependency

    for name in names:
        try:
            __import__(name)
        except ImportError:
            raise MissingDependency(
                f"{what} needs the Python package {name!r}, which is not installed; "
                f"install it with: pip install 'evolvekit[{extra}]'"
            ) from None


class ASGIServer:
    """``with ASGIServer(app, host, port, what) as s: s.base`` serves on a background thread;
    :meth:`run` serves in the calling thread until interrupted. ``on_close`` runs once the server
    has stopped (closing what the app holds)."""

    def __init__(self, app: Any, host: str, port: int, what: str, on_close: Callable[[], None] = lambda: None) -> None:
        self.app, self.host, self.what, self.on_close = app, host, what, on_close
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family) as probe:  # a port taken or an address not here: say so before serving
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
            try:
                probe.bind((host.strip("[]"), port))
            except OSError as e:
                on_close()
                raise ConfigError(
                    f"{what}: cannot listen on {host}:{port}: {e.strerror or e}; choose another --port or --host"
                ) from None
            if port == 0:
                port = int(probe.getsockname()[1])
        self.port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def base(self) -> str:
        host = self.host if self.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return f"http://{host}:{self.port}"

    def _uvicorn(self) -> Any:
        import uvicorn

        config = uvicorn.Config(
            self.app,
            host=self.host.strip("[]"),
            port=self.port,
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_keep_alive=30,
        )
        return uvicorn.Server(config)

    def run(self) -> None:
        self._server = self._uvicorn()
        try:
            self._server.run()
        finally:
            self.on_close()
        if not self._server.started:
            raise ConfigError(f"{self.what} could not listen on {self.host}:{self.port}; choose another --port")

    def start(self: _Server) -> _Server:
        """Serve on a background thread (once: a started server is returned as it is)."""
        if self._thread is not None:
            return self
        self._server = self._uvicorn()
        self._thread = threading.Thread(target=self._server.run, name=f"evolve-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ConfigError(f"{self.what} could not listen on {self.host}:{self.port}")
            time.sleep(0.02)
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
        self.on_close()

    def __enter__(self: _Server) -> _Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until_interrupted() -> None:
    """Block until Ctrl-C or SIGTERM, also when the process was started with them ignored (`cmd &`,
    nohup) or blocked (both are inherited across exec): how a server command waits."""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass


__all__ = ["ASGIServer", "check_bind", "is_loopback", "need_http", "refuse_blank", "wait_until_interrupted"]
