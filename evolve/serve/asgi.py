"""Serving an ASGI app with uvicorn, in the calling thread or on a background thread: the port is
checked before serving (a taken port is the user's to fix, named), ``port=0`` takes a free one.
The gateway and the dashboard serve through it."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable

from evolve.errors import ConfigError


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
                raise ConfigError(f"{what}: cannot listen on {host}:{port}: {e.strerror or e}; choose another "
                                  "--port or --host") from None
            if port == 0:
                port = int(probe.getsockname()[1])
        self.port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def base(self) -> str:
        host = self.host if self.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return f"http://{host}:{self.port}"

    def _uvicorn(self) -> Any:
        import uvicorn

        config = uvicorn.Config(self.app, host=self.host.strip("[]"), port=self.port, log_level="warning",
                                lifespan="off", access_log=False, timeout_keep_alive=30)
        return uvicorn.Server(config)

    def run(self) -> None:
        self._server = self._uvicorn()
        try:
            self._server.run()
        finally:
            self.on_close()
        if not self._server.started:
            raise ConfigError(f"{self.what} could not listen on {self.host}:{self.port}; choose another --port")

    def start(self) -> "ASGIServer":
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
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
        self.on_close()

    def __enter__(self) -> "ASGIServer":
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


__all__ = ["ASGIServer", "wait_until_interrupted"]
