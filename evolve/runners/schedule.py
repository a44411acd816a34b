"""The one scheduling loop every runner shares, and the small protocol its workers follow.

A runner supplies a :class:`Pool`: workers that each hold at most one job (a thread, a process, a
Ray actor). :func:`schedule` keeps the pool at strength, hands each ready idle worker the next job,
waits for results until the next deadline, and turns what goes wrong into failed trajectories:

* a job past ``timeout + grace`` (plus ``start_timeout`` while the worker builds the system's
  models, before its rollout's clock starts) gets its worker killed (or abandoned: a thread) and
  replaced; the job is a failed trajectory "timeout: ...";
* a worker that dies while it holds a job fails that job as the world failing (an
  :class:`~evolve.types.InfraFailure` of category ``worker``: the engine's retry runs it again);
* a worker not ready within ``start_timeout`` ends the batch with the pool's own error;
* a job that cannot be sent to a worker is a failed trajectory;
* leaving the iterator early (or an error) kills the workers still busy with its jobs.

Each job comes back exactly once, in completion order.

The lifecycle of a :class:`Slot` (one worker): :meth:`Pool.start` adds it to ``pool.slots``, not
ready; the pool sets ``ready`` once it can take jobs. The loop fills ``job``, ``index``, ``run``
and ``sent_at``, then calls :meth:`Pool.submit`; the pool sets ``started_at`` when the rollout's
clock starts (its models built), when it can tell (``reports_start``). :meth:`Pool.wait` hands back
each finished job (or the death of its worker), and :meth:`Pool.kill` ends a worker. A pool removes
a slot from ``slots`` when the worker is gone (killed, or found dead).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from evolve.errors import EvolveError
from evolve.failures import infra
from evolve.runners.base import RolloutJob, failed_trajectory
from evolve.types import Trajectory

WAKE = 1.0  # the loop looks at its workers at least this often (s)


class Slot:
    """One worker of a pool, holding at most one job. A pool subclasses it with its own handle."""

    def __init__(self) -> None:
        self.born = time.monotonic()
        self.ready = False  # set by the pool: the worker can take a job
        self.job: RolloutJob | None = None
        self.index: int | None = None  # the job's position in its run
        self.run = 0  # the run (one call of the loop) the job belongs to
        self.sent_at = 0.0
        self.started_at: float | None = None  # set by the pool: the rollout's clock started


S = TypeVar("S", bound=Slot)


@dataclass(frozen=True)
class Finished(Generic[S]):
    """What :meth:`Pool.wait` hands back: a slot's job done, or its worker gone (``trajectory``
    None, ``why`` says how: "worker process died (killed by SIGSEGV)")."""

    slot: S
    trajectory: Trajectory | None
    why: str = ""


class Pool(Protocol[S]):
    """The workers a runner gives :func:`schedule` (see the module docstring for the lifecycle)."""

    slots: list[S]  # the live workers
    replaced: int  # workers lost with a job (killed past its deadline, or dead), over the pool's life
    noun: str  # what a worker is, in messages: "worker process"
    verb: str  # what a timeout does to it: "killed"
    aftermath: str  # and then: "the worker process was replaced"
    reports_start: bool  # whether the pool sets started_at (else a job's deadline counts from sent_at)

    def start(self) -> S:
        """Start one more worker; it joins ``slots``, not ready yet."""
        ...

    def submit(self, slot: S, job: RolloutJob) -> bool:
        """Hand ``job`` to the ready, idle ``slot``. False: the worker is going away (the job is
        handed to another); an exception: the job cannot be sent (it fails)."""
        ...

    def wait(self, timeout: float) -> list[Finished[S]]:
        """What finished within ``timeout`` seconds (at once, if something already has). Raises
        when workers cannot start (an import error, a constructor that raises)."""
        ...

    def kill(self, slot: S) -> None:
        """End ``slot``'s worker now and remove it from ``slots``; its result, if any, is dropped."""
        ...

    def not_ready(self, slot: S) -> EvolveError:
        """The error that ends the batch when ``slot`` was not ready within ``start_timeout``
        (the pool shuts its workers down first)."""
        ...


