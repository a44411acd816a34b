"""``evolve mcp``: serve the MCP server over stdio (what coding agents start) or streamable HTTP."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from evolve.errors import ConfigError, MissingDependency


def mcp_command(
    root: list[Path] | None = typer.Option(
        None,
        "--root",
        metavar="DIR",
        help="A folder the server may read and write (task "
        "files, runs, trace stores); repeatable. Default: the current folder.",
    ),
    http: bool = typer.Option(False, "--http", help="Serve streamable HTTP at /mcp instead of stdio."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="With --http: the address; beyond loopback --token is required."
    ),
    port: int = typer.Option(8770, "--port", min=0, max=65535, help="With --http: the port (0: any free port)."),
    token: str | None = typer.Option(
        None,
        "--token",
        metavar="TOKEN",
        envvar="EVOLVE_MCP_TOKEN",
        show_envvar=True,
        help="With --http: clients must send 'Authorization: Bearer TOKEN'.",
    ),
    allow_deploy: bool = typer.Option(
        False,
        "--allow-deploy",
        help="Let the promote and rollback tools change which system serves users (refused without it).",
    ),
    allow_key: list[str] | None = typer.Option(
        None,
        "--allow-key",
        metavar="NAME",
        help="A variable of this "
        "server's environment a client's task may name as a model's "
        "api_key_env (or a Harbor task's allow_env); repeatable. Default: "
        "none.",
    ),
    allow_host: list[str] | None = typer.Option(
        None,
        "--allow-host",
        metavar="HOST[:PORT]",
        help="A host a client's task may send model requests to (params.api_base); repeatable. Default: none.",
    ),
) -> None:
    """Let a coding agent drive evolvekit over the Model Context Protocol: task files, dry runs,
    background runs, reports, comparisons, deployment (docs/mcp.md)."""
    try:
        import mcp.server.mcpserver  # noqa: F401
    except ImportError:
        raise MissingDependency(
            "evolve mcp needs the Python package 'mcp', which is not installed; install it "
            "with: pip install 'evolvekit[mcp]'"
        ) from None
    from evolve.mcp.roots import Roots
    from evolve.mcp.server import build_server, check_bind, serve

    if token is not None and not token.strip():
        raise ConfigError(
            "evolve mcp: --token (or EVOLVE_MCP_TOKEN) is blank; give the token clients must send, "
            "or leave it out on loopback"
        )
    if http:
        check_bind(host, token)
    from evolve.mcp.grants import Grants

    grants = Grants.of(allow_key or [], allow_host or [])
    roots = Roots(root or [Path.cwd()])
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    server = build_server(roots, allow_deploy=allow_deploy, grants=grants)

    def announce(line: str) -> None:
        err.print(
            f"{line}; roots: {roots.describe()}; {grants.describe()}" + ("; deploy allowed" if allow_deploy else ""),
            markup=False,
        )
        sys.stderr.flush()

    serve(server, http=http, host=host, port=port, token=token, announce=announce)
