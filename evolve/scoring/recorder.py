"""Writing a batch of rollouts down as it runs: results to the archive (in batches, so a kill -9
loses at most the last half second), the world failing under a rollout to the archive's events
(``world_failure``: never a score), and failures to the console as they happen (the first of each
kind, and a count per batch)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from evolve.failures import describe_common, failure_of, signature
from evolve.scoring.retry import by_category
from evolve.types import LLMCall, Trajectory

if TYPE_CHECKING:
    from evolve.runners import RolloutJob

MAX_KINDS_SHOWN = 10  # distinct failure kinds a run announces on the console (then it only counts)


class RolloutRecorder:
    """Buffers one :meth:`Session.rollouts` call's results and world failures; :meth:`flush`
    writes them in one transaction (also called every 256 results or half second)."""

    def __init__(
        self,
        archive: Any,
        observer: Any,
        *,
        split: str,
        phase: str,
        generation: int,
        seen: set[str],
        reward_range: tuple[float, float],
        on_result: Any = None,
    ) -> None:
        self.archive, self.obs = archive, observer
        self.split, self.phase, self.generation = split, phase, generation
        self._seen = seen  # failure kinds announced so far in this run (shared across batches)
        self._range = reward_range
        self._on_result = on_result
        self._rows: list[tuple[str, str, str, int, Trajectory]] = []
        self._events: list[dict[str, Any]] = []
        self._last = time.monotonic()
        self.failed: list[str] = []  # messages of this batch's failed results
        self.world: list[Trajectory] = []  # this batch's world failures (retried)
        self.out_of_range = 0

    def add(self, job: RolloutJob, traj: Trajectory) -> None:
        self._rows.append((job.key, self.split, self.phase, self.generation, traj))
        if self._on_result is not None:
            self._on_result(traj)
        msg = failure_of(traj)
        if msg is not None:
            self.failed.append(msg)
            self._announce(msg, traj.task_id, "failed")
        elif traj.reward is not None and not self._range[0] <= traj.reward.score <= self._range[1]:
            if not self.out_of_range and "out of range" not in self._seen:
                self._seen.add("out of range")
                self.obs.message(
                    f"warning: task {traj.task_id} scored {traj.reward.score:g}, outside the reward range "
                    f"[{self._range[0]:g}, {self._range[1]:g}] (set reward_range in the task file if "
                    "that is intended); the report counts such scores"
                )
            self.out_of_range += 1
        if len(self._rows) >= 256 or time.monotonic() - self._last > 0.5:
            self.flush()

    def world_failed(self, job: RolloutJob, traj: Trajectory, attempt: int) -> None:
        f = traj.infra
        assert f is not None
        self.world.append(traj)
        self._events.append(
            {
                "key": job.key,
                "split": self.split,
                "phase": self.phase,
                "generation": self.generation,
                "system": job.system.id,
                "task": traj.task_id,
                "attempt": attempt,
                "category": f.category,
                "retryable": f.retryable,
                "source": f.source,
                "message": f.message,
                "tokens": traj.tokens,
                "cost": traj.cost,
                "calls": sum(isinstance(s, LLMCall) for s in traj.steps),
            }
        )
        self._announce(f.message, traj.task_id, f"not scored: the world failed ({f.category})")
        if len(self._events) >= 256:
            self.flush()

    def _announce(self, message: str, task_id: str, what: str) -> None:
        kind = signature(message)
        if kind in self._seen or len(self._seen) > MAX_KINDS_SHOWN:
            return
        self._seen.add(kind)
        first = message.strip().splitlines()[0] if message.strip() else "(no message)"
        self.obs.message(
            f"{what} on task {task_id}: {first[:300]}"
            + (" (the first of its kind; the others are counted)" if what == "failed" else "")
        )

    def flush(self) -> None:
        if not self._rows and not self._events:
            return
        if not self._events:  # the common case: one write, as add_trajectories makes it
            self.archive.add_trajectories(self._rows)
        else:
            with self.archive.transaction():
                if self._rows:
                    self.archive.add_trajectories(self._rows)
                for e in self._events:
                    self.archive.log_event("world_failure", e)
        self._rows, self._events, self._last = [], [], time.monotonic()

    def summary(self, description: str, total: int) -> None:
        """One console line when this batch had failures of any kind."""
        parts = []
        if self.failed:
            parts.append(f"{len(self.failed)} of {total} rollouts failed ({describe_common(self.failed)})")
        if self.world:
            parts.append(
                f"{len(self.world)} world failure{'s' if len(self.world) != 1 else ''} retried "
                f"({by_category(self.world)})"
            )
        if parts:
            self.obs.message(f"{description}: " + "; ".join(parts))


__all__ = ["RolloutRecorder"]
