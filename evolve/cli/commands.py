"""The ``evolve`` command line: run, eval, init, serve, archive, mcp.

A user's mistake never shows a traceback: usage errors exit 2 with click's message, an
:class:`~evolve.errors.UserError` exits 2 with its one paragraph, the world failing
(:class:`~evolve.errors.InfraError`) exits 3 with how to continue, a failed run
(:class:`~evolve.errors.RunFailed`) exits 1, Ctrl-C exits 130 with how to resume
(the exit codes are listed in :mod:`evolve.errors`). Bugs keep their traceback."""

from __future__ import annotations

import importlib
import shlex
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from evolve.errors import ArchiveError, EvolveError, InfraError, RunFailed, UserError

app = typer.Typer(
    name="evolve",
    help="Evolve agent systems from their own experience.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from evolve import __version__

        Console(highlight=False).print(f"evolvekit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", callback=_print_version, is_eager=True, help="Print evolvekit's version and exit."
    ),
) -> None:
    """Evolve agent systems from their own experience."""


from evolve.scoring.progress import RichObserver, console  # noqa: E402  (the CLI's progress display and stderr)

SET_HELP = "Override any task-file field, e.g. --set budget.generations=2 (repeatable)."


def _print_report(report: dict[str, Any]) -> None:
    from rich.table import Table

    from evolve.results.report import gain
    from evolve.results.stats import interval_text

    t = Table(title=f"{report['task']} (seed {report['seed']}): baseline vs evolved")
    for col in ("system", "id", "val", "test"):
        t.add_column(col)
    for name in ("baseline", "best"):
        e = report.get(name) or {}
        cells = []
        for split in ("val", "test"):
            s = e.get(split)
            cells.append(f"{100 * s['score']:.1f}% (n={s['n']})" if s else "—")
        t.add_row(name, (e.get("system_id") or "")[:12], *cells)
    Console().print(t)
    g = gain(report, "test")
    if g is not None:
        c = (report.get("paired") or {}).get("test") or {}
        ci = f" ({interval_text(c)}, sign test p={c['p']:.2g})" if c.get("ci95") is not None else ""
        Console().print(
            f"held-out test gain: [bold]{100 * g:+.1f} points[/bold]{ci}   report: {report['run_dir']}/report.md"
        )


def _money(usd: float | None) -> str:
    return "unknown" if usd is None else f"${usd:.2f}" if usd >= 1 else f"${usd:.4f}"


def _print_estimate(est: dict[str, Any]) -> None:
    from rich.table import Table

    sz = est["sizes"]
    t = Table(
        title=f"dry run: {est['task']} (seed {est['seed']}), train {sz['train']} / val {sz['val']} / test "
        f"{sz['test']}, minibatch {sz['minibatch']}",
        caption="calls: LLM calls in rollouts; op calls: "
        "operators' own LLM calls; par→kids: parents → children proposed; tokens~: estimated",
    )
    for col in ("phase", "par→kids", "rollouts", "calls", "op calls", "tokens~", "money"):
        t.add_column(col, justify="left" if col == "phase" else "right", no_wrap=col == "phase")
    unknown_ops = any(not o["declared"] for o in est["operators"])

    def add(r: dict[str, Any], style: str | None = None) -> None:
        op = f"{r['op_calls']}" + ("+?" if unknown_ops and r["phase"].startswith("gen") else "")
        kids = f"{r['parents']}→{r['children']}" if r.get("parents") else ""
        t.add_row(
            r["phase"], kids, str(r["rollouts"]), str(r["calls"]), op, f"{r['tokens']:,}", _money(r["usd"]), style=style
        )

    for r in est["phases"]:
        add(r, "red" if est["stop"] and r["phase"] == est["stop"]["phase"] else None)
    t.add_section()
    add(est["in_budget"], "bold")
    add(est["final"])
    add(est["total"], "bold")
    out = Console()
    out.print(t)
    for o in est["operators"]:
        own = f"{o['rollouts']} rollouts, {o['llm_calls']} LLM calls" if o["declared"] else "unknown own cost"
        out.print(f"operator {o['name']}: per parent {own}, {o['children']} children", highlight=False)
    stop = est["stop"]
    if stop:
        out.print(
            f"[bold]{stop['limit']} stops the run in {stop['phase']}[/bold], after {stop['rollouts']} rollouts "
            f"(~{stop['calls']} LLM calls); the final test scoring still runs",
            highlight=False,
        )
    else:
        out.print("no budget stops the plan early", highlight=False)
    for note in est["notes"]:
        out.print(f"[dim]- {note}[/dim]", highlight=False)


