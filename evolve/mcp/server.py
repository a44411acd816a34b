"""The MCP server: :func:`build_server` makes an ``MCPServer`` (the official ``mcp`` SDK) with the
tools of :mod:`evolve.mcp.tools` and the docs as resources; :func:`serve` runs it over stdio or
streamable HTTP.

Every tool call ends as an answer: a user's mistake (a bad path, an unknown run, an invalid task
file) is a tool error with its message; a bug is a tool error too (its traceback stays in the
server's log), and the server goes on answering.

Over HTTP the server binds loopback unless told otherwise, refuses other Host and Origin headers
there, on any loopback address (DNS rebinding), and beyond loopback requires a bearer token
(``--token``), compared in constant time.
"""

from __future__ import annotations

import functools
import hmac
import inspect
import json
import socket
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import ToolAnnotations
from pydantic import BaseModel, ConfigDict

from evolve.errors import ConfigError, EvolveError
from evolve.mcp.grants import Grants
from evolve.mcp.roots import Roots
from evolve.mcp.tools import TOOLS, Toolkit

TITLES = {
    "init_task": "Write a task file",
    "validate_task": "Check a task file",
    "dry_run": "Estimate what a run spends",
    "start_run": "Start a run",
    "resume_run": "Resume a run",
    "run_status": "A run's status",
    "wait_run": "Wait for a run",
    "stop_run": "Stop a run",
    "report": "A run's report",
    "compare_systems": "Compare two systems",
    "show_trajectory": "Read stored rollouts",
    "list_runs": "List the runs",
    "promote": "Promote a candidate",
    "rollback": "Roll back what serves",
    "deploy_status": "Deployment status",
    "traces_summary": "Summarise a trace store",
}
# what a client may call an argument by mistake -> its name (the rest: "did you mean" by spelling)
ALIASES = {
    "overrides": "sets",
    "override": "sets",
    "set": "sets",
    "settings": "sets",
    "task": "path",
    "task_file": "path",
    "file": "path",
    "taskfile": "path",
    "run": "run_id",
    "id": "run_id",
    "run_dir": "run_id",
    "rundir": "run_id",
    "timeout": "timeout_s",
    "output": "out",
    "out_dir": "out",
    "outdir": "out",
    "run_folder": "out",
    "force": "overwrite",
    "restart": "fresh",
    "system_id": "system",
    "candidate": "system",
    "reason": "why",
    "trace_store": "store",
}
READ_ONLY = {
    "validate_task",
    "dry_run",
    "run_status",
    "wait_run",
    "report",
    "compare_systems",
    "show_trajectory",
    "list_runs",
    "deploy_status",
    "traces_summary",
}
CHANGES_WHAT_SERVES = {"promote", "rollback"}
DOCS = Path(__file__).resolve().parents[2] / "docs"  # a source checkout's docs/ (not in a wheel)
SKILL = Path(__file__).resolve().parents[2] / "skills" / "evolvekit" / "SKILL.md"

INSTRUCTIONS = """\
evolvekit evolves an agent system (its prompts, memory, tools, workflow, weights) from its own experience.
The usual job: init_task (or an existing task file) -> validate_task -> dry_run (read what it would spend)
-> start_run -> wait_run / run_status until it ends -> report (quote gains with their 95% interval; an
interval that includes 0 is no gain) -> compare_systems (what changed, which tasks it fixed and broke)
-> promote or rollback (only when the server was started with --allow-deploy). A stopped run continues
with resume_run. Paths are relative to the server's --root folders. The task-file reference is the
resource evolvekit://docs/task-file-reference."""


def _guarded(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """The tool ``method`` with every failure raised as a ToolError carrying its message."""

    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except ToolError:
            raise
        except (EvolveError, OSError, ValueError, LookupError, sqlite3.Error) as e:  # sqlite3: a broken archive
            raise ToolError(_message(e)) from None

    call.__name__ = name
    return call


def _message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}" + (f": {e.filename}" if e.filename else "")
    return str(e) or type(e).__name__


class EvolveServer(MCPServer):
    """The SDK's server, except that a call naming an argument its tool does not take is refused
    (the SDK's argument models drop unknown keys: a misnamed ``sets`` would run the full budget)."""

    toolkit: Toolkit  # set by build_server

    def __init__(self, *args: Any, tools: list[Tool], **kwargs: Any) -> None:
        super().__init__(*args, tools=tools, **kwargs)
        self.arguments = {
            t.name: [f.alias or n for n, f in t.fn_metadata.arg_model.model_fields.items()] for t in tools
        }

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        known = self.arguments.get(name)
        unknown = sorted(set(arguments) - set(known)) if known is not None else []
        if unknown and known is not None:
            hints = "".join(f"{h} " for h in (_closest(u, known) for u in unknown) if h)
            raise ToolError(
                f"{name} has no argument {', '.join(repr(u) for u in unknown)}; {hints}{name} takes {', '.join(known)}"
            )
        return await super().call_tool(name, arguments, context)


def _closest(name: str, known: list[str]) -> str:
    """``did you mean 'X'?`` for a misnamed argument (a usual other name for it, or a close spelling), or ''."""
    from evolve.registry import did_you_mean

    meant = ALIASES.get(name.lower().replace("-", "_"))
    if meant in known:
        return f"did you mean {meant!r}?"
    hint = did_you_mean(name, known)
    return hint if hint.startswith("did you mean") else ""


