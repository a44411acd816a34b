"""``evolve ui``: serve the dashboard until Ctrl-C."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

import typer
from rich.console import Console

from evolve.errors import UserError


def ui_command(
    paths: list[Path] | None = typer.Argument(
        None,
        help="Run directories, folders of runs, or a gateway's trace store folder (default: ./runs).",
        show_default=False,
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; beyond loopback a token is required."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="Port (0: any free port)."),
    token_env: str | None = typer.Option(
        None,
        "--token-env",
        help="The variable holding the token visitors "
        "must give; bound beyond loopback without one, a token is made and "
        "printed.",
    ),
) -> None:
    """A local web dashboard of runs (lineage, diffs, decisions, curves, per-task wins and losses,
    trajectories, memory, tools, workflows) and of a gateway's traffic; read-only, live while a run writes."""
    from evolve.gateway.asgi import is_loopback, wait_until_interrupted
    from evolve.ui import serve

    if not paths:
        if not Path("runs").is_dir():
            raise UserError(
                "evolve ui: no ./runs folder here; give run directories, e.g. evolve ui runs/sql_agent-seed0"
            )
        paths = [Path("runs")]
    token = None
    if token_env:
        token = os.environ.get(token_env)
        if not token or not token.strip():
            raise UserError(f"evolve ui: --token-env {token_env}: the variable is not set, empty or only whitespace")
    elif not is_loopback(host):
        token = secrets.token_urlsafe(24)
    server = serve(paths, host=host, port=port, token=token).start()  # listening before the URL is printed
    try:
        out = Console(highlight=False, soft_wrap=True)
        url = server.base + "/" + (f"?token={token}" if token and not token_env else "")
        out.print(f"evolve ui at {url}", markup=False)
        if not is_loopback(host):
            out.print(f"  listening on {host}:{server.port}; open it with this machine's address", markup=False)
        sys.stdout.flush()
        wait_until_interrupted()  # Ctrl-C or SIGTERM
        out.print("stopped", markup=False)
    finally:
        server.close()
