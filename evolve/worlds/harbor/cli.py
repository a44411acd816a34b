"""``evolve harbor check FOLDER...``: load every Harbor task under the folders and check each is
sound (tests fail untouched, its solution passes); each task's status is ``ok``, ``unverified``
(no solution), ``broken``, ``unsupported`` or ``invalid``, with the reason, and what Harbor's trial
result would say of its ``nop`` and ``oracle`` trials (the reward, every component, the exception
type when the trial failed), and the host variables its ``${VAR}`` values read (each ``allowed``
with ``--allow-env NAME`` or not: :mod:`.task.hostenv`); exit 1 when one would be left out of a run.

Mounted by :mod:`evolve.cli.commands` through :data:`evolve.registry.commands`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

app = typer.Typer(
    name="harbor",
    no_args_is_help=True,
    add_completion=False,
    help="Harbor task folders: check that tasks load and that their solutions pass.",
)


@app.callback()
def _group() -> None:
    """Harbor task folders (world: harbor)."""


@app.command("check")
def check_command(
    folders: list[Path] = typer.Argument(..., help="Task folders, or folders of task folders."),
    environment: str = typer.Option("auto", "--environment", "-e", help="auto, sandbox or docker."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Check again even if this task content was checked."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per task on stdout."),
    image: list[str] = typer.Option(
        [],
        "--image",
        help="NAME=LOCAL: build a FROM (or docker_image) naming NAME on "
        "the local image LOCAL (the image map, for machines that reach no registry); "
        "repeat it for more.",
    ),
    allow_env: list[str] = typer.Option(
        [],
        "--allow-env",
        metavar="NAME",
        help="Let a task's ${NAME} read the "
        "host's variable NAME (none is read otherwise; its value is masked in all "
        "output); repeat it for more.",
    ),
    build_network: str = typer.Option(
        "auto",
        "--build-network",
        help="auto (the engine's bridge network, none "
        "where it has none), none, or host: the machine's own network, for tasks "
        "you trust with its loopback services.",
    ),
    capabilities: str = typer.Option(
        "reduced",
        "--capabilities",
        help="reduced (the capabilities published tasks need) or docker (the engine's defaults) in the containers.",
    ),
) -> None:
    """Check every task: it loads, its tests fail on the untouched environment, its solution passes."""
    from rich.console import Console
    from rich.table import Table

    from evolve.worlds.harbor.check import check_task
    from evolve.worlds.harbor.dataset import LEFT_OUT
    from evolve.worlds.harbor.environment import check_backend
    from evolve.worlds.harbor.task import TaskError, find_tasks, load_task

    check_backend(environment)
    from evolve.worlds.harbor.environment.build import check_build_network
    from evolve.worlds.harbor.environment.docker import CAPABILITIES
    from evolve.worlds.harbor.task.hostenv import check_names

    check_build_network(build_network, "--build-network")
    allowed = check_names(allow_env, "--allow-env")
    if capabilities not in CAPABILITIES:
        from evolve.errors import UserError

        raise UserError(f"--capabilities {capabilities!r}: use one of {', '.join(CAPABILITIES)}")
    settings = {"build_network": build_network, "capabilities": capabilities}
    images = {}
    for item in image:
        name, sep, local = item.partition("=")
        if not sep or not name.strip() or not local.strip():
            from evolve.errors import UserError

            raise UserError(f"--image {item!r}: write NAME=LOCAL, e.g. --image ubuntu:24.04=my-ubuntu:24.04")
        images[name.strip()] = local.strip()
    rows: list[dict[str, Any]] = []
    for folder in find_tasks([str(f) for f in folders]):
        try:
            task = load_task(folder, allow_env=allowed)
        except TaskError as e:
            rows.append(
                {
                    "id": folder.name,
                    "status": e.status,
                    "why": e.reason,
                    "seconds": 0.0,
                    "backend": "",
                    "trials": {},
                    "notes": [],
                    "host_env": {},
                }
            )
            continue
        rows.append(
            check_task({**task, **settings, **({"images": images} if images else {})}, environment, cache=not no_cache)
        )
    bad = sum(r["status"] in LEFT_OUT for r in rows)
    if as_json:
        for r in rows:
            print(json.dumps(r))
    else:
        t = Table(title=f"{len(rows)} Harbor task(s)")
        for col in ("task", "status", "nop", "oracle", "backend", "s", "host vars", "why"):
            t.add_column(col, overflow="fold")
        for r in rows:
            style = {"ok": "green", "unverified": "yellow"}.get(r["status"], "red")
            trials = r.get("trials") or {}
            t.add_row(
                r["id"],
                f"[{style}]{r['status']}[/{style}]",
                _said(trials.get("nop")),
                _said(trials.get("oracle")),
                r.get("backend", ""),
                f"{r.get('seconds', 0):.1f}",
                " ".join(f"{v} ({how})" for v, how in (r.get("host_env") or {}).items()),
                "; ".join([r.get("why", "")] + list(r.get("notes") or [])).strip("; "),
            )
        Console().print(t)
    raise typer.Exit(1 if bad else 0)


def _said(t: dict | None) -> str:
    """A trial as Harbor's result says it: its rewards, or its exception's type."""
    if not t:
        return ""
    if t.get("rewards") is not None:
        text = " ".join(f"{k}={v:g}" for k, v in t["rewards"].items())
        return text + (f" ({t['exception_type']})" if t.get("exception_type") else "")
    return t.get("exception_type") or ""


__all__ = ["app"]
