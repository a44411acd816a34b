"""The thread runner: one in-process worker and a pool of threads (see :mod:`evolve.runners`)."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from evolve.errors import EvolveError, UserError
from evolve.runners.base import RolloutJob, Worker, WorkerSpec, failed_trajectory
from evolve.runners.schedule import Finished, Slot, schedule
from evolve.types import Trajectory


class _Thread(Slot):
    def __init__(self) -> None:
        super().__init__()
        self.ready = True
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()  # its next job; None: end
        self.abandoned = False


class _Threads:
    """The thread runner's pool (:class:`~evolve.runners.schedule.Pool`) for one run: threads of one
    in-process worker. A thread past its deadline cannot be killed: it is abandoned (its result
    dropped) and ends when its agent returns."""

    noun, verb = "thread", "abandoned"
    aftermath = (
        "threads cannot be killed: it goes on in the background and its result is dropped (use the "
        "process runner for agents that hang)"
    )
    reports_start = True

    def __init__(self, worker: Worker, runner: ThreadRunner) -> None:
        self.worker, self._runner = worker, runner
        self.slots: list[_Thread] = []
        self._done: queue.SimpleQueue = queue.SimpleQueue()

    @property
    def replaced(self) -> int:  # the runner's count, over its life
        return self._runner.abandoned

    @replaced.setter
    def replaced(self, n: int) -> None:
        self._runner.abandoned = n

    def _loop(self, slot: _Thread) -> None:
        def on_start() -> None:
            slot.started_at = time.monotonic()

        get, put, execute = slot.inbox.get, self._done.put, self.worker.execute
        while True:
            job = get()
            if job is None:
                return
            try:
                traj = execute(job, on_start)
            except BaseException as e:  # noqa: BLE001 - SystemExit/KeyboardInterrupt inside an agent
                traj = failed_trajectory(job, f"agent raised {type(e).__name__}: {e}")
            if slot.abandoned:
                return
            put((slot, traj))

    def start(self) -> _Thread:
        slot = _Thread()
        threading.Thread(target=self._loop, args=(slot,), name="evolve-rollout", daemon=True).start()
        self.slots.append(slot)
        return slot

    def submit(self, slot: _Thread, job: RolloutJob) -> bool:
        slot.inbox.put(job)
        return True

    def wait(self, timeout: float) -> list[Finished[_Thread]]:
        try:
            got = [self._done.get(timeout=timeout)]
        except queue.Empty:
            return []
        with contextlib.suppress(queue.Empty):
            while True:
                got.append(self._done.get_nowait())
        return [Finished(slot, traj) for slot, traj in got if not slot.abandoned]

    def kill(self, slot: _Thread) -> None:
        slot.abandoned = True
        slot.inbox.put(None)
        if slot in self.slots:
            self.slots.remove(slot)

    def not_ready(self, slot: _Thread) -> EvolveError:  # threads are ready when started
        return EvolveError("a rollout thread did not start")

    def close(self) -> None:
        """End the idle threads (a busy one ends when its job returns; its result is dropped)."""
        for slot in list(self.slots):
            self.kill(slot)


class ThreadRunner:
    """An in-process worker and ``workers`` threads. See :mod:`evolve.runners` for timeouts.

    ``grace``: seconds past a job's ``timeout`` before the watchdog gives up on its thread.
    ``start_timeout``: extra seconds allowed for building the system's LLMs before a rollout
    starts (the rollout's own clock starts once they are built).
    ``workers=1`` runs the jobs on a single helper thread (the watchdog still works).
    """

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
        pool = _Threads(worker, self)  # threads of their own per run: two runs at once do not meet
        try:
            yield from schedule(
                pool, jobs, run=0, workers=self.workers, grace=self.grace, start_timeout=self.start_timeout
            )
        finally:
            pool.close()

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.close()
            self._worker, self._spec = None, None

    def __enter__(self) -> ThreadRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
