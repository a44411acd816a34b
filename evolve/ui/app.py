"""The dashboard's web app: a JSON API over the runs and trace stores it was pointed at, and the
static page that draws it (``static/``: plain ES modules, Plotly from the ``plotly`` wheel).

Only GET routes exist and every store is opened read-only. The page never puts data into HTML
(it builds elements and sets their text), and the Content-Security-Policy allows scripts from
this origin only, so text in a trajectory — ``<script>`` included — is shown, never run.
Bound beyond loopback, every request needs the token (``Authorization: Bearer``, or once as
``?token=``, which becomes an HttpOnly cookie); the Host header is checked against the names
the server answers to (no DNS rebinding).
"""

from __future__ import annotations

import hmac
import math
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from evolve.errors import UserError
from evolve.ui.run import SPLITS, NotFound, RunView
from evolve.ui.traffic import TrafficView

STATIC = Path(__file__).parent / "static"
COOKIE = "evolve_ui_token"  # + the port: browsers share a host's cookies across its ports
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}


def plotly_js() -> Path:
    """The Plotly bundle that ships inside the ``plotly`` wheel (no CDN, no download)."""
    try:
        import plotly
    except ImportError:
        raise UserError(
            "evolve ui needs the Python package 'plotly' for its charts; pip install 'evolvekit[ui]'"
        ) from None
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise UserError(
            f"the plotly package has no bundled plotly.min.js at {path}; reinstall it: "
            "pip install --force-reinstall plotly"
        )
    return path


