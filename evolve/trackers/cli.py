"""``evolve track RUN_DIR [--to NAME] [--param key=value ...]``: send a run to a tracker afterwards.

The same code as a live run's trackers (:mod:`evolve.trackers.live`), called once: what the
destination lacks is sent (a run whose live export failed is completed, a finished run exported
anew, a run in progress sent as far as it got). Without ``--to``, to the trackers the run's task
file names, with their params; ``--param`` overrides or adds params.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer


def track_command(
    run_dir: Path = typer.Argument(..., help="The run directory (holds archive.sqlite)."),
    to: str | None = typer.Option(
        None, "--to", help="mlflow, wandb, otel or an import path; default: the trackers in the run's task file."
    ),
    param: list[str] = typer.Option(
        [], "--param", help="A tracker parameter, e.g. --param tracking_uri=http://127.0.0.1:5000 (repeatable)."
    ),
) -> None:
    """Send a run (finished or not) to MLflow, Weights & Biases or an OpenTelemetry collector."""
    from rich.console import Console
    from rich.text import Text

    from evolve.archive import Archive
    from evolve.errors import EvolveError, InfraError, UserError
    from evolve.trackers import TrackedRun

    given = _params(param)
    with Archive(run_dir, create=False) as archive:
        run = TrackedRun(archive, run_dir)
        configured = [(t.get("name"), dict(t.get("params") or {})) for t in run.task().get("track") or []]
        if to is None:
            if not configured:
                raise UserError(
                    f"the run in {run_dir} names no tracker in its task file; say where to send it: "
                    "--to mlflow | wandb | otel"
                )
            targets = [(name, {**params, **given}) for name, params in configured]
        else:
            base = next((params for name, params in configured if name == to), {})  # the task file's, if it has one
            targets = [(to, {**base, **given})]
        trackers = [_build(name, params, i, command_line=to is not None) for i, (name, params) in enumerate(targets)]
        for t in trackers:
            t.open()
        status = "finished" if run.report() is not None else None  # a run still going is left running
        out = Console(highlight=False, soft_wrap=True)
        for t in trackers:
            try:
                line = t.sync(run)
                t.close(status)
            except EvolveError:
                raise
            except Exception as e:  # noqa: BLE001 - the destination failed while sending: what it took is kept
                raise InfraError(
                    f"the {t.name} tracker ({t.address}) failed while sending: {type(e).__name__}: "
                    f"{e}\nWhat it took is kept; run the same command again to send the rest"
                ) from None
            out.print(Text(line))


def _build(name: str, params: dict[str, Any], index: int, *, command_line: bool) -> Any:
    """The tracker; a mistake in --to or --param is named as such, one in the run's task file by its path."""
    from evolve.errors import ConfigError
    from evolve.trackers import build

    try:
        return build(name, params, path="track" if command_line else f"track.{index}", source="evolve track")
    except ConfigError as e:
        if not command_line:
            raise
        text = str(e).replace("track.name:", "--to:").replace("track.params.", "--param ")
        raise ConfigError(text) from None


def _params(items: list[str]) -> dict[str, Any]:
    """``key=value`` items (values read as YAML, as --set reads them) as a dict; ``a.b=1`` nests."""
    import yaml

    from evolve.errors import UserError

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--param {item!r}: write it as key=value, e.g. --param tracking_uri=http://127.0.0.1:5000")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            value = raw
        node = out
        *parents, last = key.strip().split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise UserError(f"--param {item!r}: {p} is given as a value and as a mapping")
        node[last] = value
    return out


__all__ = ["track_command"]