def resume_command(task_file: Path, run_dir: Path | None, sets: list[str]) -> str:
    """The command that continues a run: the same task file and --set values, its --out, --resume."""
    words = ["evolve", "run", str(task_file)] + (["--out", str(run_dir)] if run_dir else [])
    for item in sets:
        words += ["--set", item]
    return " ".join(shlex.quote(w) for w in words + ["--resume"])


@app.command()
def run(
    task_file: Path = typer.Argument(..., help="The task YAML."),
    out: Path | None = typer.Option(
        None, "--out", help="Run directory (default: the task's 'out' or runs/NAME-seedN)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out, reusing all finished work."),
    fresh: bool = typer.Option(
        False,
        "--fresh",
        help="Start the run in --out over; the earlier run is moved aside to OUT.replaced-TIME, never deleted.",
    ),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the rollouts, LLM calls, tokens and money the run "
        "would spend (a maximum), and where a budget would stop it; run nothing.",
    ),
) -> None:
    """Run an evolution job: bootstrap, evolve, score on held-out tasks, write the report."""
    from evolve.api import run_task

    if dry_run:
        from evolve.api import dry_run as estimate

        _print_estimate(estimate(task_file, overrides=set_))
        return
    obs = RichObserver()
    try:
        with obs:
            report = run_task(task_file, overrides=set_, out=out, resume=resume, fresh=fresh, observer=obs)
    except KeyboardInterrupt:
        where = obs.run_dir or out
        if where is None:
            console.print("interrupted before the run started", highlight=False)
        else:
            console.print(
                f"interrupted; what finished is kept. Continue with:\n  {resume_command(task_file, where, set_)}",
                highlight=False,
                soft_wrap=True,
            )
        raise SystemExit(130) from None
    except InfraError as e:
        raise InfraError(
            f"{e}\nNothing it could not score was stored as a score. When it is fixed, continue with:\n  "
            f"{resume_command(task_file, obs.run_dir or out, set_)}"
        ) from None
    _print_report(report)