class Sources:
    """The runs and trace stores under the paths the dashboard was given, found again on each
    :meth:`refresh` (a run started later in a watched folder appears)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = [Path(p).resolve() for p in paths]
        self.runs: dict[str, RunView] = {}
        self.traffic: dict[str, TrafficView] = {}
        self._ids: dict[Path, str] = {}
        self._lock = threading.Lock()
        self.problems: dict[str, str] = {}
        for p in self.paths:
            if not p.is_dir():
                raise UserError(
                    f"evolve ui: {p} {'is not a folder' if p.exists() else 'does not exist'}; give run "
                    "directories (each with archive.sqlite), folders of them (watched: a run started "
                    "later appears), or a gateway's trace store folder"
                )
        self.refresh()

    def _id(self, path: Path) -> str:
        if path not in self._ids:
            base = re.sub(r"[^A-Za-z0-9._-]+", "-", path.name).strip("-.") or "run"
            taken = set(self._ids.values())
            rid, k = base, 2
            while rid in taken:
                rid, k = f"{base}-{k}", k + 1
            self._ids[path] = rid
        return self._ids[path]

    def shown(self, path: Path) -> str:
        """How the page names a folder: from the folder given on the command line, never the server's
        absolute path (a token holder on another machine need not learn the server's layout)."""
        for p in self.paths:
            if path == p:
                return p.name
            if p in path.parents:
                return f"{p.name}/{path.relative_to(p).as_posix()}"
        return path.name

    def hide(self, text: str) -> str:
        """``text`` with each given folder's absolute path said as its name."""
        for p in sorted(self.paths, key=lambda x: -len(str(x))):
            text = text.replace(str(p), p.name)
        return text

    def _found(self) -> list[Path]:
        out = []
        for p in self.paths:
            if (p / "archive.sqlite").is_file() or (p / "traces.sqlite").is_file():
                out.append(p)
            elif p.is_dir():
                out += sorted(
                    c
                    for c in p.iterdir()
                    if c.is_dir() and ((c / "archive.sqlite").is_file() or (c / "traces.sqlite").is_file())
                )
        return out

    def refresh(self) -> None:
        from evolve.errors import EvolveError

        with self._lock:
            known = {v.run_dir for v in self.runs.values()} | {v.dir for v in self.traffic.values()}
            for path in self._found():
                if path in known:
                    continue
                sid = self._id(path)
                try:
                    if (path / "archive.sqlite").is_file():
                        self.runs[sid] = RunView(path, sid, shown=self.shown(path))
                    if (path / "traces.sqlite").is_file():
                        tid = sid if sid not in self.runs else sid + "-traffic"
                        self.traffic[tid] = TrafficView(path, tid, shown=self.shown(path))
                    self.problems.pop(self.shown(path), None)
                except (EvolveError, OSError) as e:  # not ready yet (a run that is starting) or not ours
                    self.problems[self.shown(path)] = self.hide(str(e))

    def run(self, rid: str) -> RunView:
        if rid not in self.runs:
            self.refresh()  # a run started since the last look
        view = self.runs.get(rid)
        if view is None:
            raise NotFound(f"no run {rid!r} here")
        return view

    def store(self, tid: str) -> TrafficView:
        if tid not in self.traffic:
            self.refresh()
        view = self.traffic.get(tid)
        if view is None:
            raise NotFound(f"no trace store {tid!r} here")
        return view

    def views(self) -> tuple[list[RunView], list[TrafficView], dict[str, str]]:
        """What is here now (found again first), copied under the lock."""
        self.refresh()
        with self._lock:
            return list(self.runs.values()), list(self.traffic.values()), dict(self.problems)

    def release(self) -> None:
        """A request ended: this thread lets go of trace stores read through a gateway's files."""
        for v in list(self.traffic.values()):
            v.store.release()

    def close(self) -> None:
        for run in self.runs.values():
            run.close()
        for traffic in self.traffic.values():
            traffic.close()


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinity (a diverged loss, a -inf log-prob) as null: JSON has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def build_app(sources: Sources, *, token: str | None = None, hosts: Sequence[str] = ("127.0.0.1", "localhost")) -> Any:
    """The Starlette app serving ``sources`` (see the module docstring for what it guards)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.requests import Request
    from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    from evolve.ui import layers, system, traffic

    def api(fn: Callable[..., Any]) -> Callable[[Request], Any]:
        def endpoint(request: Request) -> Response:
            try:
                return JSONResponse(finite(fn(request, **request.path_params)))
            except NotFound as e:
                return JSONResponse({"error": str(e.args[0] if e.args else e)}, status_code=404)
            except (ValueError, UserError, OverflowError) as e:
                return JSONResponse({"error": str(e)}, status_code=400)
            finally:
                sources.release()

        return endpoint

    def q(request: Request, name: str, default: Any = None) -> Any:
        return request.query_params.get(name, default)

    def qint(request: Request, name: str, default: int) -> int:
        v = q(request, name)
        try:
            n = default if v in (None, "") else int(v)
        except ValueError:
            raise ValueError(f"{name} must be a whole number, got {v!r}") from None
        if not 0 <= n < 2**62:
            raise ValueError(f"{name} must be a whole number from 0, got {v!r}")
        return n

    def qsplit(request: Request, default: str | None, run: RunView) -> str | None:
        v = q(request, "split", default)
        if v in (None, "") and default is None:
            return None
        known = [*SPLITS, *run.other_splits()]  # and a world's own (IFEval's unseen)
        if v not in known:
            raise ValueError(f"split must be one of {', '.join(known)}, got {v!r}")
        return v

    def matrix(request: Request, run: RunView) -> Any:
        return system.matrix(run, qsplit(request, "val", run) or "val")

    def rollouts(request: Request, rid: str, ref: str) -> Any:
        run = sources.run(rid)
        return system.rollouts(
            run,
            ref,
            split=qsplit(request, None, run),
            phase=q(request, "phase"),
            failed=q(request, "failed") == "1",
            task=q(request, "task"),
            offset=qint(request, "offset", 0),
            limit=qint(request, "limit", 50),
        )

    def runs(request: Request) -> dict[str, Any]:
        found, stores, problems = sources.views()
        return {
            "runs": [v.summary() for v in found],
            "traffic": [v.summary() for v in stores],
            "problems": [{"path": p, "error": e} for p, e in problems.items()],
        }

    def version(request: Request, rid: str) -> dict[str, Any]:
        return {"version": sources.run(rid).version()}

    def summary(request: Request, rid: str) -> dict[str, Any]:
        run = sources.run(rid)
        v = run.version()  # read first: a write meanwhile makes the page draw once more, never miss it
        return {**run.summary(), **run.curves(), "curriculum": run.curriculum(), "version": v}

    def lineage(request: Request, rid: str) -> dict[str, Any]:
        expand = [x for x in (q(request, "expand") or "").split(",") if x]
        return sources.run(rid).lineage(expand, mode=q(request, "view") or "auto")

    def pair(ref: str) -> tuple[RunView, str]:
        rid, _, sid = ref.partition(":")
        if not sid:
            raise ValueError(f"compare takes RUN:SYSTEM, got {ref!r}")
        return sources.run(rid), sid

    def compare(request: Request) -> dict[str, Any]:
        (ra, a), (rb, b) = pair(q(request, "a") or ""), pair(q(request, "b") or "")
        return system.compare(ra, a, rb, b)

    def deploy(request: Request, rid: str) -> dict[str, Any]:
        return traffic.deployment(sources.run(rid), sources.views()[1])

    routes = [
        Route("/", lambda request: FileResponse(STATIC / "index.html", media_type="text/html")),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Route("/static/vendor/plotly.min.js", lambda request: FileResponse(plotly_js(), media_type="text/javascript")),
        Mount("/static", app=StaticFiles(directory=STATIC)),
        Route("/api/runs", api(runs)),
        Route("/api/runs/{rid}/version", api(version)),
        Route("/api/runs/{rid}/summary", api(summary)),
        Route("/api/runs/{rid}/lineage", api(lineage)),
        Route("/api/runs/{rid}/matrix", api(lambda r, rid: matrix(r, sources.run(rid)))),
        Route("/api/runs/{rid}/deploy", api(deploy)),
        Route("/api/runs/{rid}/systems/{ref}", api(lambda r, rid, ref: system.detail(sources.run(rid), ref))),
        Route("/api/runs/{rid}/systems/{ref}/rollouts", api(rollouts)),
        Route("/api/runs/{rid}/systems/{ref}/memory", api(lambda r, rid, ref: layers.memory(sources.run(rid), ref))),
        Route("/api/runs/{rid}/systems/{ref}/tools", api(lambda r, rid, ref: layers.tools(sources.run(rid), ref))),
        Route(
            "/api/runs/{rid}/systems/{ref}/workflow", api(lambda r, rid, ref: layers.workflow(sources.run(rid), ref))
        ),
        Route("/api/runs/{rid}/rollouts/{seq}", api(lambda r, rid, seq: system.trajectory(sources.run(rid), seq))),
        Route("/api/compare", api(compare)),
        Route("/api/traffic/{tid}", api(lambda r, tid: sources.store(tid).summary())),
        Route("/api/traffic/{tid}/version", api(lambda r, tid: {"version": sources.store(tid).version()})),
        Route(
            "/api/traffic/{tid}/sessions",
            api(
                lambda r, tid: sources.store(tid).sessions(
                    offset=qint(r, "offset", 0), limit=qint(r, "limit", 50), route=q(r, "route"), system=q(r, "system")
                )
            ),
        ),
        Route("/api/traffic/{tid}/sessions/{sid}", api(lambda r, tid, sid: sources.store(tid).session(sid))),
    ]

    class Guard:
        """Security headers on every answer; the token where one is set."""

        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return await self.app(scope, receive, send)
            request = Request(scope)
            cookie_name = f"{COOKIE}_{request.url.port or 80}"
            if token is not None:
                given = request.query_params.get("token")
                if given is not None and hmac.compare_digest(given.encode(), token.encode()):
                    # once from the printed URL, then a cookie: the token does not stay in the address bar
                    resp: Response = RedirectResponse(request.url.remove_query_params("token"), status_code=303)
                    resp.set_cookie(cookie_name, token, httponly=True, samesite="strict")
                    return await self._send(resp, scope, receive, send)
                auth = request.headers.get("authorization", "")
                bearer = auth[7:] if auth.lower().startswith("bearer ") else ""
                cookie = request.cookies.get(cookie_name, "")
                if not any(hmac.compare_digest(x.encode(), token.encode()) for x in (bearer, cookie) if x):
                    return await self._send(
                        PlainTextResponse(
                            "evolve ui: this dashboard needs its token: open the URL it printed (with ?token=...) or send "
                            "Authorization: Bearer TOKEN",
                            status_code=401,
                        ),
                        scope,
                        receive,
                        send,
                    )

            # the data changes under a live run: never cached; the page's own files (plotly's 4.6 MB) may be
            cache = "max-age=600" if scope["path"].startswith("/static/") else "no-store"

            async def with_headers(message: Any) -> None:
                if message["type"] == "http.response.start":
                    message.setdefault("headers", [])
                    have = {k.lower() for k, _ in message["headers"]}
                    for k, v in {**HEADERS, "cache-control": cache}.items():
                        if k.encode() not in have:
                            message["headers"].append((k.encode(), v.encode()))
                await send(message)

            await self.app(scope, receive, with_headers)

        async def _send(self, resp: Any, scope: Any, receive: Any, send: Any) -> None:
            for k, v in {**HEADERS, "cache-control": "no-store"}.items():
                resp.headers[k] = v
            await resp(scope, receive, send)

    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts)), Middleware(Guard)]
    return Starlette(routes=routes, middleware=middleware)
