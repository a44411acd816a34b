"""The process runner: worker processes fed through pipes (see :mod:`evolve.runners`), and
the code those worker processes run (:func:`_process_main`, their entry point, lives here at
module level so that ``forkserver``/``spawn`` children can import it by name)."""

from __future__ import annotations

import atexit
import collections
import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import weakref
from multiprocessing.connection import wait as mp_wait
from typing import Any, Iterator, Sequence

from evolve.errors import EvolveError, UserError
from evolve.scoring.failures import infra
from evolve.runners.base import RolloutJob, Worker, WorkerSpec, as_import_path, failed_trajectory
from evolve.types import Trajectory


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _exit_text(code: int | None) -> str:
    if code is None:
        return "exit code unknown"
    if code < 0:
        return f"killed by {_signal_name(code)}"
    return f"exit code {code}"


def _kill_group(pid: int | None, proc: Any = None) -> None:
    """SIGKILL the process group led by ``pid`` (the worker and anything it started)."""
    if pid is not None:
        try:
            os.killpg(pid, signal.SIGKILL)
            return
        except (ProcessLookupError, PermissionError, OSError):
            pass
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.kill()


def _watch_parent(parent_pid: int) -> None:
    """In a worker: if the runner's process disappears, take the whole process group down."""
    while True:
        time.sleep(1.0)
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            with contextlib.suppress(Exception):
                os.killpg(0, signal.SIGKILL)
            os._exit(1)
        except PermissionError:
            pass


def _process_main(conn: Any, spec: WorkerSpec, parent_pid: int, parent_path: list[str]) -> None:
    """The body of a worker process: build a Worker, then run jobs until told to stop."""
    with contextlib.suppress(OSError):
        os.setsid()  # own process group: a kill takes the agent's subprocesses too
    with contextlib.suppress(Exception):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner decides when workers stop
    for p in parent_path:
        if p not in sys.path:
            sys.path.append(p)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="evolve-parent-watch").start()
    try:
        worker = Worker(spec, own_process=True)
    except BaseException as e:  # noqa: BLE001 - reported to the runner, which raises it
        with contextlib.suppress(Exception):
            kind = "user" if isinstance(e, UserError) else "other"
            conn.send(("fatal", kind, f"{type(e).__name__}: {e}" if kind == "other" else str(e)))
        return
    try:
        conn.send(("ready", os.getpid()))
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            if msg is None:
                break
            token, idx, job = msg
            try:
                traj = worker.execute(job, lambda: conn.send(("started", token, idx)))
            except (BrokenPipeError, ConnectionError):
                raise
            except BaseException as e:  # noqa: BLE001 - SystemExit inside an agent: this worker goes on
                traj = failed_trajectory(job, f"agent raised {type(e).__name__}: {e}")
            try:
                data = traj.model_dump_json()
            except Exception as e:  # noqa: BLE001
                data = failed_trajectory(job, f"runner: the trajectory is not JSON: {type(e).__name__}: {e}",
                                         traj.duration).model_dump_json()
            conn.send(("done", token, idx, data))
    except (BrokenPipeError, ConnectionError, EOFError, OSError):
        pass  # the runner is gone (closed, or its process died): nothing to report to
    finally:
        worker.close()


class _Proc:
    __slots__ = ("proc", "conn", "pid", "ready", "job", "token", "sent_at", "started_at", "born")

    def __init__(self, proc: Any, conn: Any) -> None:
        self.proc, self.conn, self.pid = proc, conn, proc.pid
        self.ready = False
        self.job: int | None = None
        self.token = 0
        self.sent_at = 0.0
        self.started_at: float | None = None
        self.born = time.monotonic()


_live_runners: "weakref.WeakSet[ProcessRunner]" = weakref.WeakSet()


@atexit.register
def _close_live_runners() -> None:
    for r in list(_live_runners):
        with contextlib.suppress(Exception):
            r.close()


