"""The engine: f(Π, τ, r) → Π′, one generation at a time.

Each generation: select parents from the pool of accepted systems (:mod:`evolve.pool`;
selectors that ask get per-task val scores and cost/latency metrics); roll each parent out on
a minibatch of training tasks; let every operator propose children from those trajectories
(``ctx.extra["pool"]`` holds the accepted systems); accept a child in two stages (better than
its parent on the same minibatch, then not worse on validation, re-evaluated on more samples
when close: :mod:`evolve.judge`); archive everything; promote the best. Stop on any budget
(generations, rollouts, LLM calls, tokens, money, wall time: :mod:`evolve.budget`). At the end
the baseline and the promoted system are scored on the held-out test split and a report is
written.

Resume: every rollout is stored under a deterministic key and every operator's proposals
under (generation, operator, parent), so re-running the same plan after a kill -9 reuses all
finished work and redoes only what was in flight. All randomness comes from
``random.Random(f"{seed}/{purpose}")``, so a seeded run with a deterministic model has a
fixed lineage.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from evolve.budget import allowed_rollouts, spent
from evolve.config import TaskConfig
from evolve.data import Splits, load_splits
from evolve.errors import BudgetExhausted, RunFailed
from evolve.judge import judge, mean_score, promotion
from evolve.operators import OperatorContext
from evolve.pool import OperatorPool, scored_pool
from evolve.recorder import RolloutRecorder
from evolve.registry import operators as operator_registry
from evolve.registry import runners as runner_registry
from evolve.registry import selectors as selector_registry
from evolve.retry import RetryPolicy, Retrying
from evolve.rundir import open_run
from evolve.runners import RolloutJob, WorkerSpec
from evolve.types import Candidate, LLMCall, System, Trajectory


class Observer:
    """Progress callbacks; the CLI draws them with rich, the Python API stays quiet."""

    def phase(self, description: str, total: int) -> None: ...
    def advance(self, n: int = 1) -> None: ...
    def generation(self, row: dict[str, Any]) -> None: ...
    def message(self, text: str) -> None: ...
    def started(self, run_dir: Path) -> None: ...


def job_seed(seed: int, key: str) -> int:
    return int(hashlib.sha256(f"{seed}/{key}".encode()).hexdigest()[:8], 16)


class Engine:
    def __init__(
        self,
        task: TaskConfig,
        *,
        base_dir: Path,
        run_dir: Path,
        resume: bool = False,
        fresh: bool = False,
        observer: Observer | None = None,
        agent: Callable | None = None,
        reward: Callable | None = None,
        evaluating: bool = False,
    ) -> None:
        self.task, self.base_dir, self.run_dir = task, Path(base_dir), Path(run_dir)
        self._evaluating = evaluating  # scoring a finished run (evolve eval): its stored task is left as it is
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
        self.agent_fn, self.reward_fn = self._resolve_callables()
        self._preflight()
        self.selector = selector_registry.get(task.engine.selector)(**task.engine.selector_params)
        self.operators = [operator_registry.get(op.name)(**op.params) for op in task.operators]
        self.archive = open_run(self.run_dir, task, self.base_dir, resume=resume, fresh=fresh,
                                evaluating=evaluating, observer=self.obs)
        self.runner = runner_registry.get(task.runner.name)(workers=task.runner.workers)
        f = task.failures
        self.retrying = Retrying(self.runner, RetryPolicy(f.retries, f.backoff, f.max_backoff), log=self.obs.message,
                                 may_wait=self._may_wait)
        self._seen_failures: set[str] = set()  # failure kinds shown on the console so far
        self._t0 = time.monotonic()
        self.final = False
        self._elapsed_before = float(self.archive.get_state("elapsed", 0.0))
        self._max_calls: int | None = None  # most LLM calls one stored rollout made (for budget.calls)

    # ------------------------------------------------------------------ setup

    def _preflight(self) -> None:
        """What the run needs before it starts (a key in the environment, a scripted reply that
        imports, the tool library and memory store it names), checked before anything is written."""
        from evolve.bootstrap import initial_memory, initial_tools
        from evolve.llm.params import check_ready

        for role, m in self.task.models.items():
            check_ready(role, m.backend, m.params, self.base_dir)
        initial_tools(self.task, self.base_dir)  # the tool library file and the memory store exist
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

    # ------------------------------------------------------------------ budget

    def elapsed(self) -> float:
        return self._elapsed_before + time.monotonic() - self._t0

    def usage(self, *, test: bool = False) -> dict[str, Any]:
        """What the run has spent: its rollouts (the archive's totals) plus the model calls that
        operators made themselves (a mutating or reflecting LLM), which count against the budget too.
        Test-split rollouts (the final scoring, outside every budget) only with ``test=True``."""
        u = self.archive.usage(test=test)
        op = self.archive.get_state("operator_llm") or {}
        for k in ("calls", "tokens", "cost"):
            u[k] = u.get(k, 0) + op.get(k, 0)
        return u

    def charge(self, completion: Any) -> None:
        """Record one model call an operator made itself (see :attr:`OperatorContext.charge`)."""
        op = dict(self.archive.get_state("operator_llm") or {"calls": 0, "tokens": 0, "cost": 0.0})
        op["calls"] += 1
        op["tokens"] += int(getattr(completion, "prompt_tokens", 0) or 0) + int(getattr(completion, "completion_tokens", 0) or 0)
        op["cost"] += float(getattr(completion, "cost", 0.0) or 0.0)
        self.archive.put_state("operator_llm", op)

    def budget_used(self, *, test: bool = False) -> dict[str, Any]:
        u = self.usage(test=test)
        return {**u, "seconds": round(self.elapsed(), 2),
                "generations": len([k for k in self._gen_rows()])}

    def _check_budget(self, pending: int = 0, system: System | None = None) -> tuple[int, str | None]:
        """Raise when a budget is spent; otherwise how many of ``pending`` rollouts may start and
        the budget that cuts them (see :mod:`evolve.budget`). For a call budget a rollout of
        ``system`` is taken to make ``budget.calls_per_rollout`` calls when set, else the most of
        what its workflow graph can make and what any stored rollout made. The final scoring of
        the baseline and the promoted system (the report) is outside the budget."""
        if self.final:
            return pending, None
        b = self.task.budget
        per_rollout = 1.0
        if b.calls is not None:
            if self._max_calls is None:
                self._max_calls = self.archive.max_calls()
            from evolve.topology.runtime import graph_calls_bound

            bound = graph_calls_bound(system.workflow) if system is not None else None
            per_rollout = b.calls_per_rollout or max(1, self._max_calls, bound or 0)
        return allowed_rollouts(b, self.usage(), self.elapsed(), pending, per_rollout)

    def _may_wait(self, seconds: float) -> bool:
        """Whether waiting ``seconds`` before retrying the world failing fits the time budget."""
        b = self.task.budget
        return self.final or b.seconds is None or self.elapsed() + seconds < b.seconds

    def check_operator_call(self) -> None:
        """Before an operator calls a model itself: raise :class:`BudgetExhausted` when the budget
        has no room for one more call (or another budget is spent)."""
        if self.final:
            return
        b = self.task.budget
        used = self.usage()
        allowed_rollouts(b.model_copy(update={"rollouts": None}), used, self.elapsed(), 1, 1.0)

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
    ) -> list[Trajectory]:
        """Roll ``system`` out on ``tasks`` (``samples`` each), memoised in the archive by key."""
        keys = [(f"{tag}/{system.id}/{t['id']}/{s}", t, s) for t in tasks for s in range(samples)]
        done = self.archive.get_trajectories([k for k, _, _ in keys])
        missing = [(k, t, s) for k, t, s in keys if k not in done]
        phase = "eval" if tag.startswith("eval") else tag.split(":")[0]
        if missing:
            allowed, cut_by = self._check_budget(len(missing), system)
            run_now = missing[:allowed]
            jobs = [RolloutJob(key=k, system=system, task=t, seed=job_seed(self.task.seed, k), sample=s,
                               temperature=temperature, timeout=self.task.runner.timeout) for k, t, s in run_now]
            what = description or f"{tag} {system.id[:8]}"
            self.obs.phase(what, len(jobs))
            rec = RolloutRecorder(self.archive, self.obs, split=split, phase=phase, generation=generation,
                                  seen=self._seen_failures, reward_range=self.task.reward_range,
                                  on_result=self._count_calls)
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

    def _eval(self, system: System, split: str, generation: int = 0) -> list[Trajectory]:
        return self.rollouts(system, self._split(split), split=split, tag=f"eval:{split}", generation=generation,
                             description=f"eval {split} {system.id[:8]}")

    def evaluate(self, system: System, split: str, generation: int = 0) -> tuple[float, int]:
        trajs = self._eval(system, split, generation)
        return mean_score(trajs), len(trajs)

    def task_scores(self, system: System, split: str) -> dict[str, float]:
        """``{task_id: mean score}`` of ``system`` on ``split`` (the memoised evaluation rollouts),
        for paired comparisons of two systems on the same tasks (:func:`evolve.stats.paired`)."""
        by: dict[str, list[float]] = {}
        for t in self._eval(system, split):
            by.setdefault(str(t.task_id), []).append(t.score)
        return {k: sum(v) / len(v) for k, v in by.items()}

    def _split(self, split: str) -> list[dict]:
        tasks = self.splits.get(split, [])
        limit = {"val": self.task.engine.val_size, "test": self.task.engine.test_size}.get(split)
        return list(tasks[:limit]) if limit else list(tasks)

    # ------------------------------------------------------------------ bootstrap

    def baseline(self) -> System:
        sid = self.archive.get_state("baseline")
        if sid is not None:
            return self.archive.get_system(sid)
        from evolve.bootstrap import starting_system

        return starting_system(self)

    def initial_tools(self) -> dict[str, Any]:
        """The task file's tool library (``tools: file.json``), checked, as ``System.tools``."""
        from evolve.bootstrap import initial_tools

        return initial_tools(self.task, self.base_dir)

    def initial_memory(self) -> dict[str, Any]:
        """The task file's ``memory`` with its store folder made absolute (it must exist)."""
        from evolve.bootstrap import initial_memory

        return initial_memory(self.task, self.base_dir)

    # ------------------------------------------------------------------ the loop

    def _gen_rows(self) -> list[dict]:
        return self.archive.get_state("generations", [])

    def _accept(self, system_id: str, score: float, generation: int) -> None:
        acc = self.archive.get_state("accepted", [])
        if system_id not in [a["system_id"] for a in acc]:
            acc.append({"system_id": system_id, "score": score, "generation": generation})
            self.archive.put_state("accepted", acc)

    def run(self) -> dict[str, Any]:
        """Bootstrap, evolve, score on test, write the report; returns the report. Raises
        :class:`~evolve.errors.InfraError` when the world kept failing (what finished is kept:
        ``--resume`` continues) and :class:`~evolve.errors.RunFailed` when too many of the
        baseline's or the candidates' rollouts failed (the report is written first)."""
        try:
            return self._run()
        finally:
            self.archive.put_state("elapsed", self.elapsed())
            self.runner.close()

    def _run(self) -> dict[str, Any]:
        from evolve.report import failure_check, write_report

        stop_reason = "generations done"
        try:
            base = self.baseline()
            val, n = self.evaluate(base, "val")
            problem = failure_check(self, baseline=True)
            if problem:
                self.final = True
                write_report(self, f"failed: {problem}", score_test=False)
                raise RunFailed(f"{problem}; the report is in {self.run_dir / 'report.md'}")
            if self.archive.current() is None:
                self.archive.set_current(base.id, "baseline")
            self._accept(base.id, val, 0)
            if not self._gen_rows():
                used = self.usage()
                self._record_generation(0, {"children": 0, "accepted": 0, "rollouts": used["rollouts"],
                                            "calls": used["calls"], "tokens": used["tokens"]})
            for gen in range(len(self._gen_rows()), self.task.budget.generations + 1):
                self._generation(gen)
        except BudgetExhausted as e:
            stop_reason = str(e)
            self.obs.message(f"stopping: {stop_reason}")
        self.archive.put_state("elapsed", self.elapsed())
        self.used_by_run = self.budget_used()  # before the final test scoring, which is outside the budget
        self.final = True
        problem = failure_check(self, baseline=False)
        report = write_report(self, f"failed: {problem}" if problem else stop_reason)
        if problem:
            raise RunFailed(f"{problem}; the report is in {self.run_dir / 'report.md'}")
        return report

    def _generation(self, gen: int) -> None:
        self._check_budget()
        counted = dict(self.usage())
        t0 = self.elapsed()
        # the pool as earlier generations left it, so that a resumed generation picks the same parents
        pool = scored_pool(self, before=gen, detail=bool(getattr(self.selector, "needs_per_task", False)))
        parents = self.selector.select(pool, self.task.engine.parents, self.rng(f"select/{gen}"))
        train = self.splits["train"]
        minibatch = self.rng(f"minibatch/{gen}").sample(train, min(self.task.engine.minibatch, len(train)))
        best = max(pool, key=lambda s: (s.score, -s.generation))
        n_children = n_accepted = 0
        for pid in parents:
            parent = self.archive.get_system(pid)
            p_traj = self.rollouts(parent, minibatch, split="train", tag="eval:train", generation=gen,
                                   description=f"gen {gen}: parent {pid[:8]} on minibatch")
            p_val = next(s.score for s in pool if s.system_id == pid)
            for i, op in enumerate(self.operators):
                for cand in self._propose(gen, i, op, parent, p_traj):
                    n_children += 1
                    verdict = judge(self, gen, cand, minibatch, parent, mean_score(p_traj), p_val)
                    promoted = False
                    if verdict.accepted:
                        promoted, best = promotion(self, gen, cand, verdict, best)
                    event = {"generation": gen, "child": cand.system.id, "parent": pid, "operator": cand.operator,
                             "accepted": verdict.accepted, "why": verdict.why}
                    if verdict.reeval:
                        event["reeval"] = verdict.reeval
                    self.archive.log_event("decision", event)
                    self.obs.message(f"gen {gen}: {cand.operator} child {cand.system.id[:8]}: {verdict.why}")
                    if verdict.accepted:
                        n_accepted += 1
                        self._accept(cand.system.id, verdict.score, gen)
                        if promoted:
                            self.archive.set_current(cand.system.id, "promote")
        used = self.usage()
        self._record_generation(gen, {
            "children": n_children, "accepted": n_accepted, "rollouts": used["rollouts"] - counted["rollouts"],
            "calls": used["calls"] - counted["calls"], "tokens": used["tokens"] - counted["tokens"],
            "seconds": round(self.elapsed() - t0, 2),
        })

    def _propose(self, gen: int, i: int, op: Any, parent: System, p_traj: list[Trajectory]) -> list[Candidate]:
        key = f"proposals/{gen}/{i}/{parent.id}"
        saved = self.archive.get_state(key)
        if saved is not None:
            return [Candidate.model_validate(c) for c in saved]
        workdir = self.run_dir / "work" / f"g{gen}-op{i}-{parent.id[:8]}"
        workdir.mkdir(parents=True, exist_ok=True)
        ctx = OperatorContext(
            generation=gen, seed=self.task.seed, rng=self.rng(f"op/{gen}/{i}/{parent.id}"),
            train=self.splits["train"], trajectories=p_traj, artifacts=self.archive.artifacts, workdir=workdir,
            rollouts=lambda system, tasks, samples=1, temperature=None, tag="explore": self.rollouts(
                system, tasks, split="train", tag=f"{tag}:g{gen}:op{i}", generation=gen, samples=samples,
                temperature=temperature, description=f"gen {gen}: {getattr(op, 'name', i)} {tag}"),
            log=self.obs.message, charge=self.charge, may_call=self.check_operator_call,
            extra={"pool": OperatorPool(self), "known": self.archive.has_system},
        )
        proposed = op.propose(parent, ctx)
        # a child identical to an archived system has been judged already: not a new candidate
        cands = [c for c in proposed if not self.archive.has_system(c.system.id)]
        for c in proposed:
            if c not in cands:
                self.archive.log_event("rediscovered", {"generation": gen, "system": c.system.id, "operator": c.operator})
        for c in cands:
            self.archive.add_system(c.system, parents=c.parents, operator=c.operator, rationale=c.rationale,
                                    generation=gen, info=c.info)
        self.archive.put_state(key, [c.model_dump(mode="json") for c in cands])
        return cands

    def _record_generation(self, gen: int, info: dict[str, Any]) -> None:
        best = max(scored_pool(self), key=lambda s: (s.score, -s.generation))
        row = {"index": gen, "best_val": round(best.score, 4), "best": best.system_id,
               "rollouts": 0, "tokens": 0, "seconds": round(self.elapsed(), 2), **info}
        rows = self._gen_rows()
        rows.append(row)
        self.archive.put_state("generations", rows)
        self.archive.put_state("elapsed", self.elapsed())
        self.obs.generation(row)
