"""The process runner: worker processes fed through pipes (see :mod:`evolve.runners`), and
the code those worker processes run (:func:`_process_main`, their entry point, lives here at
module level so that ``forkserver``/``spawn`` children can import it by name)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from multiprocessing.connection import wait as mp_wait
from typing import Any

from evolve.errors import EvolveError, UserError
from evolve.runners.base import RolloutJob, Worker, WorkerSpec, as_import_path, failed_trajectory
from evolve.runners.schedule import Finished, Slot, schedule
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
                traj = worker.execute(job, functools.partial(conn.send, ("started", token, idx)))
            except (BrokenPipeError, ConnectionError):
                raise
            except BaseException as e:  # noqa: BLE001 - SystemExit inside an agent: this worker goes on
                traj = failed_trajectory(job, f"agent raised {type(e).__name__}: {e}")
            try:
                data = traj.model_dump_json()
            except Exception as e:  # noqa: BLE001
                data = failed_trajectory(
                    job, f"runner: the trajectory is not JSON: {type(e).__name__}: {e}", traj.duration
                ).model_dump_json()
            conn.send(("done", token, idx, data))
    except (BrokenPipeError, ConnectionError, EOFError, OSError):
        pass  # the runner is gone (closed, or its process died): nothing to report to
    finally:
        worker.close()


class _Proc(Slot):
    def __init__(self, proc: Any, conn: Any) -> None:
        super().__init__()
        self.proc, self.conn, self.pid = proc, conn, proc.pid


class _Processes:
    """The process runner's pool (:class:`~evolve.runners.schedule.Pool`): worker processes, each
    with its own duplex pipe, building their worker from ``spec``. They live across runs."""

    MAX_START_FAILURES = 3
    noun, verb, aftermath, reports_start = "worker process", "killed", "the worker process was replaced", True

    def __init__(self, ctx: Any, start_timeout: float) -> None:
        self._ctx, self.start_timeout = ctx, start_timeout
        self.spec: WorkerSpec | None = None
        self.slots: list[_Proc] = []
        self.replaced = 0
        self.start_failures = 0  # workers that died before they were ready, in a row

    def start(self) -> _Proc:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=_process_main,
            args=(child, self.spec, os.getpid(), list(sys.path)),
            name="evolve-worker",
            daemon=False,
        )
        proc.start()
        child.close()
        w = _Proc(proc, parent)
        self.slots.append(w)
        return w

    def submit(self, w: _Proc, job: RolloutJob) -> bool:
        try:
            w.conn.send((w.run, w.index, job))
        except (BrokenPipeError, ConnectionError, EOFError):
            return False  # the worker is dying; its sentinel will tell
        return True

    def wait(self, timeout: float) -> list[Finished[_Proc]]:
        """The workers' messages (ready; started: the rollout's clock; done) and deaths."""
        handles = [w.conn for w in self.slots] + [w.proc.sentinel for w in self.slots]
        ready = set(mp_wait(handles, timeout=timeout))
        out: list[Finished[_Proc]] = []
        for w in list(self.slots):
            dead = w.proc.sentinel in ready
            if w.conn in ready or dead:
                try:
                    while w.conn.poll():
                        msg = w.conn.recv()
                        kind = msg[0]
                        if kind == "ready":
                            w.ready = True
                            self.start_failures = 0
                        elif kind == "fatal":
                            _, what, text = msg
                            self.shutdown()
                            raise (UserError if what == "user" else EvolveError)(
                                f"a worker process could not start: {text}"
                            )
                        elif kind == "started" and msg[1] == w.run and msg[2] == w.index:
                            w.started_at = time.monotonic()
                        elif kind == "done" and msg[1] == w.run and msg[2] == w.index:
                            out.append(Finished(w, Trajectory.model_validate_json(msg[3])))
                except (EOFError, OSError):
                    dead = True
            if dead:
                code = self._discard(w, kill=True)
                out.append(Finished(w, None, f"worker process died ({_exit_text(code)})"))
                if not w.ready:
                    self.start_failures += 1
                    if self.start_failures >= self.MAX_START_FAILURES:
                        self.shutdown()
                        raise UserError(
                            f"worker processes keep dying before they are ready "
                            f"({_exit_text(code)}, {self.start_failures} times in a row)"
                        )
        return out

    def kill(self, w: _Proc) -> None:
        self._discard(w, kill=True)

    def not_ready(self, w: _Proc) -> EvolveError:
        self.shutdown()
        return UserError(
            f"a worker process did not start within {self.start_timeout:g}s (importing the agent or the reward hangs?)"
        )

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
        if w in self.slots:
            self.slots.remove(w)
        code = w.proc.exitcode
        with contextlib.suppress(Exception):
            w.proc.close()
        return code

    def shutdown(self) -> None:
        """Ask idle workers to stop (they close their LLMs); kill the busy and the not-ready."""
        polite = [w for w in self.slots if w.ready and w.job is None]
        for w in polite:
            with contextlib.suppress(Exception):
                w.conn.send(None)
        deadline = time.monotonic() + 3.0
        for w in list(self.slots):
            if w in polite:
                w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            self._discard(w, kill=w.proc.is_alive())
        self.slots = []


_live_runners: weakref.WeakSet[ProcessRunner] = weakref.WeakSet()


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

    def __init__(
        self, workers: int = 2, *, grace: float = 5.0, start_method: str | None = None, start_timeout: float = 120.0
    ) -> None:
        if workers < 1:
            raise UserError(f"a runner needs at least one worker; got workers={workers}")
        self.workers = int(workers)
        self.grace = float(grace)
        self.start_timeout = float(start_timeout)
        if start_method is None:
            start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        if start_method == "fork":
            raise UserError("the process runner does not use 'fork' (unsafe with threads); use 'forkserver' or 'spawn'")
        self._pool = _Processes(mp.get_context(start_method), self.start_timeout)
        self._token = 0
        _live_runners.add(self)

    @property
    def restarts(self) -> int:
        """Workers replaced after a kill or a crash, over the runner's life."""
        return self._pool.replaced

    def run(self, spec: WorkerSpec, jobs: Sequence[RolloutJob]) -> Iterator[tuple[RolloutJob, Trajectory]]:
        """Check the spec (import paths) now and return the iterator; workers start lazily."""
        spec = WorkerSpec(
            agent=as_import_path(spec.agent, "agent"),
            reward=as_import_path(spec.reward, "reward"),
            artifacts_root=spec.artifacts_root,
            search_path=spec.search_path,
        )
        if spec != self._pool.spec:
            self._pool.shutdown()
            self._pool.spec = spec
        self._token += 1
        self._pool.start_failures = 0
        return schedule(
            self._pool,
            list(jobs),
            run=self._token,
            workers=self.workers,
            grace=self.grace,
            start_timeout=self.start_timeout,
        )

    def close(self) -> None:
        self._pool.shutdown()
        self._pool.spec = None

    def __enter__(self) -> ProcessRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