class ProcessRunner:
    """``workers`` worker processes fed through pipes; see :mod:`evolve.runners`.

    ``grace``: seconds past a job's ``timeout`` before its worker is killed (the agent's own
    cooperative deadline usually ends it first, with its steps recorded).
    ``start_method``: ``"forkserver"`` (default where available) or ``"spawn"``.
    ``start_timeout``: seconds a new worker may take to import the agent and be ready, and extra
    seconds a job may spend building the system's models before its rollout (and clock) starts.
    Workers live across ``run()`` calls with the same spec (their LLMs stay loaded).
    """

    MAX_START_FAILURES = 3

    def __init__(self, workers: int = 2, *, grace: float = 5.0, start_method: str | None = None,
                 start_timeout: float = 120.0) -> None:
        if workers < 1:
            raise UserError(f"a runner needs at least one worker; got workers={workers}")
        self.workers = int(workers)
        self.grace = float(grace)
        self.start_timeout = float(start_timeout)
        if start_method is None:
            start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        if start_method == "fork":
            raise UserError("the process runner does not use 'fork' (unsafe with threads); use 'forkserver' or 'spawn'")
        self._ctx = mp.get_context(start_method)
        self._procs: list[_Proc] = []
        self._spec: WorkerSpec | None = None
        self._token = 0
        self.restarts = 0  # workers replaced after a kill or a crash, over the runner's life
        _live_runners.add(self)

    # ------------------------------------------------------------------ processes

    def _start(self) -> _Proc:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_process_main, args=(child, self._spec, os.getpid(), list(sys.path)),
                                 name="evolve-worker", daemon=False)
        proc.start()
        child.close()
        w = _Proc(proc, parent)
        self._procs.append(w)
        return w

    def _discard(self, w: _Proc, *, kill: bool) -> int | None:
        if kill:
            _kill_group(w.pid, w.proc)
        w.proc.join(timeout=5)
        if w.proc.is_alive():
            _kill_group(w.pid, w.proc)
            w.proc.join(timeout=5)
        # the worker is gone; take down anything it left running in its group
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.killpg(w.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            w.conn.close()
        if w in self._procs:
            self._procs.remove(w)
        code = w.proc.exitcode
        with contextlib.suppress(Exception):
            w.proc.close()
        return code

    def _shutdown(self) -> None:
        """Ask idle workers to stop (they close their LLMs); kill the busy and the not-ready."""
        polite = [w for w in self._procs if w.ready and w.job is None]
        for w in polite:
            with contextlib.suppress(Exception):
                w.conn.send(None)
        deadline = time.monotonic() + 3.0
        for w in list(self._procs):
            if w in polite:
                w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            self._discard(w, kill=w.proc.is_alive())
        self._procs = []

    def _deadline(self, w: _Proc, jobs: list[RolloutJob]) -> float | None:
        """When ``w`` must be given up on: not ready by ``start_timeout``; its job past
        ``timeout + grace`` (plus ``start_timeout`` for building the models before it starts)."""
        if not w.ready:
            return w.born + self.start_timeout
        if w.job is None or not jobs[w.job].timeout:
            return None
        limit = (jobs[w.job].timeout or 0.0) + self.grace
        return w.started_at + limit if w.started_at is not None else w.sent_at + self.start_timeout + limit

    # ------------------------------------------------------------------ run

    def run(self, spec: WorkerSpec, jobs: Sequence[RolloutJob]) -> Iterator[tuple[RolloutJob, Trajectory]]:
        """Check the spec (import paths) now and return the iterator; workers start lazily."""
        spec = WorkerSpec(agent=as_import_path(spec.agent, "agent"), reward=as_import_path(spec.reward, "reward"),
                          artifacts_root=spec.artifacts_root, search_path=spec.search_path)
        if spec != self._spec:
            self._shutdown()
            self._spec = spec
        self._token += 1
        return self._iter(list(jobs), self._token)

    def _iter(self, jobs: list[RolloutJob], token: int) -> Iterator[tuple[RolloutJob, Trajectory]]:
        n = len(jobs)
        if n == 0:
            return
        todo = collections.deque(range(n))
        emitted = [False] * n
        left = n
        start_failures = 0
        out: list[tuple[RolloutJob, Trajectory]] = []

        def emit(idx: int, traj: Trajectory) -> None:
            nonlocal left
            if not emitted[idx]:
                emitted[idx] = True
                left -= 1
                out.append((jobs[idx], traj))

        try:
            while True:
                # keep the pool full while there is work, and hand idle ready workers a job
                # (before yielding, so the workers keep going while the caller handles the results)
                while len(self._procs) < min(self.workers, len(todo) + sum(w.job is not None for w in self._procs)):
                    self._start()
                for w in self._procs:
                    if todo and w.ready and w.job is None:
                        idx = todo.popleft()
                        try:
                            w.conn.send((token, idx, jobs[idx]))
                        except (BrokenPipeError, ConnectionError, EOFError):
                            todo.appendleft(idx)  # the worker is dying; its sentinel will tell
                            continue
                        except Exception as e:  # noqa: BLE001 - the job cannot be pickled
                            emit(idx, failed_trajectory(jobs[idx], f"runner: cannot send the job to a worker "
                                                        f"process: {type(e).__name__}: {e}"))
                            continue
                        w.job, w.token, w.sent_at, w.started_at = idx, token, time.monotonic(), None
                yield from out
                out.clear()
                if not left:
                    break

                # wait for a message, a death, or the next deadline
                now = time.monotonic()
                wake = 1.0
                for w in self._procs:
                    d = self._deadline(w, jobs)
                    if d is not None:
                        wake = min(wake, d - now)
                handles = [w.conn for w in self._procs] + [w.proc.sentinel for w in self._procs]
                ready = set(mp_wait(handles, timeout=max(0.0, wake)))

                for w in list(self._procs):
                    dead = w.proc.sentinel in ready
                    if w.conn in ready or dead:
                        try:
                            while w.conn.poll():
                                msg = w.conn.recv()
                                kind = msg[0]
                                if kind == "ready":
                                    w.ready = True
                                    start_failures = 0
                                elif kind == "fatal":
                                    _, what, text = msg
                                    self._shutdown()
                                    raise (UserError if what == "user" else EvolveError)(
                                        f"a worker process could not start: {text}")
                                elif kind == "started" and msg[1] == w.token and msg[2] == w.job:
                                    w.started_at = time.monotonic()
                                elif kind == "done" and msg[1] == w.token and msg[2] == w.job:
                                    idx = msg[2]
                                    w.job, w.started_at = None, None
                                    if msg[1] == token:
                                        emit(idx, Trajectory.model_validate_json(msg[3]))
                        except (EOFError, OSError):
                            dead = True
                    if dead:
                        code = self._discard(w, kill=True)
                        if w.job is not None and w.token == token:
                            self.restarts += 1
                            why = f"worker process died ({_exit_text(code)}) while running this rollout"
                            emit(w.job, failed_trajectory(jobs[w.job], why, time.monotonic() - (w.started_at or w.sent_at),
                                                          infra=infra("worker", why, "runner")))
                        if not w.ready:
                            start_failures += 1
                            if start_failures >= self.MAX_START_FAILURES:
                                self._shutdown()
                                raise UserError(f"worker processes keep dying before they are ready "
                                                f"({_exit_text(code)}, {start_failures} times in a row)")

                now = time.monotonic()
                for w in list(self._procs):
                    if not w.ready and now - w.born > self.start_timeout:
                        self._shutdown()
                        raise UserError(f"a worker process did not start within {self.start_timeout:g}s "
                                        "(importing the agent or the reward hangs?)")
                    if w.job is None:
                        continue
                    d = self._deadline(w, jobs)
                    if d is not None and now > d:
                        idx, limit = w.job, jobs[w.job].timeout or 0.0
                        elapsed = now - (w.started_at or w.sent_at)
                        phase = "" if w.started_at else " while building the system's models"
                        self._discard(w, kill=True)
                        self.restarts += 1
                        emit(idx, failed_trajectory(
                            jobs[idx], f"timeout: killed after {elapsed:.1f}s{phase} (limit {limit:g}s + "
                            f"{self.grace:g}s grace); the worker process was replaced", elapsed))
        finally:
            # abandoned early or failed: workers still busy with this run's jobs are killed
            for w in list(self._procs):
                if w.job is not None and w.token == token:
                    self._discard(w, kill=True)

    def close(self) -> None:
        self._shutdown()
        self._spec = None

    def __enter__(self) -> "ProcessRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
