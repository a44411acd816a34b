"""What the MCP server runs in a child process: ``python -m evolve.mcp._worker OP ...``.

Anything that imports the task's own code (the agent, the reward, a dataset generator) runs
here, never in the server: a module the client just edited is imported fresh, and code that
crashes or hangs takes only its child with it. The ops:

* ``validate TASK [--set K=V ...]`` — the task file loaded as ``evolve run`` loads it, its
  agent and reward imported, its dataset read; prints what the run would be;
* ``dry-run TASK [--set ...]`` — :func:`evolve.api.dry_run`;
* ``promote TASK RUN [--system ID] [--approve] [--repin] [--by WHO] [--set ...]`` — the deploy
  policy (:mod:`evolve.deploy.manage`);
* ``run JOB_DIR -- ARGS...`` — ``evolve ARGS...`` in a child process (a background run,
  :mod:`evolve.mcp.jobs`), its exit code written to ``JOB_DIR/exit.json`` when it ends.

Before any op loads the task file, :func:`evolve.mcp.taskcheck.check_task` reads it field by field
against the server's import guard (``$EVOLVE_MCP_ROOTS``, :mod:`evolve.mcp.guard`), which this
process installs in the registry (and its children from their environment), so that
:func:`evolve.registry.import_path` applies it again wherever the work imports a path.

Each op but ``run`` prints one JSON line on stdout, ``{"ok": true, "result": ...}`` or
``{"ok": false, "kind": "user" | "infra" | "failed" | "bug", "error": message}``; whatever else
the work prints goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def checked(task: str, sets: list[str]) -> None:
    """Refuse a task that names code or paths a client may not, before anything in it is imported."""
    from evolve.mcp.guard import from_env
    from evolve.mcp.taskcheck import check_task
    from evolve.registry import set_import_guard

    guard = from_env()  # refuses when the server named no --root folders
    set_import_guard(guard)
    check_task(task, sets, guard)


def _run_args(argv: list[str]) -> tuple[str, list[str]]:
    """The task file and ``--set`` values of ``run TASK --out DIR [--set=K=V ...] [--resume]``
    (``--set K=V`` too)."""
    sets = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--set"]
    sets += [a[len("--set=") :] for a in argv if a.startswith("--set=")]
    return argv[1], sets


def validate(task: str, sets: list[str]) -> dict[str, Any]:
    from evolve.registry import import_path
    from evolve.task.data import load_splits
    from evolve.task.taskfile import load_task

    cfg, base = load_task(task, sets)
    for what in ("agent", "reward"):
        import_path(getattr(cfg, what), what=what, search=base)
    splits = load_splits(cfg.dataset, base, cfg.seed)
    ds = cfg.dataset
    files = [f for f in (ds.train, ds.val, ds.test, cfg.tools, (cfg.memory or {}).get("store")) if f]
    if cfg.deploy is not None:
        suites = [cfg.deploy.regression, *cfg.deploy.guards]
        files += [s.tasks for s in suites if s is not None and s.tasks not in ("train", "val", "test")]
    return {
        "name": cfg.name,
        "seed": cfg.seed,
        "world": cfg.world,
        "agent": cfg.agent,
        "reward": cfg.reward,
        "models": {role: {"backend": m.backend, "name": m.name} for role, m in cfg.models.items()},
        "prompts": sorted(cfg.prompts),
        "operators": [op.name for op in cfg.operators],
        "budget": {k: v for k, v in cfg.budget.model_dump().items() if v is not None},
        "sizes": {split: len(tasks) for split, tasks in splits.items()},
        "deploy": cfg.deploy is not None,
        "out": cfg.out,
        "files": [str((base / f).resolve()) for f in files if isinstance(f, str)],
        "base_dir": str(base),
    }


def dry_run(task: str, sets: list[str]) -> dict[str, Any]:
    from evolve.api import dry_run as estimate

    return estimate(task, overrides=sets)


def promote(
    task: str, run: str, *, system: str | None, approve: bool, repin: bool, by: str | None, sets: list[str]
) -> dict[str, Any]:
    from evolve.deploy.manage import approve as approve_
    from evolve.deploy.manage import promote as promote_

    if approve:
        return approve_(run, system=system, by=by)
    return promote_(task, run, system=system, by=by, repin=repin, overrides=sets)


def run(job_dir: str, argv: list[str]) -> int:
    """``evolve ARGV`` as a command, in a child process that carries this one's environment (the
    import guard with it); its exit code goes to ``JOB_DIR/exit.json`` as it ends (a run killed with
    -9 leaves none: the server reads it as stopped)."""
    import os
    import signal
    import subprocess

    from evolve.errors import UserError

    rc = 1
    try:
        checked(*_run_args(argv))
        # stop_run's SIGINT reaches the whole process group: the run stops itself gracefully while this
        # process waits for its exit code (a handler, not SIG_IGN, so the run does not inherit it)
        signal.signal(signal.SIGINT, lambda *_: None)
        rc = subprocess.call([sys.executable, "-m", "evolve", *argv])
        rc = 128 - rc if rc < 0 else rc  # ended by a signal: the shell's code for it
    except UserError as e:  # refused before the run began: said in its log, exit code 2 (refused)
        print(f"error: {e}", file=sys.stderr)
        rc = 2
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        rc = 130
    finally:
        path = Path(job_dir) / "exit.json"
        try:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"rc": rc, "ended": time.time(), "pid": os.getpid()}))
            tmp.replace(path)
        except OSError:
            pass
    return rc


def _kind(e: BaseException) -> str:
    from evolve.errors import ArchiveError, EvolveError, InfraError, UserError

    if isinstance(e, (UserError, ArchiveError)):
        return "user"
    if isinstance(e, InfraError):
        return "infra"
    if isinstance(e, EvolveError):
        return "failed"
    return "bug"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        if len(argv) < 3 or argv[2] != "--":
            print("usage: python -m evolve.mcp._worker run JOB_DIR -- ARGS...", file=sys.stderr)
            return 2
        return run(argv[1], argv[3:])
    p = argparse.ArgumentParser(prog="python -m evolve.mcp._worker")
    p.add_argument("op", choices=["validate", "dry-run", "promote"])
    p.add_argument("task")
    p.add_argument("run_dir", nargs="?")
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--system")
    p.add_argument("--by")
    p.add_argument("--approve", action="store_true")
    p.add_argument("--repin", action="store_true")
    a = p.parse_args(argv)
    from evolve._env import quiet_defaults

    quiet_defaults()
    out = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):  # only the answer goes to stdout
            checked(a.task, a.sets)
            if a.op == "validate":
                result = validate(a.task, a.sets)
            elif a.op == "dry-run":
                result = dry_run(a.task, a.sets)
            else:
                result = promote(
                    a.task, a.run_dir, system=a.system, approve=a.approve, repin=a.repin, by=a.by, sets=a.sets
                )
        answer: dict[str, Any] = {"ok": True, "result": result}
    except Exception as e:  # noqa: BLE001 - every failure becomes the answer; a bug keeps its traceback on stderr
        kind = _kind(e)
        if kind == "bug":
            traceback.print_exc()
        answer = {"ok": False, "kind": kind, "error": str(e) if kind != "bug" else f"{type(e).__name__}: {e}"}
    out.write(json.dumps(answer, default=str) + "\n")
    out.flush()
    return 0 if answer["ok"] else 2 if answer["kind"] == "user" else 1


if __name__ == "__main__":
    raise SystemExit(main())
