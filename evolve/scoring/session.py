"""The scoring service below the evolution loop: a task's splits, its agent and reward, the runner,
the archive as the memo of every rollout, and the budget ledger.

Everything that scores a system goes through a :class:`Session`: the loop (:mod:`evolve.loop.engine`),
judging and the pool, the report, ``evolve eval``, the Python API, the benchmarks and the example
scripts. Its surface::

    s = Session(task, base_dir=..., run_dir=...)   # loads and checks everything, then opens the run
    s.tasks("val")                                 # a split as the run uses it (val_size/test_size)
    s.rollouts(system, tasks, split=..., tag=...)  # memoised by key; budgeted; the world failing retried
    s.evaluate(system, "val")                      # (mean score, n) of its evaluation rollouts
    s.task_scores(system, "test")                  # {task_id: score}, for paired comparisons
    with s.outside_budget(): ...                   # the final scoring (a report, evolve eval)
    s.usage(), s.elapsed(), s.charge(completion)   # the ledger
    s.baseline()                                   # the starting system Π₀ (built once, archived)
    s.close()

Rollout keys are ``{tag}/{system id}/{task id}/{sample}``; a key already stored is never run again
(so a resumed run redoes only what was in flight), and a rollout the world failed under is never
stored (:mod:`evolve.scoring.retry`). All randomness comes from ``random.Random(f"{seed}/{purpose}")``.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from evolve.errors import BudgetExhausted
from evolve.registry import runners as runner_registry
from evolve.runners import RolloutJob, WorkerSpec
from evolve.scoring.budget import allowed_rollouts, calls_bound, spent
from evolve.scoring.holdout import hold_out_gate
from evolve.scoring.recorder import RolloutRecorder
from evolve.scoring.retry import Retrying, RetryPolicy
from evolve.scoring.rundir import open_run
from evolve.scoring.state import RunState
from evolve.task.config import TaskConfig
from evolve.task.content import record
from evolve.task.data import Splits, load_splits
from evolve.types import LLMCall, System, Trajectory


class Observer:
    """Progress callbacks; the CLI draws them with rich, the Python API stays quiet."""

    def phase(self, description: str, total: int) -> None: ...
    def advance(self, n: int = 1) -> None: ...
    def generation(self, row: dict[str, Any]) -> None: ...
    def message(self, text: str) -> None: ...
    def started(self, run_dir: Path) -> None: ...


def make_runner(cfg: Any) -> Any:
    """The task's runner (``runner.name``, ``workers`` and its ``params``); a parameter the runner
    does not take is the user's mistake, named."""
    import inspect

    from evolve.errors import ConfigError

    cls = runner_registry.get(cfg.name)
    takes: Mapping[str, inspect.Parameter]
    try:
        takes = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        takes = {}
    if takes and not any(p.kind is p.VAR_KEYWORD for p in takes.values()):
        unknown = sorted(set(cfg.params) - set(takes))
        if unknown:
            known = sorted(k for k, p in takes.items() if p.kind is p.KEYWORD_ONLY)
            raise ConfigError(
                f"the {cfg.name} runner takes no parameter {', '.join(map(repr, unknown))}; it takes "
                f"{', '.join(known) or 'none'}",
                path="runner.params",
            )
    return cls(workers=cfg.workers, **cfg.params)


def job_seed(seed: int, key: str) -> int:
    """The seed of the rollout stored under ``key`` in a run seeded ``seed``."""
    return int(hashlib.sha256(f"{seed}/{key}".encode()).hexdigest()[:8], 16)


def mean_score(trajs: Sequence[Trajectory]) -> float:
    return sum(t.score for t in trajs) / len(trajs) if trajs else 0.0


