"""Files a gate was seen reading that the pins did not hold: never pinned on their own. The promotion
that saw them is refused, and so is every later one, until a person accepts each file with
``evolve promote TASK RUN --accept-read FILE``, which shows the file, its sha256 and what the gate
saw, and pins it (run state ``deploy.unaccepted``: the files waiting, with the hash the gate read)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evolve.deploy.closure import file_sha
from evolve.deploy.lifecycle import DeployError, who

UNACCEPTED_KEY = "deploy.unaccepted"
SHOWN_LINES = 40


def _say(waiting: dict[str, str | None], *, new: bool) -> str:
    files = sorted(waiting)
    listed = "; ".join(f"{f} (sha256 {waiting[f] or 'unreadable'})" for f in files[:5])
    more = f"; and {len(files) - 5} more" if len(files) > 5 else ""
    accept = " ".join(f"--accept-read {f}" for f in files[:5])
    return (
        (
            f"while it was gated, the evaluation read {listed}{more}, which the pins do not hold; nothing was decided"
            if new
            else f"the evaluation reads files no one has accepted yet: {listed}{more}"
        )
        + f". Look at each, then accept it with evolve promote TASK RUN {accept} (it shows the file and its "
        "hash and pins it), or list it in deploy.data_files and re-pin with --repin"
    )


def hold(archive: Any, reads: Sequence[str]) -> DeployError:
    """Record the files a gate read that the pins do not hold as waiting for a person; the refusal."""
    waiting = dict(archive.get_state(UNACCEPTED_KEY) or {})
    waiting.update({f: file_sha(f) for f in reads})
    with archive.transaction():
        archive.put_state(UNACCEPTED_KEY, waiting)
        archive.log_event("deploy_unpinned_read", {"files": {f: waiting[f] for f in reads}})
    return DeployError(_say({f: waiting[f] for f in reads}, new=True))


def unaccepted(archive: Any, pins: dict[str, Any] | None) -> dict[str, str | None]:
    """The files a gate read that wait for a person's acceptance (and were not pinned since), with
    the sha256 the gate read."""
    from evolve.deploy.pins import pinned_files

    held = set(pinned_files(pins or {}))
    return {f: h for f, h in dict(archive.get_state(UNACCEPTED_KEY) or {}).items() if f not in held}


def refuse_unaccepted(archive: Any, pins: dict[str, Any]) -> None:
    """Refuse while a file a gate read waits for a person's acceptance (and is not pinned since)."""
    left = unaccepted(archive, pins)
    if left:
        raise DeployError(_say(left, new=False))


def _shown(path: Path) -> str | None:
    """The file's first lines as text (None: it is not text)."""
    try:
        data = path.read_bytes()[:64_000]
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    lines = text.splitlines()
    return "\n".join(lines[:SHOWN_LINES]) + (
        f"\n... ({len(lines) - SHOWN_LINES} more lines)" if len(lines) > SHOWN_LINES else ""
    )


def accept_reads(
    task_file: str | Path,
    run_dir: str | Path,
    files: Sequence[str | Path],
    *,
    by: str | None = None,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """A person accepts ``files`` the evaluation reads: each is pinned as it is now. Returns
    ``{"files": [{path, sha256, bytes, seen, text}], "pins", "message"}`` (``seen``: the hash the
    gate read, ``text``: the file's first lines). Refused when anything else in the evaluation
    changed since it was pinned: that needs its own review (``--repin``)."""
    from evolve.deploy.gates import run_splits
    from evolve.deploy.lifecycle import open_run
    from evolve.deploy.pins import PINS_KEY, make_pins, pin_changes, save_pins
    from evolve.errors import UserError
    from evolve.task.taskfile import load_task

    cfg, base = load_task(task_file, list(overrides))
    if cfg.deploy is None:
        raise UserError(f"{task_file} has no deploy: section, so nothing is pinned to accept a file into")
    by = by or who()
    with open_run(run_dir) as archive:
        saved = archive.get_state(PINS_KEY)
        if saved is None:
            raise DeployError("this run's evaluation is not pinned yet; run evolve promote TASK RUN first")
        held_back = dict(archive.get_state(UNACCEPTED_KEY) or {})
        shown: list[dict[str, Any]] = []
        for given in files:
            f = Path(given).expanduser().resolve()
            if not f.is_file():
                raise UserError(
                    f"--accept-read {given}: {f} is not a file; name a file the refusal listed"
                    + (f" ({', '.join(sorted(held_back))})" if held_back else "")
                )
            shown.append(
                {
                    "path": str(f),
                    "sha256": file_sha(f),
                    "bytes": f.stat().st_size,
                    "seen": held_back.get(str(f)),
                    "text": _shown(f),
                }
            )
        splits = run_splits(cfg, base, archive)
        observed = list(((saved["pins"].get("code") or {}).get("observed")) or [])
        changed = pin_changes(saved["pins"], make_pins(cfg, base, splits, observed))
        if changed:
            raise DeployError(
                "the evaluation changed since it was pinned, besides the files to accept: "
                + "; ".join(changed[:6])
                + ". Review that change and re-pin it with evolve promote "
                "TASK RUN --repin, then accept the files"
            )
        pins = make_pins(cfg, base, splits, sorted(set(observed) | {s["path"] for s in shown}))
        _, pid = save_pins(archive, pins, by, saved)
        for s in shown:
            held_back.pop(s["path"], None)
        with archive.transaction():
            archive.put_state(UNACCEPTED_KEY, held_back)
            archive.log_event(
                "deploy_accept_read", {"by": by, "pins": pid, "files": {s["path"]: s["sha256"] for s in shown}}
            )
    names = ", ".join(f"{s['path']} (sha256 {s['sha256']})" for s in shown)
    return {"files": shown, "pins": pid, "message": f"accepted by {by} and pinned as they are now ({pid}): {names}"}


__all__ = ["UNACCEPTED_KEY", "accept_reads", "hold", "refuse_unaccepted", "unaccepted"]
