"""The thread runner: one in-process worker and a pool of threads (see :mod:`evolve.runners`)."""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any, Iterator, Sequence

from evolve.errors import UserError
from evolve.runners.base import RolloutJob, Worker, WorkerSpec, failed_trajectory
from evolve.types import Trajectory


class _Slot:
    __slots__ = ("abandoned",)

    def __init__(self) -> None:
        self.abandoned = False


class ThreadRunner:
    """An in-process worker and ``workers`` threads. See :mod:`evolve.runners` for timeouts.

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