class Session:
    """See the module docstring. ``evaluating``: scoring a finished run (``evolve eval``), whose
    stored task configuration is left as it is; ``resume``/``fresh`` as for ``evolve run``;
    ``budgeted=False``: a session that only scores (an analysis script), outside every budget."""

    def __init__(
        self,
        task: TaskConfig,
        *,
        base_dir: str | Path,
        run_dir: str | Path,
        resume: bool = False,
        fresh: bool = False,
        observer: Any = None,
        agent: str | Callable | None = None,
        reward: str | Callable | None = None,
        evaluating: bool = False,
        budgeted: bool = True,
    ) -> None:
        self.task, self.base_dir, self.run_dir = task, Path(base_dir), Path(run_dir)
        self.obs = observer or Observer()
        # everything a mistake can be found in is loaded before the run directory is touched, so that a
        # failed start leaves nothing in the way of the corrected run
        self.splits: Splits = load_splits(task.dataset, self.base_dir, task.seed)
        self.spec = WorkerSpec(
            agent=agent or task.agent,
            reward=reward or task.reward,
            artifacts_root=str(self.run_dir / "artifacts"),
            search_path=str(self.base_dir),
        )
        self.agent, self.reward = self._resolve_callables()
        self._preflight()
        self.runner = make_runner(task.runner)  # a bad runner setting is refused before anything is written
        try:
            self.archive = open_run(
                self.run_dir, task, self.base_dir, resume=resume, fresh=fresh, evaluating=evaluating, observer=self.obs
            )
            record(self.archive, self.splits)  # each task's content, so runs pair only identical tasks
            hold_out_gate(self)  # a deploy policy's gate split leaves val and train before anything is scored
        except BaseException:
            self.runner.close()
            raise
        self.state = RunState(self.archive)
        f = task.failures
        self.retrying = Retrying(
            self.runner, RetryPolicy(f.retries, f.backoff, f.max_backoff), log=self.obs.message, may_wait=self._may_wait
        )
        self._budgeted = budgeted
        self._seen_failures: set[str] = set()  # failure kinds shown on the console so far
        self._t0 = time.monotonic()
        self._elapsed_before = self.state.elapsed
        self._max_calls: int | None = None  # most LLM calls one stored rollout made (for budget.calls)

    # ------------------------------------------------------------------ setup

    def _preflight(self) -> None:
        """What the run needs before it starts (a key in the environment, a scripted reply that
        imports, the tool library and memory store it names), checked before anything is written."""
        from evolve.llm.params import check_ready
        from evolve.scoring.bootstrap import initial_memory, initial_tools

        for role, m in self.task.models.items():
            check_ready(role, m.backend, m.params, self.base_dir)
        initial_tools(self.task, self.base_dir)
        initial_memory(self.task, self.base_dir)

    def _resolve_callables(self) -> tuple[Callable, Callable]:
        """Import the agent and reward now, so a typo fails before any work is done."""
        from evolve.errors import ConfigError
        from evolve.registry import import_path
        from evolve.rollout import check_reward_signature

        resolved: list[Callable] = []
        for field in ("agent", "reward"):
            value = getattr(self.spec, field)
            fn = import_path(value, what=field, search=self.base_dir) if isinstance(value, str) else value
            if not callable(fn):
                raise ConfigError(f"{value!r} is not callable", path=field)
            if field == "reward":
                try:
                    check_reward_signature(fn)
                except TypeError as e:
                    raise ConfigError(str(e), path="reward") from None
            resolved.append(fn)
        return resolved[0], resolved[1]

    def rng(self, purpose: str) -> random.Random:
        return random.Random(f"{self.task.seed}/{purpose}")

    def close(self) -> None:
        """Save the time spent and stop the runner's workers (the archive stays open for reading)."""
        self.state.elapsed = self.elapsed()
        self.runner.close()

    # ------------------------------------------------------------------ tasks

    def tasks(self, split: str) -> list[dict]:
        """The tasks of ``split`` as the run uses them (``engine.val_size`` / ``test_size`` applied)."""
        tasks = self.splits.get(split, [])
        limit = {"val": self.task.engine.val_size, "test": self.task.engine.test_size}.get(split)
        return list(tasks[:limit]) if limit else list(tasks)

    # ------------------------------------------------------------------ the ledger

    def elapsed(self) -> float:
        """Wall seconds the run has spent, over all its sessions."""
        return self._elapsed_before + time.monotonic() - self._t0

    def usage(self, *, test: bool = False) -> dict[str, Any]:
        """What the run has spent: its rollouts (the archive's totals) plus the model calls that
        operators made themselves (a mutating or reflecting LLM), which count against the budget too.
        Test-split rollouts (the final scoring, outside every budget) only with ``test=True``."""
        u = self.archive.usage(test=test)
        op = self.state.operator_llm()
        for k in ("calls", "tokens", "cost"):
            u[k] = u.get(k, 0) + op.get(k, 0)
        return u

    def charge(self, completion: Any) -> None:
        """Record one model call an operator made itself (see :attr:`OperatorContext.charge`)."""
        tokens = int(getattr(completion, "prompt_tokens", 0) or 0) + int(
            getattr(completion, "completion_tokens", 0) or 0
        )
        self.state.charge_operator_llm(1, tokens, float(getattr(completion, "cost", 0.0) or 0.0))

    def budget_used(self, *, test: bool = False) -> dict[str, Any]:
        return {
            **self.usage(test=test),
            "seconds": round(self.elapsed(), 2),
            "generations": len(self.state.generations()),
        }

    @property
    def budgeted(self) -> bool:
        """False inside :meth:`outside_budget`."""
        return self._budgeted

    @contextlib.contextmanager
    def outside_budget(self) -> Iterator[Session]:
        """Score without the run's budgets (the final scoring of a report, ``evolve eval``): rollouts
        still count in the archive's totals, but no budget stops them."""
        was, self._budgeted = self._budgeted, False
        try:
            yield self
        finally:
            self._budgeted = was

    def check_budget(self, pending: int = 0, system: System | None = None) -> tuple[int, str | None]:
        """Raise :class:`~evolve.errors.BudgetExhausted` when a budget is spent; otherwise how many
        of ``pending`` rollouts may start and the budget that cuts them (see :mod:`evolve.scoring.budget`).
        For a call budget a rollout of ``system`` is taken to make ``budget.calls_per_rollout``
        calls when set, else the most of what its workflow graph can make and what any stored
        rollout made."""
        if not self._budgeted:
            return pending, None
        b = self.task.budget
        per_rollout = 1.0
        if b.calls is not None:
            if self._max_calls is None:
                self._max_calls = self.archive.max_calls()
            bound = calls_bound(system.workflow) if system is not None else None
            per_rollout = b.calls_per_rollout or max(1, self._max_calls, bound or 0)
        return allowed_rollouts(b, self.usage(), self.elapsed(), pending, per_rollout)

    def check_operator_call(self) -> None:
        """Before an operator calls a model itself: raise :class:`BudgetExhausted` when the budget
        has no room for one more call (or another budget is spent)."""
        if not self._budgeted:
            return
        b = self.task.budget
        allowed_rollouts(b.model_copy(update={"rollouts": None}), self.usage(), self.elapsed(), 1, 1.0)

    def _may_wait(self, seconds: float) -> bool:
        """Whether waiting ``seconds`` before retrying the world failing fits the time budget."""
        b = self.task.budget
        return not self._budgeted or b.seconds is None or self.elapsed() + seconds < b.seconds

    # ------------------------------------------------------------------ rollouts

    def rollouts(
        self,
        system: System,
        tasks: Sequence[dict],
        *,
        split: str,
        tag: str,
        generation: int = 0,
        samples: int = 1,
        temperature: float | None = None,
        description: str | None = None,
        logprobs: bool = True,
        max_tokens: int | None = None,
    ) -> list[Trajectory]:
        """Roll ``system`` out on ``tasks`` (``samples`` each), memoised in the archive by key; in
        the order of ``tasks`` (and samples). ``split`` and ``tag`` say what the rollouts are for
        (``tag`` ``eval:*`` is an evaluation; other tags, e.g. ``star:g1:op0``, explore).
        ``logprobs=False``: the caller reads no log-probs, and a model whose engine pays extra for
        them leaves them out of these trajectories. ``max_tokens``: every model call of these rollouts
        generates at most that many tokens (an exploration's cap; :func:`evolve.loop.operators.capped` gives such rollouts a tag of their own)."""
        keys = [(f"{tag}/{system.id}/{t['id']}/{s}", t, s) for t in tasks for s in range(samples)]
        done = self.archive.get_trajectories([k for k, _, _ in keys])
        missing = [(k, t, s) for k, t, s in keys if k not in done]
        phase = "eval" if tag.startswith("eval") else tag.split(":")[0]
        if missing:
            allowed, cut_by = self.check_budget(len(missing), system)
            run_now = missing[:allowed]
            jobs = [
                RolloutJob(
                    key=k,
                    system=system,
                    task=t,
                    seed=job_seed(self.task.seed, k),
                    sample=s,
                    temperature=temperature,
                    timeout=self.task.runner.timeout,
                    logprobs=logprobs,
                    max_tokens=max_tokens,
                )
                for k, t, s in run_now
            ]
            what = description or f"{tag} {system.id[:8]}"
            self.obs.phase(what, len(jobs))
            rec = RolloutRecorder(
                self.archive,
                self.obs,
                split=split,
                phase=phase,
                generation=generation,
                seen=self._seen_failures,
                reward_range=self.task.reward_range,
                on_result=self._count_calls,
            )
            try:
                for job, traj in self.retrying.run(self.spec, jobs, on_failure=rec.world_failed):
                    done[job.key] = traj
                    rec.add(job, traj)
                    self.obs.advance()
            finally:
                rec.flush()  # what finished is kept, whatever stops the batch
            rec.summary(what, len(jobs))
            if len(run_now) < len(missing):
                raise BudgetExhausted(spent(self.task.budget, cut_by or "rollouts", self.usage()))
        return [done[k] for k, _, _ in keys]

    def _count_calls(self, traj: Trajectory) -> None:
        if self._max_calls is not None:
            self._max_calls = max(self._max_calls, sum(isinstance(st, LLMCall) for st in traj.steps))

    def evaluation(self, system: System, split: str, *, generation: int = 0, samples: int = 1) -> list[Trajectory]:
        """``system``'s evaluation rollouts on ``split`` (tag ``eval:SPLIT``; memoised)."""
        return self.rollouts(
            system,
            self.tasks(split),
            split=split,
            tag=f"eval:{split}",
            generation=generation,
            samples=samples,
            description=f"eval {split} {system.id[:8]}" + (f" x{samples}" if samples > 1 else ""),
        )

    def evaluate(self, system: System, split: str, generation: int = 0) -> tuple[float, int]:
        """``(mean score, n)`` of ``system`` on ``split``."""
        trajs = self.evaluation(system, split, generation=generation)
        return mean_score(trajs), len(trajs)

    def task_scores(self, system: System, split: str) -> dict[str, float]:
        """``{task_id: mean score}`` of ``system`` on ``split`` (the memoised evaluation rollouts),
        for paired comparisons of two systems on the same tasks (:func:`evolve.results.stats.paired`)."""
        by: dict[str, list[float]] = {}
        for t in self.evaluation(system, split):
            by.setdefault(str(t.task_id), []).append(t.score)
        return {k: sum(v) / len(v) for k, v in by.items()}

    # ------------------------------------------------------------------ the starting system

    def baseline(self) -> System:
        """The starting system Π₀: built from the task file the first time (a local model is
        cold-started), archived, and read back afterwards."""
        sid = self.state.baseline
        if sid is not None:
            return self.archive.get_system(sid)
        from evolve.scoring.bootstrap import starting_system

        return starting_system(self)

    def initial_tools(self) -> dict[str, Any]:
        """The task file's tool library (``tools: file.json``), checked, as ``System.tools``."""
        from evolve.scoring.bootstrap import initial_tools

        return initial_tools(self.task, self.base_dir)

    def initial_memory(self) -> dict[str, Any]:
        """The task file's ``memory`` with its store folder made absolute (it must exist)."""
        from evolve.scoring.bootstrap import initial_memory

        return initial_memory(self.task, self.base_dir)


__all__ = ["Observer", "Session", "job_seed", "mean_score"]