def _tool(name: str, method: Callable[..., Any]) -> Tool:
    """The tool of ``method``, whose input schema has ``additionalProperties: false`` and whose
    argument model forbids what the schema does not name."""
    tool = Tool.from_function(
        _guarded(name, method),
        name=name,
        title=TITLES[name],
        description=inspect.getdoc(method),
        annotations=ToolAnnotations(
            title=TITLES[name],
            read_only_hint=name in READ_ONLY,
            destructive_hint=name in CHANGES_WHAT_SERVES or name == "stop_run",
            open_world_hint=False,
        ),
    )
    loose = tool.fn_metadata.arg_model
    strict: type[BaseModel] = type(
        loose.__name__, (loose,), {"model_config": ConfigDict(extra="forbid"), "__module__": __name__}
    )
    return tool.model_copy(
        update={
            "fn_metadata": tool.fn_metadata.model_copy(update={"arg_model": strict}),
            "parameters": strict.model_json_schema(by_alias=True),
        }
    )


def build_server(roots: Roots, *, allow_deploy: bool = False, grants: Grants | None = None) -> MCPServer:
    """The server over ``roots``; ``allow_deploy`` lets promote and rollback run; ``grants``: the
    keys and hosts a client's task may name (none by default)."""
    from evolve import __version__

    kit = Toolkit(roots, allow_deploy=allow_deploy, grants=grants)
    tools = [_tool(name, getattr(kit, name)) for name in TOOLS]
    server = EvolveServer(
        "evolvekit", title="evolvekit", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING", tools=tools
    )
    _add_resources(server)
    server.toolkit = kit  # tests and serve() reach the jobs through it
    return server


def _add_resources(server: MCPServer) -> None:
    from mcp.server.mcpserver.resources import FileResource, FunctionResource

    def reference() -> str:
        from evolve.task.reference import task_file_reference

        return task_file_reference()

    server.add_resource(
        FunctionResource.from_function(
            reference,
            uri="evolvekit://docs/task-file-reference",
            name="task-file-reference",
            description="Every task-file field with its type, default and meaning (generated from the config models)",
            mime_type="text/markdown",
        )
    )
    pages = sorted(DOCS.glob("*.md")) if DOCS.is_dir() else []
    if SKILL.is_file():
        pages.append(SKILL)
    for page in pages:
        stem = "skill" if page == SKILL else page.stem
        first = next(
            (ln.lstrip("# ").strip() for ln in page.read_text(errors="replace").splitlines() if ln.startswith("# ")),
            stem,
        )
        server.add_resource(
            FileResource(
                uri=f"evolvekit://docs/{stem}",
                name=stem,
                path=page,
                description=f"evolvekit docs: {first}",
                mime_type="text/markdown",
            )
        )


# ---------------------------------------------------------------------- transports


class BearerToken:
    """ASGI middleware: every HTTP request needs ``Authorization: Bearer TOKEN``."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            got = b""
            for key, value in scope.get("headers") or []:
                if key == b"authorization":
                    got = value
            if not hmac.compare_digest(got, self.expected):
                body = json.dumps({"error": "this evolve mcp server needs its token: Authorization: Bearer TOKEN"})
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": body.encode()})
                return
        await self.app(scope, receive, send)


def check_bind(host: str, token: str | None) -> None:
    from evolve.gateway.asgi import is_loopback

    if token is not None and not token.strip():
        raise ConfigError("evolve mcp: --token is empty; give a token clients must send, or leave it out on loopback")
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"evolve mcp: binding to {host!r} lets other machines drive runs and needs a token "
            "(--token TOKEN or EVOLVE_MCP_TOKEN); or bind to 127.0.0.1"
        )


def http_app(server: MCPServer, host: str, token: str | None) -> Any:
    """The streamable-HTTP ASGI app at ``/mcp`` (Host and Origin checked on loopback), behind the
    token if given. The SDK checks Host only for the spellings 127.0.0.1, localhost and ::1; any other
    loopback address (127.0.0.2, ``[::1]``) is checked here the same way, with its own name allowed."""
    from mcp.server.transport_security import TransportSecuritySettings

    from evolve.gateway.asgi import is_loopback

    security = None
    if is_loopback(host):
        bare = host.strip("[]")
        named = f"[{bare}]" if ":" in bare else bare
        names = sorted({"127.0.0.1", "localhost", "[::1]", named})
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=[f"{n}:*" for n in names],
            allowed_origins=[f"http://{n}:*" for n in names],
        )
    app = server.streamable_http_app(host=host.strip("[]"), transport_security=security)
    return BearerToken(app, token) if token else app


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise ConfigError(
            f"evolve mcp: cannot listen on {host}:{port}: {e.strerror or e}; choose another --port or --host"
        ) from None
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


def serve(
    server: MCPServer,
    *,
    http: bool = False,
    host: str = "127.0.0.1",
    port: int = 8770,
    token: str | None = None,
    announce: Callable[[str], None] = lambda line: None,
) -> None:
    """Serve until stdin closes (stdio) or Ctrl-C / SIGTERM (HTTP)."""
    import anyio

    if not http:
        announce("evolve mcp: serving over stdio")
        anyio.run(server.run_stdio_async)
        return
    check_bind(host, token)
    import uvicorn

    sock = bind(host, port)
    shown = host if ":" not in host else f"[{host.strip('[]')}]"
    config = uvicorn.Config(http_app(server, host, token), log_level="warning", access_log=False, lifespan="on")
    announce(
        f"evolve mcp at http://{shown}:{sock.getsockname()[1]}/mcp" + (" (bearer token required)" if token else "")
    )
    anyio.run(lambda: uvicorn.Server(config).serve(sockets=[sock]))


__all__ = ["BearerToken", "EvolveServer", "build_server", "check_bind", "serve"]