@app.command("eval")
def eval_(
    task_file: Path = typer.Argument(..., help="The task YAML the run was made with."),
    run_dir: Path = typer.Argument(..., help="The run directory."),
    system: str = typer.Option("current", "--system", help="System id (prefix), or current / best / baseline."),
    split: str = typer.Option(
        "test", "--split", help="train, val or test, or a split the world adds (IFEval's unseen)."
    ),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Score one archived system on a split (memoised in the archive); a world with figures of its
    own (IFEval's four accuracies) prints them too."""
    from evolve.api import evaluation

    with RichObserver() as obs:
        e = evaluation(task_file, run_dir, system=system, split=split, overrides=set_, observer=obs)
    score, n, sid = e["score"], e["n"], e["system_id"]
    from evolve.archive import Archive
    from evolve.failures import describe_common

    with Archive(run_dir, create=False) as archive:
        _, failed = archive.failure_stats(system_id=sid, split=split)
    note = f"; {len(failed)} failed: {describe_common(failed)}" if failed else ""
    Console(highlight=False).print(f"system {sid[:12]} on {split}: {100 * score:.1f}% (n={n}{note})")
    for line in (e["summary"] or {}).get("lines", []):
        Console(highlight=False).print(line, soft_wrap=True)


@app.command()
def init(
    path: Path = typer.Argument(Path("task.yaml"), help="Where to write the new task file."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a commented task-file template to start from."""
    from evolve.api import TEMPLATE

    if path.is_dir():
        raise UserError(f"{path} is a directory; give the path of the task file to write, e.g. {path / 'task.yaml'}")
    if path.exists() and not force:
        raise UserError(f"{path} already exists; pass --force to overwrite it or choose another path")
    try:
        path.write_text(TEMPLATE)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from None
    Console().print(f"wrote {path}; edit it, then: evolve run {path}")


def _gateway_command() -> None:
    from evolve.cli.gateway import (  # typer and rich only; starlette and uvicorn load when they run
        gateway_command,
        serve_command,
    )

    app.command("serve")(serve_command)
    app.command("gateway")(gateway_command)


_gateway_command()


def _ui_command() -> None:
    from evolve.ui.cli import ui_command  # typer and rich only; starlette and uvicorn load when it runs

    app.command("ui")(ui_command)


_ui_command()


def _track_command() -> None:
    from evolve.trackers.cli import track_command  # typer only; a tracker's client loads when it sends

    app.command("track")(track_command)


_track_command()


def _mcp_command() -> None:
    from evolve.mcp.cli import mcp_command  # typer and rich only; the mcp SDK loads when it runs

    app.command("mcp")(mcp_command)


_mcp_command()


def _deploy_commands() -> None:
    from evolve.deploy.cli import promote_command, rollback_command, status_command

    app.command("promote")(promote_command)
    app.command("rollback")(rollback_command)
    app.command("status")(status_command)


_deploy_commands()


def _mount_commands() -> None:
    """The command groups of :data:`evolve.registry.commands` (``archive``, ``baseline``, plugins')."""
    from evolve.registry import commands

    names = {g.name for g in app.registered_groups}
    for name in commands.names():
        if name not in names:
            app.add_typer(commands.get(name), name=name)


def _click_errors() -> tuple[tuple[type[Any], ...], tuple[type[Any], ...]]:
    """click's usage-error and abort classes: typer vendors its own click (typer._click) since
    0.24, and older typers use the click package; both are caught."""
    usage: list[type[Any]] = []  # click's classes, found at run time
    abort: list[type[Any]] = []
    for name in ("click.exceptions", "typer._click.exceptions", "typer.exceptions"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        usage += [mod.ClickException] if hasattr(mod, "ClickException") else []
        abort += [mod.Abort] if hasattr(mod, "Abort") else []
    return tuple(usage), tuple(abort)


def _fail(e: BaseException, code: int) -> None:
    console.print(f"[bold red]error:[/bold red] {rich_escape(str(e))}", highlight=False, markup=True, soft_wrap=True)
    sys.exit(code)


def rich_escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def main(argv: list[str] | None = None) -> None:
    from evolve._env import quiet_defaults

    quiet_defaults()
    _mount_commands()
    usage_errors, aborts = _click_errors()
    try:
        rc = app(args=argv, standalone_mode=False, prog_name="evolve")
        if isinstance(rc, int) and rc:
            if rc == 130:
                console.print("interrupted")
            sys.exit(rc)
    except (UserError, ArchiveError) as e:  # an unknown system id is the user's to fix too
        _fail(e, 2)
    except InfraError as e:  # the world failed: fix it and --resume
        _fail(e, 3)
    except RunFailed as e:
        _fail(e, 1)
    except EvolveError as e:
        _fail(e, 1)
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)
    except SystemExit:
        raise
    except usage_errors as e:  # click's own usage errors: its message, exit 2
        e.show()
        sys.exit(getattr(e, "exit_code", 2))
    except aborts:
        console.print("interrupted")
        sys.exit(130)
    except OSError as e:  # a path or a port the user gave (a folder that cannot be written, ...)
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        _fail(OSError(f"{e.strerror or e}{where}"), 1)


if __name__ == "__main__":
    main()
