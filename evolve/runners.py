"""Runners execute rollout jobs and hand back scored trajectories as they complete.

A :class:`RolloutJob` is pure, picklable data (a system, a task, a seed, ...). A
:class:`WorkerSpec` says how a worker builds its environment (the agent, the reward, the
artifact store). A :class:`Worker` builds the agent, the reward and the system's LLMs once
(LLMs are cached per model spec: local backends load weights) and turns one job into one
scored :class:`~evolve.types.Trajectory` (:func:`evolve.rollout.run_agent` then
:func:`evolve.rollout.score`). A runner feeds jobs to workers:

* :class:`ThreadRunner` — one in-process worker and a pool of threads. Fast (thousands of
  trivial rollouts per second) and the default. A rollout's ``timeout`` is enforced
  cooperatively by :func:`~evolve.rollout.run_agent` (every LLM and tool call checks the
  deadline); on top of that a watchdog records a job as failed ("timeout: …") when it has
  not returned ``timeout + grace`` seconds after it started, and goes on with the run.
  **Python threads cannot be killed**: the stuck thread is abandoned — it keeps running (and
  holding whatever it holds) in the background until its agent returns, and its result is
  dropped. Use :class:`ProcessRunner` for agents that may hang in code that does not check
  the deadline (``time.sleep``, a blocking socket, a C extension) or that are not trusted.
* :class:`ProcessRunner` — worker processes (``forkserver``, else ``spawn``), each in its
  own session/process group, each building its own worker from the spec (so the agent and
  the reward must be import paths). A job past ``timeout + grace`` gets its worker's whole
  process group SIGKILLed (the agent's subprocesses too) and a fresh worker started; a
  worker that dies (segfault, ``os._exit``) fails its in-flight job with the exit code and is
  replaced. Each worker has its own duplex pipe (rather than one shared queue) and holds one
  job at a time, so the runner always knows which job a dead or killed worker held. Jobs are
  pickled on the way in; only JSON (the trajectory) crosses back.

Both yield exactly one ``(job, trajectory)`` per job, in completion order. An agent that
raises gives a failed trajectory (``error`` set, score 0); a reward that raises gives
``reward.error``. Abandoning the iterator early cancels the jobs not started yet (the
process runner kills the workers still busy).

A Ray runner needs no engine change: it implements the same :class:`Runner` protocol with
an actor pool of :class:`Worker`\ s. ``Actor = ray.remote(num_gpus=…)(Worker)``; ``n`` actors
are built from the same ``WorkerSpec`` (import paths, so any node can build one; the
``artifacts_root`` on shared storage or synced to the nodes); ``run()`` keeps one
``actor.execute.remote(job)`` in flight per actor in a ``ref -> (job, actor, started)`` map,
and ``ray.wait(refs, num_returns=1, timeout=…)`` yields ``(job, trajectory)`` as they
complete. A job past ``timeout + grace`` → ``ray.kill(actor)``, a fresh actor, a failed
trajectory; a ``RayActorError`` (the actor died) → a failed trajectory and a fresh actor.
``close()`` calls ``actor.close.remote()`` (LLMs release their GPUs) and then kills the actors.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import wait as mp_wait
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence, runtime_checkable

from evolve.artifacts import ArtifactStore
from evolve.errors import EvolveError, UserError
from evolve.rollout import check_reward_signature, run_agent, score
from evolve.types import ModelSpec, System, Trajectory, canonical_json

# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class RolloutJob:
    """One rollout to run: pure data, picklable."""

    key: str  # unique key of this rollout in the archive
    system: System
    task: dict
    seed: int = 0
    sample: int = 0
    temperature: float | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class WorkerSpec:
    """How a worker builds its environment; picklable when agent and reward are import paths."""

    agent: str | Callable  # "pkg.mod:fn" or a callable (the thread runner accepts callables)
    reward: str | Callable
    artifacts_root: str  # the run's artifact store folder (LLM backends load weights from it)
    search_path: str | None = None  # folder put on sys.path for import paths (the task file's folder)


@runtime_checkable
class Runner(Protocol):
    def run(self, spec: WorkerSpec, jobs: Sequence[RolloutJob]) -> Iterator[tuple[RolloutJob, Trajectory]]:
        """Yield one scored trajectory per job, as they complete (any order)."""
        ...

    def close(self) -> None: ...


# ----------------------------------------------------------------------------- worker


def _never_called(task: Any, output: Any) -> float:  # the reward of a failed rollout is not computed
    return 0.0


def failed_trajectory(job: RolloutJob, error: str, duration: float = 0.0) -> Trajectory:
    """A scored failed trajectory for ``job`` (score 0, ``error`` set) built outside the agent."""
    task_id = job.task.get("id", job.key) if isinstance(job.task, dict) else job.key
    t = Trajectory(task_id=str(task_id), system_id=job.system.id, error=error, duration=duration,
                   sample=job.sample, temperature=job.temperature)
    return score(_never_called, job.task if isinstance(job.task, dict) else {}, t)


@contextlib.contextmanager
def _on_sys_path(folder: str | None) -> Iterator[None]:
    if not folder or folder in sys.path:
        yield
        return
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


class Worker:
    """Builds the agent, the reward and the LLMs once; ``execute(job)`` runs and scores one rollout.

    Thread-safe: the thread runner calls ``execute`` from many threads at once. LLMs are built
    on first use through :data:`evolve.registry.llm_backends` and cached per model spec (its
    canonical JSON); :meth:`close` closes them.
    """

    def __init__(self, spec: WorkerSpec, *, own_process: bool = False) -> None:
        from evolve.registry import import_path

        self.spec = spec
        self._own_process = own_process
        search = Path(spec.search_path) if spec.search_path else None
        if own_process and spec.search_path and spec.search_path not in sys.path:
            sys.path.insert(0, spec.search_path)
        self.agent = import_path(spec.agent, what="agent", search=search) if isinstance(spec.agent, str) else spec.agent
        self.reward = (import_path(spec.reward, what="reward", search=search)
                       if isinstance(spec.reward, str) else spec.reward)
        if not callable(self.agent):
            raise UserError(f"the agent {spec.agent!r} is not callable; an agent is a function agent(task, ctx)")
        try:
            check_reward_signature(self.reward)
        except TypeError as e:
            raise UserError(str(e)) from None
        self.artifacts = ArtifactStore(spec.artifacts_root)
        self._llms: dict[str, Any] = {}
        self._by_id: dict[int, tuple[ModelSpec, Any]] = {}
        self._build_lock = threading.Lock()
        self.closed = False

    # ------------------------------------------------------------------ LLMs

    def llm(self, system: System, role: str) -> Any:
        """The LLM for ``role`` of ``system``, built once per distinct model spec."""
        spec = system.models.get(role)
        if spec is None:
            raise KeyError(f"the system has no model role {role!r}; it has {sorted(system.models)}")
        hit = self._by_id.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        key = canonical_json(spec.model_dump(mode="json"))
        llm = self._llms.get(key)
        if llm is None:
            with self._build_lock:
                llm = self._llms.get(key)
                if llm is None:
                    from evolve.registry import llm_backends

                    factory = llm_backends.get(spec.backend)
                    with (contextlib.nullcontext() if self._own_process else _on_sys_path(self.spec.search_path)):
                        llm = factory(spec, self.artifacts)
                    self._llms[key] = llm
        if len(self._by_id) > 4096:
            self._by_id.clear()
        self._by_id[id(spec)] = (spec, llm)  # keeps spec alive, so its id is not reused
        return llm

    def _preload(self, system: System) -> None:
        """Build the system's LLMs before the rollout's clock starts (a failure is left for the
        agent to meet, and record, when it calls that model)."""
        for role in system.models:
            try:
                self.llm(system, role)
            except Exception:  # noqa: BLE001
                pass

    # ------------------------------------------------------------------ rollouts

    def execute(self, job: RolloutJob, on_start: Callable[[], None] | None = None) -> Trajectory:
        """Run and score one job; never raises for the agent's, the reward's or a backend's failure.
        ``on_start`` is called when the LLMs are built and the rollout itself starts."""
        t0 = time.monotonic()
        try:
            self._preload(job.system)
            if on_start is not None:
                on_start()
            traj = run_agent(self.agent, job.system, job.task, self.llm, seed=job.seed, sample=job.sample,
                             temperature=job.temperature, timeout=job.timeout)
            return score(self.reward, job.task, traj)
        except Exception as e:  # noqa: BLE001 - e.g. a task without "id"
            return failed_trajectory(job, f"runner: {type(e).__name__}: {e}", time.monotonic() - t0)

    def close(self) -> None:
        """Close every LLM built (errors are ignored: closing must not fail a run)."""
        self.closed = True
        with self._build_lock:
            llms, self._llms = list(self._llms.values()), {}
            self._by_id.clear()
        for llm in llms:
            with contextlib.suppress(Exception):
                llm.close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ----------------------------------------------------------------------------- thread runner


class _Slot:
    __slots__ = ("abandoned",)

    def __init__(self) -> None:
        self.abandoned = False


class ThreadRunner:
    """An in-process worker and ``workers`` threads. See the module docstring for timeouts.

    ``grace``: seconds past a job's ``timeout`` before the watchdog gives up on its thread.
    ``start_timeout``: extra seconds allowed for building the system's LLMs before a rollout
    starts (the rollout's own clock starts once they are built).
    ``workers=1`` runs the jobs on a single helper thread (the watchdog still works).
    """

    _POLL = 0.05  # watchdog scan period (s)

    def __init__(self, workers: int = 32, *, grace: float = 5.0, start_timeout: float = 120.0) -> None:
        if workers < 1:
            raise UserError(f"a runner needs at least one worker; got workers={workers}")
        self.workers = int(workers)
        self.grace = float(grace)
        self.start_timeout = float(start_timeout)
        self.abandoned = 0  # threads given up on by the watchdog, over the runner's life
        self._worker: Worker | None = None
        self._spec: WorkerSpec | None = None
        self._lock = threading.Lock()

    @property
    def worker(self) -> Worker | None:
        return self._worker

    def _get_worker(self, spec: WorkerSpec) -> Worker:
        with self._lock:
            if self._worker is None or self._spec != spec:
                if self._worker is not None:
                    self._worker.close()
                self._worker, self._spec = None, None
                self._worker = Worker(spec)
                self._spec = spec
            return self._worker

    def run(self, spec: WorkerSpec, jobs: Sequence[RolloutJob]) -> Iterator[tuple[RolloutJob, Trajectory]]:
        """Build (or reuse) the worker now — import errors raise here — and return the iterator."""
        worker = self._get_worker(spec)
        return self._iter(worker, list(jobs))

    def _iter(self, worker: Worker, jobs: list[RolloutJob]) -> Iterator[tuple[RolloutJob, Trajectory]]:
        n = len(jobs)
        if n == 0:
            return
        todo = collections.deque(range(n))
        results: queue.SimpleQueue = queue.SimpleQueue()
        running: dict[int, float] = {}  # job index -> time its rollout started (only jobs with a timeout)
        slots: dict[int, _Slot] = {}  # job index -> the thread running it
        cancelled = threading.Event()

        def loop(slot: _Slot) -> None:
            pop, put = todo.popleft, results.put
            while not slot.abandoned and not cancelled.is_set():
                try:
                    idx = pop()
                except IndexError:
                    return
                job = jobs[idx]
                try:
                    if job.timeout:
                        slots[idx] = slot
                        # building the LLMs (before on_start) may take start_timeout more
                        running[idx] = time.monotonic() + self.start_timeout

                        def on_start(idx: int = idx) -> None:
                            running[idx] = time.monotonic()

                        try:
                            traj = worker.execute(job, on_start)
                        finally:
                            running.pop(idx, None)
                            slots.pop(idx, None)
                    else:
                        traj = worker.execute(job)
                except BaseException as e:  # noqa: BLE001 - SystemExit/KeyboardInterrupt inside an agent
                    traj = failed_trajectory(job, f"agent raised {type(e).__name__}: {e}")
                put((idx, traj))

        def spawn() -> None:
            threading.Thread(target=loop, args=(_Slot(),), name="evolve-rollout", daemon=True).start()

        emitted = [False] * n
        left = n
        for _ in range(min(self.workers, n)):
            spawn()
        any_timeout = any(j.timeout for j in jobs)
        next_scan = time.monotonic() + self._POLL
        try:
            while left:
                try:
                    idx, traj = results.get(timeout=self._POLL) if any_timeout else results.get()
                except queue.Empty:
                    idx = None
                if idx is not None and not emitted[idx]:
                    emitted[idx] = True
                    left -= 1
                    yield jobs[idx], traj
                if any_timeout and time.monotonic() >= next_scan:
                    now = time.monotonic()
                    next_scan = now + self._POLL
                    for i, started in running.copy().items():
                        limit = jobs[i].timeout or 0.0
                        if emitted[i] or now - started <= limit + self.grace:
                            continue
                        slot = slots.get(i)
                        if slot is not None:  # else the job returned just now; its result is dropped
                            slot.abandoned = True
                            self.abandoned += 1
                            spawn()  # keep the pool at full strength
                        emitted[i] = True
                        left -= 1
                        yield jobs[i], failed_trajectory(
                            jobs[i],
                            f"timeout: the rollout did not return {now - started:.1f}s after it started "
                            f"(limit {limit:g}s + {self.grace:g}s grace); its thread was abandoned "
                            "(threads cannot be killed; use the process runner for agents that hang)",
                            max(0.0, now - started),
                        )
        finally:
            cancelled.set()

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.close()
            self._worker, self._spec = None, None

    def __enter__(self) -> "ThreadRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ----------------------------------------------------------------------------- process runner


def _as_import_path(obj: str | Callable, what: str) -> str:
    """An import path for ``obj`` (kept when it is one; derived for a module-level function)."""
    if isinstance(obj, str):
        return obj
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if mod and qual and mod != "__main__" and "<" not in qual:
        from evolve.registry import import_path

        path = f"{mod}:{qual}"
        with contextlib.suppress(Exception):
            if import_path(path, what=what) is obj:
                return path
    raise UserError(
        f"the process runner needs the {what} as an import path ('package.module:function') so that each "
        f"worker process can import it; {obj!r} cannot be imported by path (a lambda, a nested function, or "
        "defined in __main__). Move it into a module, or use the thread runner."
    )


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
    """``workers`` worker processes fed through pipes; see the module docstring.

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
        spec = WorkerSpec(agent=_as_import_path(spec.agent, "agent"), reward=_as_import_path(spec.reward, "reward"),
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
                            emit(w.job, failed_trajectory(
                                jobs[w.job], f"worker process died ({_exit_text(code)}) while running this rollout",
                                time.monotonic() - (w.started_at or w.sent_at)))
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


__all__ = [
    "ProcessRunner",
    "RolloutJob",
    "Runner",
    "ThreadRunner",
    "Worker",
    "WorkerSpec",
    "failed_trajectory",
]
