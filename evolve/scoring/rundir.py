"""A run directory's life: made for a new run, reopened to resume, replaced when a start failed
before doing any work, refused (with what changed) for another task, moved aside by ``--fresh``.

:func:`open_run` is called once everything a mistake can be found in (the task file, the dataset,
the agent, the reward, the models' keys) has loaded, so a failed start leaves nothing in the way.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from evolve.archive import Archive
from evolve.errors import RunDirError
from evolve.task.config import TaskConfig
from evolve.task.fingerprint import changes, fingerprint, same_run

WAYS_ON = "start it over with --fresh (the earlier run is moved aside, not deleted), or choose another --out"


def open_run(
    run_dir: Path,
    task: TaskConfig,
    base_dir: Path,
    *,
    resume: bool = False,
    fresh: bool = False,
    evaluating: bool = False,
    observer: Any = None,
) -> Archive:
    """The run's archive in ``run_dir``, checked against ``task`` (see the module docstring).
    ``evaluating``: scoring a finished run (``evolve eval``), whose stored task is left as it is."""
    say = getattr(observer, "message", None) or (lambda text: None)
    if fresh and resume:
        raise RunDirError("--fresh starts the run over and --resume continues it; give one of them")
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is a file, not a run directory; choose another --out")
    exists = (run_dir / "archive.sqlite").exists()
    if fresh and exists:
        say(f"--fresh: moved the earlier run to {set_aside(run_dir)} (delete it when you no longer need it)")
        exists = False
    if resume and not exists:
        say(f"nothing to resume in {run_dir}; starting a new run")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunDirError(f"cannot create the run directory {run_dir}: {e.strerror or e}") from None
    archive = Archive(run_dir)
    try:
        _check(archive, run_dir, task, base_dir, resume, evaluating)
    except BaseException:
        archive.close()
        raise
    started = getattr(observer, "started", None)  # observers written before it existed lack it
    if started is not None:
        started(run_dir)
    return archive


def _check(archive: Archive, run_dir: Path, task: TaskConfig, base_dir: Path, resume: bool, evaluating: bool) -> None:
    saved = archive.get_state("task")
    if (
        saved is not None
        and not evaluating
        and archive.get_state("baseline") is None
        and not archive.usage()["rollouts"]
    ):  # a start that failed before doing any work: replaced
        if not same_run(task, saved):
            archive.log_event("replaced", {"why": "the run held no work", "was": json.loads(saved)})
        saved = None
    if saved is None:
        archive.put_state("task", fingerprint(task))
        archive.put_state("base_dir", str(base_dir))  # where the task's own modules live
    elif not resume and not evaluating:
        raise RunDirError(f"{run_dir} already holds a run; continue it with --resume, {WAYS_ON}")
    elif not same_run(task, saved, evaluating=evaluating):
        what = "\n  ".join(changes(task, saved, evaluating=evaluating))
        raise RunDirError(
            f"{run_dir} was started with a different task configuration:\n  {what}\n"
            "Resume it with the task file and --set values it was started with (only budget, "
            f"failures, deploy and track may change), {WAYS_ON}"
        )
    elif not evaluating and (was := json.loads(saved).get("budget")) != (now := task.budget.model_dump()):
        archive.put_state("task", fingerprint(task))  # a new budget: the run goes on under it, and says so
        archive.log_event("budget", {"was": was, "now": now})


def set_aside(run_dir: Path) -> Path:
    """Move a run directory to ``NAME.replaced-YYYYmmdd-HHMMSS`` beside it (``--fresh``): nothing
    is deleted. Refuses the working directory and its parents (a run in ``.`` is the user's folder)."""
    here, target = Path.cwd().resolve(), run_dir.resolve()
    if target == here or target in here.parents:
        raise RunDirError(f"--fresh would move {run_dir}, which holds the working directory; choose another --out")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = target.with_name(f"{target.name}.replaced-{stamp}")
    k = 1
    while dest.exists():
        k += 1
        dest = target.with_name(f"{target.name}.replaced-{stamp}-{k}")
    try:
        target.rename(dest)
    except OSError as e:
        raise RunDirError(f"--fresh could not move {run_dir} aside to {dest}: {e.strerror or e}") from None
    return dest
