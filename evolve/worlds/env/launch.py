"""Starting an environment server the world was given as an ASGI app (``server: "pkg.mod:app"``).

The app is served with uvicorn on 127.0.0.1, on a free port, on a background thread of the
process that first needs it (each worker process of a process or Ray runner starts its own), once
per import path, and stopped when that process exits."""

from __future__ import annotations

import atexit
import threading
from pathlib import Path
from typing import Any

from evolve.errors import ConfigError, InfraError, MissingDependency, UserError

_servers: dict[tuple[str, str | None], Any] = {}  # (import path, folder) -> ASGIServer
_lock = threading.Lock()


def load_app(path: Any, search: str | None = None, where: str = "dataset.params.server") -> Any:
    """The ASGI app at import path ``path`` (``search``: a folder put first on ``sys.path`` while
    importing, the task file's), or ConfigError saying what is wrong."""
    from evolve.registry import import_path

    if not isinstance(path, str) or ":" not in path:
        raise ConfigError(
            f"{path!r} is not an import path to an ASGI app; write it as 'package.module:app' (a module "
            "beside the task file works: 'wordgame:app')",
            path=where,
        )
    try:
        app = import_path(path, what="environment server", search=Path(search) if search else None)
    except UserError as e:
        raise ConfigError(str(e), path=where) from None
    if not callable(app):
        raise ConfigError(
            f"{path!r} is a {type(app).__name__}, not an ASGI app (a callable such as a Starlette or "
            "FastAPI application)",
            path=where,
        )
    return app


def serve(path: str, search: str | None = None) -> str:
    """The base URL (``http://127.0.0.1:PORT``) of the app at ``path``, started on first use."""
    key = (path, search)
    with _lock:
        server = _servers.get(key)
        if server is not None:
            return server.base
        try:
            import uvicorn  # noqa: F401
        except ImportError:
            raise MissingDependency(
                "world: env with a server import path needs the Python package 'uvicorn', "
                "which is not installed; install it with: pip install 'evolvekit[env]'"
            ) from None
        from evolve.gateway.asgi import ASGIServer

        app = load_app(path, search)
        try:
            server = ASGIServer(app, "127.0.0.1", 0, f"environment server {path}").start()
        except ConfigError as e:
            raise InfraError(f"could not start the environment server {path}: {e}", category="config") from None
        _servers[key] = server
        return server.base


def stop_all() -> None:
    """Stop every server this process started."""
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for s in servers:
        try:
            s.close()
        except Exception:  # noqa: BLE001 - at exit, nothing more to do
            pass


atexit.register(stop_all)

__all__ = ["load_app", "serve", "stop_all"]
