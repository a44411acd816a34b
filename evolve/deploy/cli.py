"""``evolve promote``, ``evolve rollback`` and ``evolve status``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text


def _out() -> Console:
    return Console(highlight=False, soft_wrap=True)


def promote_command(
    task_file: Path = typer.Argument(..., help="The task YAML with the deploy: section (the run's task file)."),
    run_dir: Path = typer.Argument(..., help="The run directory."),
    system: str | None = typer.Option(None, "--system", help="System id (prefix); default: the latest proposed."),
    approve: bool = typer.Option(
        False, "--approve", help="Approve the system waiting for approval: it becomes active."
    ),
    by: str | None = typer.Option(None, "--by", help="Who decides (recorded in the audit trail); default: $USER."),
    repin: bool = typer.Option(
        False,
        "--repin",
        help="Accept the reward and suites as they are now (after a change you reviewed) and pin them again.",
    ),
    set_: list[str] = typer.Option([], "--set", help="Override a task-file value: --set deploy.canary.share=0.2"),
    accept_read: list[Path] = typer.Option(
        [],
        "--accept-read",
        help="A file a gate was seen reading that the pins "
        "did not hold: show it and its sha256, and pin it as it is (repeatable).",
    ),
) -> None:
    """Take a candidate through the deploy policy: integrity checks, gates, then canary, approval or activation."""
    from evolve.deploy.manage import approve as approve_
    from evolve.deploy.manage import promote

    if accept_read:
        from evolve.deploy.reads import accept_reads

        res = accept_reads(task_file, run_dir, accept_read, by=by, overrides=set_)
        out = _out()
        for f in res["files"]:
            seen = "" if f["seen"] in (None, f["sha256"]) else f" (the gate read sha256 {f['seen']}: it changed since)"
            out.print(Text(f"{f['path']}\n  sha256 {f['sha256']}, {f['bytes']} bytes{seen}", style="bold"))
            out.print(Text(f["text"] if f["text"] is not None else "  (not text)"))
        out.print(Text(res["message"]))
        return
    if approve:
        res = approve_(run_dir, system=system, by=by)
        _out().print(Text(res["message"]))
        return
    from evolve.scoring.progress import RichObserver

    with RichObserver() as obs:
        res = promote(task_file, run_dir, system=system, by=by, repin=repin, overrides=set_, observer=obs)
    out = _out()
    for g in res["gates"]:
        mark = "[green]pass[/green]" if g["passed"] else "[red]FAIL[/red]"
        out.print(f"{mark} ", Text(g["message"]), end="\n")
    out.print(Text(f"{res['system'][:12]}: {res['state']} — {res['message']}" if res["system"] else res["message"]))
    if res["state"] == "rejected":
        raise typer.Exit(1)


def rollback_command(
    run_dir: Path = typer.Argument(..., help="The run directory."),
    system: str | None = typer.Argument(None, help="The system to serve (id prefix); default: the previous active."),
    by: str | None = typer.Option(None, "--by", help="Who decides (recorded in the audit trail)."),
    why: str | None = typer.Option(None, "--why", help="Why (recorded in the audit trail)."),
) -> None:
    """Serve the previous active system (or SYSTEM) to new sessions now; ends a canary. Deletes nothing."""
    from evolve.deploy.manage import rollback

    res = rollback(run_dir, system, by=by, why=why)
    _out().print(Text(res["message"]))


def status_command(
    run_dir: Path = typer.Argument(..., help="The run directory."),
    traces: Path | None = typer.Option(None, "--traces", help="A gateway trace store: show the canary's test."),
    as_json: bool = typer.Option(False, "--json", help="Print everything as JSON."),
) -> None:
    """The active system, each system's lifecycle state, the canary under way and the audit trail."""
    from evolve.deploy.manage import status

    st = status(run_dir, traces=traces)
    out = _out()
    if as_json:
        out.print_json(json.dumps(st, default=str))
        return
    out.print(Text(f"active: {st['active'] or '(none)'}" + (f"   pins: {st['pins']}" if st["pins"] else "")))
    can = st["canary"]
    if can:
        line = f"canary: {can['system'][:12]} on {100 * can['share']:g}% of new sessions since {_when(can['started'])}"
        test = st.get("canary_test")
        if test:
            line += (
                f"; {test['candidate_sessions']} vs {test['active_sessions']} scored sessions, "
                f"test says {test['decision']}"
            )
        if st.get("canary_expired"):
            line += f"; past max_hours ({can['max_hours']:g} h): ended, not promoted, at the gateway's next call"
        out.print(Text(line))
    states = Table("system", "state", title="lifecycle", title_justify="left")
    for sid, s in st["states"].items():
        states.add_row(sid[:12], s)
    out.print(states)
    trail = Table("when", "system", "move", "by", "why", title="audit trail", title_justify="left")
    for e in st["trail"][-20:]:
        trail.add_row(
            _when(e["created_at"]),
            e["system"][:12],
            f"{e['from'] or '-'} -> {e['to']}",
            str(e["by"]),
            Text(str(e["why"])[:200]),
        )
    out.print(trail)
    for f, sha in st["unaccepted"].items():
        out.print(
            Text(
                f"waiting for a person: the evaluation read {f} (sha256 {sha}), which the pins do not hold; "
                f"look at it, then evolve promote TASK RUN --accept-read {f}",
                style="yellow",
            )
        )
    for p in st["problems"]:
        out.print(Text(f"inconsistent: {p}", style="red"))
    if st["problems"]:
        raise typer.Exit(1)


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


__all__ = ["promote_command", "rollback_command", "status_command"]
