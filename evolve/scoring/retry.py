"""Running rollout jobs so that the world failing under them is retried, never scored.

:class:`Retrying` wraps any :class:`~evolve.runners.Runner`. It yields only trajectories that
are results — the agent's own success or failure — and handles the rest:

* a trajectory whose ``infra`` is retryable (the model unreachable, a timeout of the model, a
  rate limit, a server error, a dead worker process) is held back and its job run again after
  ``backoff`` seconds, doubled on each retry up to ``max_backoff``, at most ``retries`` times;
* before a retry round runs all its jobs, one of them goes first as a probe: while the probe
  still fails, the others wait (a model server that is down costs one request per round, not
  one per job);
* a batch whose results are ``breaker`` world failures in a row (default: as many as the
  runner has workers, at least 4) is cut short: its remaining jobs wait for the next round;
* a failure retrying cannot mend (a bad key, a model that does not exist, a missing package,
  the sandbox unavailable) raises :class:`~evolve.errors.InfraError` at once;
* when the retries are spent, a job whose worker process died on every attempt is the agent's
  own failure (its code kills the worker, while other jobs run) and is yielded as such; any
  other job still failing raises :class:`~evolve.errors.InfraError`, naming the most common
  failure and how many rollouts it held back.

Every world failure is reported to ``on_failure(job, trajectory, attempt)`` as it happens (the
engine logs it in the archive and on the console). Results that were yielded before an
:class:`~evolve.errors.InfraError` are the caller's to keep: nothing finished is lost.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from evolve.errors import InfraError
from evolve.failures import describe_common
from evolve.runners import RolloutJob, WorkerSpec
from evolve.types import Trajectory

Result = tuple[RolloutJob, Trajectory]


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 5
    backoff: float = 2.0
    max_backoff: float = 60.0
    breaker: int | None = None  # world failures in a row that cut a batch short (None: max(4, workers))

    def wait(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        return min(self.backoff * 2 ** (attempt - 1), self.max_backoff)


class Retrying:
    """A runner wrapper that retries the world failing (see the module docstring)."""

    def __init__(
        self,
        runner: Any,
        policy: RetryPolicy = RetryPolicy(),
        *,
        log: Callable[[str], None] | None = None,
        may_wait: Callable[[float], bool] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.runner, self.policy = runner, policy
        self._log = log or (lambda text: None)
        self._may_wait = may_wait or (lambda seconds: True)
        self._sleep = sleep
        workers = int(getattr(runner, "workers", 4) or 4)
        self.breaker = policy.breaker or max(4, workers)

    def run(
        self,
        spec: WorkerSpec,
        jobs: Sequence[RolloutJob],
        on_failure: Callable[[RolloutJob, Trajectory, int], None] | None = None,
    ) -> Iterator[Result]:
        note = on_failure or (lambda job, traj, attempt: None)
        pending = list(jobs)
        last: dict[str, Trajectory] = {}  # job key -> its latest world failure
        attempt = 0
        waited = 0.0
        while pending:
            if attempt:
                if attempt > self.policy.retries:
                    yield from self._give_up(pending, last, waited)
                    return
                wait = self.policy.wait(attempt)
                why = by_category(last[j.key] for j in pending if j.key in last)
                if not self._may_wait(wait):
                    raise InfraError(
                        self._summary(pending, last, waited) + "; the run's time budget ends before the next retry"
                    )
                self._log(
                    f"{len(pending)} rollout{'s' if len(pending) != 1 else ''} held back, the world failing "
                    f"under them ({why}); retry {attempt} of {self.policy.retries} in {wait:g}s"
                )
                self._sleep(wait)
                waited += wait
                if len(pending) > 1:  # a probe first: while it fails, the others wait
                    failed = yield from self._batch(spec, pending[:1], last, attempt, note)
                    if failed:
                        attempt += 1
                        continue
                    pending = pending[1:]
            pending = yield from self._batch(spec, pending, last, attempt, note)
            if pending:
                attempt += 1

    def _batch(
        self,
        spec: WorkerSpec,
        jobs: list[RolloutJob],
        last: dict[str, Trajectory],
        attempt: int,
        note: Callable[[RolloutJob, Trajectory, int], None],
    ) -> Generator[Result, None, list[RolloutJob]]:
        """Run ``jobs`` once; yield the results, return the jobs to run again."""
        finished: set[str] = set()
        failed: list[RolloutJob] = []
        in_a_row = 0
        it = self.runner.run(spec, jobs)
        try:
            for job, traj in it:
                finished.add(job.key)
                f = traj.infra
                if f is None:
                    in_a_row = 0
                    yield job, traj
                    continue
                note(job, traj, attempt)
                last[job.key] = traj
                if not f.retryable:
                    raise InfraError(
                        f"{f.message}; this cannot be mended by retrying ({f.category}): fix it, then continue the run"
                    )
                failed.append(job)
                in_a_row += 1
                if in_a_row >= self.breaker and len(finished) < len(jobs):
                    self._log(
                        f"{in_a_row} rollouts in a row failed by the world ({f.category}); holding the other "
                        f"{len(jobs) - len(finished)} back"
                    )
                    break
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()  # a batch cut short: the runner stops (and kills) what it still runs
        return failed + [j for j in jobs if j.key not in finished]

    def _give_up(self, pending: list[RolloutJob], last: dict[str, Trajectory], waited: float) -> Iterator[Result]:
        """The retries are spent: a worker that died on every attempt is the rollout's own doing;
        anything else stops the run."""
        rest = []
        for job in pending:
            traj = last.get(job.key)
            if traj is not None and traj.infra is not None and traj.infra.category == "worker":
                n = self.policy.retries + 1
                yield job, traj.model_copy(update={"infra": None, "error": f"{traj.error} (on each of {n} attempts)"})
            else:
                rest.append(job)
        if rest:
            raise InfraError(self._summary(rest, last, waited))

    def _summary(self, pending: list[RolloutJob], last: dict[str, Trajectory], waited: float) -> str:
        why = describe_common(t.infra.message for t in last.values() if t.infra is not None)
        n, r = len(pending), self.policy.retries
        return (
            f"the world kept failing: {n} rollout{'s' if n != 1 else ''} could not be run after {r} "
            f"retr{'ies' if r != 1 else 'y'} over {waited:.1f}s; the most common failure: {why}"
        )


def by_category(trajs: Iterator[Trajectory] | Sequence[Trajectory]) -> str:
    """``unreachable x3, rate_limit x1``: the world failures' categories, most common first."""
    counts = Counter(t.infra.category for t in trajs if t.infra is not None)
    return ", ".join(f"{c} x{n}" for c, n in counts.most_common())


__all__ = ["RetryPolicy", "Retrying", "by_category"]
