"""``evolve archive``: look into a run's archive, compare systems, roll back, export.

Every command takes the run directory first. SYSTEM is a unique id prefix or one of the
words ``current``, ``best`` (highest val score) and ``baseline`` (the first system).
A user error (no such run directory, unknown id, ambiguous prefix, a folder that would be
overwritten) prints one message to stderr and exits with code 2.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import difflib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from evolve.archive import Archive
from evolve.archive import diff as diff_systems
from evolve.errors import ArchiveError, UserError

app = typer.Typer(
    name="archive",
    help="Inspect a run's archive: list systems and scores, show one, diff two, roll back the current pointer, export.",
    no_args_is_help=True,
    add_completion=False,
)

_LONG_TEXT = 80  # strings longer than this (or with newlines) are diffed line by line
_ID = 12


def _out() -> Console:
    return Console(highlight=False, soft_wrap=False)


def _err() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def _archive(run_dir: Path) -> Iterator[Archive]:
    """Open an existing archive; turn user errors into one line on stderr and exit code 2."""
    try:
        with Archive(run_dir, create=False) as archive:
            yield archive
    except (UserError, ArchiveError) as e:
        _err().print(Text(f"error: {e}", style="red"))
        # SystemExit rather than typer.Exit: click swallows typer.Exit's code when the app
        # runs with standalone_mode=False (as evolve.cli.commands.main does), SystemExit gets through.
        raise SystemExit(2) from None


def _short(sid: str | None) -> str:
    return sid[:_ID] if sid else "-"


def _fmt_score(s: tuple[float, int] | None) -> str:
    return "" if s is None else f"{s[0]:.3f} ({s[1]})"


def _when(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _value(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, sort_keys=True)


RunDir = typer.Argument(..., help="The run directory (holds archive.sqlite).", show_default=False)
SystemArg = typer.Argument(..., help="A unique id prefix, or current / best / baseline.", show_default=False)


@app.command("list")
def list_systems(
    run_dir: Path = RunDir,
    last: int | None = typer.Option(None, "--last", "-n", help="Show only the last N systems."),
) -> None:
    """Every system: id, generation, operator, parents and val/test scores (* = current)."""
    with _archive(run_dir) as archive:
        records = archive.records()
        val = archive.all_scores("val")
        test = archive.all_scores("test")
        current = archive.current()
    if last is not None:
        records = records[-last:] if last > 0 else []
    table = Table(title=f"{run_dir}: {len(records)} systems", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True, width=1)
    table.add_column("id", no_wrap=True, min_width=_ID)
    table.add_column("gen", justify="right", no_wrap=True)
    table.add_column("operator", overflow="ellipsis", min_width=6)
    table.add_column("parents", overflow="fold", min_width=_ID)
    table.add_column("val (n)", justify="right", no_wrap=True, min_width=10)
    show_test = bool(test)
    if show_test:
        table.add_column("test (n)", justify="right", no_wrap=True, min_width=10)
    for r in records:
        row: list[str | Text] = [
            Text("*", style="bold green") if r.id == current else Text(""),
            Text(_short(r.id), style="bold" if r.id == current else ""),
            str(r.generation),
            Text(r.operator),
            Text(", ".join(_short(p) for p in r.parents)),
            _fmt_score(val.get(r.id)),
        ]
        if show_test:
            row.append(_fmt_score(test.get(r.id)))
        table.add_row(*row)
    out = _out()
    out.print(table)
    if current is None:
        out.print(Text("no current system yet"))


@app.command("show")
def show(
    run_dir: Path = RunDir,
    system: str = SystemArg,
    trajectories: int = typer.Option(3, "--trajectories", "-t", help="How many example trajectories to summarize."),
    graph: Path | None = typer.Option(
        None, "--graph", help="Also draw the system's workflow graph to this PNG.", show_default=False
    ),
) -> None:
    """One system: its record, lineage, scores per split, workflow graph, JSON and example trajectories."""
    with _archive(run_dir) as archive:
        sid = archive.resolve(system)
        sysobj = archive.get_system(sid)
        record = archive.record(sid)
        chain = archive.lineage(sid)
        summary = archive.score_summary(sid)
        current = archive.current()
        rows = archive.trajectory_rows(sid, phase="eval", limit=trajectories) if trajectories > 0 else []
        if len(rows) < trajectories:
            seen = {r.key for r in rows}
            rows += [r for r in archive.trajectory_rows(sid, limit=trajectories) if r.key not in seen][
                : trajectories - len(rows)
            ]
    views = _views(sysobj, graph)
    out = _out()
    title = Text(f"system {sid}", style="bold")
    if sid == current:
        title.append("  (current)", style="green")
    out.print(title)
    info = Table.grid(padding=(0, 2))
    info.add_column(style="dim", no_wrap=True)
    info.add_column(overflow="fold")
    info.add_row("generation", str(record.generation))
    info.add_row("operator", Text(record.operator))
    info.add_row("parents", Text(", ".join(record.parents) or "-"))
    info.add_row("rationale", Text(record.rationale or "-"))
    info.add_row("created", _when(record.created_at))
    if record.info:
        info.add_row("info", Text(json.dumps(record.info, ensure_ascii=False, sort_keys=True)))
    info.add_row("lineage", Text(" <- ".join(_short(x) for x in chain)))
    out.print(info)

    if summary:
        st = Table(title="scores", title_justify="left")
        st.add_column("split")
        st.add_column("phase")
        st.add_column("score", justify="right")
        st.add_column("n", justify="right")
        for split, phase, score, n in summary:
            st.add_row(Text(split), Text(phase), f"{score:.3f}", str(n))
        out.print(st)
    else:
        out.print(Text("scores: none yet"))

    for view in views:
        view.show(out, _err(), sid)

    out.print(Text("system JSON", style="bold"))
    out.print_json(sysobj.model_dump_json(), indent=2, highlight=False)

    if rows:
        tt = Table(title=f"example trajectories ({len(rows)})", title_justify="left")
        tt.add_column("task", overflow="fold")
        tt.add_column("split/phase", no_wrap=True)
        tt.add_column("sample", justify="right")
        tt.add_column("score", justify="right")
        tt.add_column("feedback / error", overflow="fold")
        for r in rows:
            t = r.trajectory
            note = (
                t.error
                or (t.reward.error if t.reward and t.reward.error else "")
                or (t.reward.feedback if t.reward else "")
            )
            note = " ".join(note.split())
            if len(note) > 200:
                note = note[:197] + "..."
            tt.add_row(
                Text(t.task_id),
                Text(f"{r.split}/{r.phase}"),
                str(t.sample),
                f"{t.score:.3f}" if t.reward is not None else "-",
                Text(note, style="red" if t.error else ""),
            )
        out.print(tt)


def _views(sysobj: Any, png: Path | None) -> list[Any]:
    """What the layers show of a system (:data:`evolve.registry.report_sections`: its workflow graph,
    drawn to ``--graph``); each checks first that it can (exit 2 when ``--graph`` cannot be drawn)."""
    from evolve.registry import report_sections

    out = []
    for name in report_sections.names():
        view = report_sections.get(name)()
        try:
            view.prepare(sysobj, png)
        except UserError as e:
            _err().print(Text(f"error: {e}", style="red"))
            raise SystemExit(2) from None
        out.append(view)
    return out


@app.command("diff")
def diff(
    run_dir: Path = RunDir,
    a: str = typer.Argument(..., help="The first system (id prefix or current/best/baseline).", show_default=False),
    b: str = typer.Argument(..., help="The second system.", show_default=False),
) -> None:
    """Component-by-component differences between two systems (unified diff for long text)."""
    with _archive(run_dir) as archive:
        ida, idb = archive.resolve(a), archive.resolve(b)
        sa, sb = archive.get_system(ida), archive.get_system(idb)
    out = _out()
    changes = diff_systems(sa, sb)
    out.print(Text(f"a = {ida}   b = {idb}", style="bold"))
    if not changes:
        out.print(Text("no differences: the two systems are identical"))
        return
    table = Table(show_lines=False)
    table.add_column("component", overflow="fold")
    table.add_column("a", overflow="fold")
    table.add_column("b", overflow="fold")
    long_text: list[tuple[str, str, str]] = []
    for path, va, vb in changes:
        if (
            isinstance(va, str)
            and isinstance(vb, str)
            and (len(va) > _LONG_TEXT or len(vb) > _LONG_TEXT or "\n" in va or "\n" in vb)
        ):
            long_text.append((path, va, vb))
            table.add_row(Text(path), Text("(text, see below)", style="dim"), Text("(text, see below)", style="dim"))
        else:
            table.add_row(Text(path), Text(_value(va), style="red"), Text(_value(vb), style="green"))
    out.print(table)
    for path, va, vb in long_text:
        out.print(Text(f"--- {path}", style="bold"))
        lines = difflib.unified_diff(
            va.splitlines(), vb.splitlines(), fromfile=f"a/{path}", tofile=f"b/{path}", lineterm="", n=2
        )
        for line in lines:
            style = (
                "green"
                if line.startswith("+")
                else "red"
                if line.startswith("-")
                else "cyan"
                if line.startswith("@@")
                else ""
            )
            out.print(Text(line, style=style), soft_wrap=True)


@app.command("rollback")
def rollback(run_dir: Path = RunDir, system: str = SystemArg) -> None:
    """Make an earlier system the current one (appends a pointer move and an audit event; deletes nothing)."""
    from evolve.deploy.manage import rollback as deploy_rollback

    with _archive(run_dir) as archive:
        old = archive.current()
        sid = archive.resolve(system)
    if sid == old:
        _out().print(Text(f"current: {old} (already)"))
        return
    new = deploy_rollback(run_dir, sid)["system"]
    _out().print(Text(f"current: {old or '(none)'} -> {new}"))


@app.command("export")
def export(
    run_dir: Path = RunDir,
    system: str = SystemArg,
    to: Path = typer.Option(..., "--to", help="Destination folder (must not exist or be empty).", show_default=False),
) -> None:
    """Write one system and every artifact it references into a self-contained folder."""
    with _archive(run_dir) as archive:
        sid = archive.resolve(system)
        dest = archive.export(sid, to)
        n = len(json.loads((dest / "system.json").read_text(encoding="utf-8")).get("artifacts", []))
    _out().print(Text(f"exported {sid} to {dest} ({n} artifact{'s' if n != 1 else ''})"))


__all__ = ["app"]
