"""Runs the MCP server starts in the background, and what it knows of them.

A run is one child process, ``python -m evolve.mcp._worker run JOB_DIR -- run TASK --out RUN_DIR
...`` (which checks the task file, then runs ``evolve run`` in a process of its own and waits for it),
in a session of its own with stdin closed and its output in
``RUN_DIR/mcp/run.log``: it outlives the server (a client that kills its server kills no run) and
the archive is its only state, so a run stopped in any way is continued with ``--resume``.

``RUN_DIR/mcp/job.json`` (written by the server) holds how the run was started, every attempt,
and the child's pid with its start time from ``/proc`` (a pid reused by another process is never
taken for the run, nor signalled); ``RUN_DIR/mcp/exit.json`` (written by the child as it ends)
its exit code. A run killed with -9 leaves no exit code: it reads as ``stopped``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from evolve.errors import RunDirError, UserError

JOB_FOLDER = "mcp"
# exit code of `evolve run` -> the run's state (evolve.errors lists the codes)
EXIT_STATES = {0: "finished", 1: "failed", 2: "refused", 3: "world_failed", 130: "stopped"}


def job_dir(run_dir: Path) -> Path:
    return run_dir / JOB_FOLDER


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), or None
    where there is no ``/proc``; with the pid it names one process for good."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3
    return None if fields[0] == "Z" else fields[19]


def _is_archive(run_dir: Path) -> bool:
    """Whether ``run_dir/archive.sqlite`` is an evolvekit archive (opened read-only: nothing is written)."""
    import sqlite3

    from evolve.archive import Archive
    from evolve.errors import EvolveError

    try:
        with Archive(run_dir, create=False, read_only=True):
            return True
    except (EvolveError, sqlite3.Error):
        return False


class Jobs:
    """The background runs of one server (and those an earlier server left running)."""

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen] = {}  # reaped here, so an ended child is no zombie
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ reading

    def job(self, run_dir: Path) -> dict[str, Any] | None:
        return _read_json(job_dir(run_dir) / "job.json")

    def alive(self, job: dict[str, Any] | None) -> bool:
        """Whether the job's process is running (the same process it started: pid and start time)."""
        if not job or not job.get("pid"):
            return False
        pid = int(job["pid"])
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:
            self._children.pop(pid, None)
            return False
        if Path("/proc").is_dir():
            start = _proc_start(pid)
            return start is not None and start == job.get("proc_start")
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True

    def state(self, run_dir: Path) -> dict[str, Any] | None:
        """``{state, pid, exit_code, started, ended, attempts, task, sets, log}`` of a run this
        server (or another) started, or None for a run started otherwise."""
        job = self.job(run_dir)
        if job is None:
            return None
        ended = _read_json(job_dir(run_dir) / "exit.json")
        if self.alive(job):
            state, rc = "running", None
        elif ended is not None and ended.get("pid") == job.get("pid"):
            rc = ended.get("rc")
            state = EXIT_STATES.get(rc, "failed") if isinstance(rc, int) else "failed"
        else:  # gone without a word: killed (-9, the machine went down)
            rc, state = None, "stopped"
        return {
            "state": state,
            "pid": job.get("pid"),
            "exit_code": rc,
            "started": job.get("started"),
            "ended": (ended or {}).get("ended") if state != "running" else None,
            "attempts": len(job.get("attempts", [])),
            "task": job.get("task"),
            "sets": job.get("sets", []),
            "log": str(job_dir(run_dir) / "run.log"),
        }

    def log_tail(self, run_dir: Path, lines: int = 20, max_chars: int = 4000) -> str:
        try:
            with open(job_dir(run_dir) / "run.log", "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])[-max_chars:]

    # ------------------------------------------------------------------ starting and stopping

    def start(
        self,
        task: Path,
        run_dir: Path,
        sets: list[str],
        *,
        resume: bool,
        fresh: bool,
        cwd: Path,
        env: dict[str, str] | None = None,
    ) -> dict:
        """Start ``evolve run TASK --out RUN_DIR`` (``--resume``) in the background, with ``env`` added
        to its environment; returns its state. Refuses a run directory whose run is running, or that
        holds a run unless resumed or fresh; ``fresh`` moves aside only a run directory (one holding an
        evolvekit archive), never a folder that merely has a file of that name."""
        with self._lock:
            job = self.job(run_dir)
            if job is not None and self.alive(job):
                raise RunDirError(
                    f"{run_dir} is running already (pid {job['pid']}); follow it with run_status or "
                    "wait_run, or stop it with stop_run"
                )
            holds = (run_dir / "archive.sqlite").exists()
            if holds and not _is_archive(run_dir):
                raise RunDirError(
                    f"{run_dir} holds an archive.sqlite that is not an evolvekit archive, so it is not a "
                    "run directory; give another out"
                )
            if holds and not resume and not fresh:
                raise RunDirError(
                    f"{run_dir} already holds a run; continue it with resume_run, start it over with "
                    "fresh=true (the earlier run is moved aside, not deleted), or give another out"
                )
            moved = None
            if holds and fresh:
                from evolve.scoring.rundir import set_aside

                moved = set_aside(run_dir)
                job = None
            folder = job_dir(run_dir)
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise RunDirError(f"cannot create the run directory {run_dir}: {e.strerror or e}") from None
            (folder / "exit.json").unlink(missing_ok=True)
            args = ["run", str(task), "--out", str(run_dir)]
            args += [f"--set={item}" for item in sets]  # one argument each: a value is never read as a flag
            if resume:
                args.append("--resume")
            argv = [sys.executable, "-m", "evolve.mcp._worker", "run", str(folder), "--", *args]
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "120", **(env or {})}
            with open(folder / "run.log", "ab") as log:
                log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} evolve {' '.join(args)}\n".encode())
                log.flush()
                try:
                    child = subprocess.Popen(
                        argv,
                        cwd=cwd,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        env=env,
                    )
                except OSError as e:
                    raise UserError(f"cannot start the run: {e.strerror or e}") from None
            self._children[child.pid] = child
            attempts = (job or {}).get("attempts", []) + [
                {"started": time.time(), "pid": child.pid, "resume": resume, "args": args}
            ]
            _write_json(
                folder / "job.json",
                {
                    "task": str(task),
                    "sets": list(sets),
                    "run_dir": str(run_dir),
                    "pid": child.pid,
                    "proc_start": _proc_start(child.pid),
                    "started": time.time(),
                    "attempts": attempts,
                },
            )
        out = self.state(run_dir) or {}
        if moved is not None:
            out["moved_aside"] = str(moved)
        return out

    def stop(self, run_dir: Path, timeout: float = 30.0) -> dict[str, Any]:
        """Interrupt the run (SIGINT to its process group: it keeps what finished, as Ctrl-C does);
        SIGTERM, then SIGKILL, when it has not ended after ``timeout`` seconds."""
        job = self.job(run_dir)
        if job is None:
            raise UserError(
                f"{run_dir} was not started by evolve mcp (no {JOB_FOLDER}/job.json); stop it where it was started"
            )
        if not self.alive(job):
            return {**(self.state(run_dir) or {}), "signal": None, "message": "the run was not running"}
        pid = int(job["pid"])
        sent = None
        for sig, wait in ((signal.SIGINT, timeout), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if not self.alive(job):
                break
            try:
                os.killpg(pid, sig)  # the run's own session: its runner's workers and sandboxes too
            except ProcessLookupError:
                break
            sent = sig.name
            deadline = time.monotonic() + wait
            while self.alive(job) and time.monotonic() < deadline:
                time.sleep(0.1)
        st = self.state(run_dir) or {}
        return {**st, "signal": sent, "message": f"stopped with {sent}; what finished is kept: resume_run continues it"}

    def close(self) -> None:
        """Forget the children (they run on; init reaps them once this process is gone)."""
        self._children.clear()


__all__ = ["EXIT_STATES", "Jobs", "job_dir"]