def deadline(slot: Slot, grace: float, start_timeout: float) -> float | None:
    """When the loop gives up on ``slot``: not ready by ``start_timeout``; its job past ``timeout +
    grace`` from its start, or from its sending plus ``start_timeout`` while it has not started."""
    if not slot.ready:
        return slot.born + start_timeout
    if slot.job is None or not slot.job.timeout:
        return None
    limit = slot.job.timeout + grace
    return slot.started_at + limit if slot.started_at is not None else slot.sent_at + start_timeout + limit


def schedule(
    pool: Pool[S], jobs: Sequence[RolloutJob], *, run: int, workers: int, grace: float, start_timeout: float
) -> Iterator[tuple[RolloutJob, Trajectory]]:
    """Run ``jobs`` on ``pool`` with at most ``workers`` workers; yield ``(job, trajectory)`` once
    per job as they complete. ``run`` tells this call's jobs from another's on a shared pool."""
    n = len(jobs)
    if n == 0:
        return
    todo = collections.deque(range(n))
    emitted = [False] * n
    left = n
    out: list[tuple[RolloutJob, Trajectory]] = []

    def emit(idx: int, traj: Trajectory) -> None:
        nonlocal left
        if not emitted[idx]:
            emitted[idx] = True
            left -= 1
            out.append((jobs[idx], traj))

    def free(slot: Slot) -> None:
        slot.job, slot.index, slot.started_at = None, None, None

    try:
        while True:
            # keep the pool full while there is work, and hand idle ready workers a job (before
            # yielding, so that the workers keep going while the caller handles the results)
            busy = sum(s.job is not None for s in pool.slots)
            while len(pool.slots) < min(workers, len(todo) + busy):
                pool.start()
            for slot in list(pool.slots):
                if todo and slot.ready and slot.job is None:
                    idx = todo.popleft()
                    slot.job, slot.index, slot.run = jobs[idx], idx, run
                    slot.sent_at, slot.started_at = time.monotonic(), None
                    try:
                        sent = pool.submit(slot, jobs[idx])
                    except Exception as e:  # noqa: BLE001 - the job cannot be pickled or serialised
                        free(slot)
                        emit(
                            idx,
                            failed_trajectory(
                                jobs[idx], f"runner: cannot send the job to a {pool.noun}: {type(e).__name__}: {e}"
                            ),
                        )
                        continue
                    if not sent:  # the worker is dying: the job waits for another
                        free(slot)
                        todo.appendleft(idx)
            yield from out
            out.clear()
            if not left:
                break

            # wait for a result, a death, or the next deadline
            now = time.monotonic()
            wake = WAKE
            for slot in pool.slots:
                d = deadline(slot, grace, start_timeout)
                if d is not None:
                    wake = min(wake, d - now)
            for f in pool.wait(max(0.0, wake)):
                slot = f.slot
                held = slot.index if slot.run == run else None  # this run's job, if it held one
                if f.trajectory is not None:
                    free(slot)
                    if held is not None:
                        emit(held, f.trajectory)
                elif held is not None:  # its worker is gone (the pool removed it)
                    pool.replaced += 1
                    why = f"{f.why} while running this rollout"
                    emit(
                        held,
                        failed_trajectory(
                            jobs[held],
                            why,
                            time.monotonic() - (slot.started_at or slot.sent_at),
                            infra=infra("worker", why, "runner"),
                        ),
                    )

            # give up on the workers past their deadline
            now = time.monotonic()
            for slot in list(pool.slots):
                d = deadline(slot, grace, start_timeout)
                if d is None or now <= d:
                    continue
                if not slot.ready:
                    raise pool.not_ready(slot)
                held = slot.index if slot.run == run else None
                limit = (slot.job.timeout or 0.0) if slot.job is not None else 0.0
                elapsed = now - (slot.started_at or slot.sent_at)
                phase = " while building the system's models" if pool.reports_start and slot.started_at is None else ""
                pool.kill(slot)
                pool.replaced += 1
                if held is not None:
                    emit(
                        held,
                        failed_trajectory(
                            jobs[held],
                            f"timeout: {pool.verb} after {elapsed:.1f}s{phase} (limit {limit:g}s + {grace:g}s "
                            f"grace); {pool.aftermath}",
                            elapsed,
                        ),
                    )
    finally:
        # abandoned early or failed: the workers still busy with this run's jobs are killed
        for slot in list(pool.slots):
            if slot.job is not None and slot.run == run:
                pool.kill(slot)


__all__ = ["Finished", "Pool", "Slot", "deadline", "schedule"]
