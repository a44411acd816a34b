"""The engine: f(Π, τ, r) → Π′, one generation at a time, on top of a scoring
:class:`~evolve.scoring.session.Session` (splits, runner, memoised rollouts, the budget ledger).

Each generation: select parents from the pool of accepted systems (:mod:`evolve.loop.selectors`,
:mod:`evolve.loop.pool`; selectors that ask get per-task val scores and cost/latency metrics); roll
each parent out on a minibatch of training tasks (the minibatch sampler); let every operator
propose children from those trajectories (``ctx.extra["pool"]`` holds the accepted systems);
judge each child (the acceptance strategy; by default two stages: better than its parent on the
same minibatch, then not worse on validation, re-evaluated on more samples when close:
:mod:`evolve.loop.acceptance`); archive everything; promote the best. Stop on any budget (generations,
rollouts, LLM calls, tokens, money, wall time: :mod:`evolve.scoring.budget`) or the stopping rule. The
three strategies are in :mod:`evolve.loop.strategies`. With ``engine.curriculum`` the generation's training
tasks (the operators' ``ctx.train``) and its minibatch follow the agent's success instead
(:mod:`evolve.loop.curriculum`). At the end the baseline and the promoted system are
scored on the held-out test split and a report is written.

Resume: every rollout is stored under a deterministic key and every operator's proposals
under (generation, operator, parent), so re-running the same plan after a kill -9 reuses all
finished work and redoes only what was in flight. All randomness comes from
``random.Random(f"{seed}/{purpose}")``, so a seeded run with a deterministic model has a
fixed lineage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.errors import BudgetExhausted, InfraError, LLMError, RunFailed
from evolve.loop.operators import OperatorContext
from evolve.loop.pool import OperatorPool, scored_pool
from evolve.loop.strategies import build_strategies
from evolve.registry import operators as operator_registry
from evolve.registry import selectors as selector_registry
from evolve.scoring.session import Observer, Session, job_seed, mean_score  # noqa: F401 - Observer, job_seed: re-exported
from evolve.scoring.state import GenerationRow
from evolve.task.config import TaskConfig
from evolve.types import Candidate, System, Trajectory

if TYPE_CHECKING:
    from evolve.results.report import RunReport


class Engine:
    """The evolution loop of one run: builds the selector and the operators, opens a
    :class:`~evolve.scoring.session.Session` (``self.session``) and runs the generations on it."""

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
    ) -> None:
        # the loop's parts first: a mistake in them must not leave a run directory behind
        self.selector = selector_registry.get(task.engine.selector)(**task.engine.selector_params)
        self.acceptance, self.sampler, self.stopping = build_strategies(task.engine)
        self.operators = [operator_registry.get(op.name)(**op.params) for op in task.operators]
        self.tracking = None
        if task.track:  # each destination must answer before the run directory is written
            from evolve.trackers.live import Tracking

            self.tracking = Tracking(task.track, observer)
        try:
            self.session = Session(
                task,
                base_dir=base_dir,
                run_dir=run_dir,
                resume=resume,
                fresh=fresh,
                observer=observer,
                agent=agent,
                reward=reward,
            )
        except BaseException:
            if self.tracking is not None:
                self.tracking.close(None)
            raise
        self.task, self.archive, self.run_dir = task, self.session.archive, self.session.run_dir
        self.state, self.obs = self.session.state, self.session.obs
        self.curriculum = None  # engine.curriculum: each generation's training tasks follow the agent's success
        if task.engine.curriculum is not None:
            from evolve.loop.curriculum import Curriculum

            try:
                self.curriculum = Curriculum(task.engine.curriculum, self.session.tasks("train"))
            except BaseException:
                self.session.close()
                self.archive.close()
                if self.tracking is not None:
                    self.tracking.close(None)
                raise
        if self.tracking is not None:  # sends from threads of its own: evolve.trackers.live
            from evolve.trackers.base import TrackedRun

            self.tracking.attach(TrackedRun(self.archive, self.run_dir, live=True))

    def run(self) -> RunReport:
        """Bootstrap, evolve, score on test, write the report; returns the report. Raises
        :class:`~evolve.errors.InfraError` when the world kept failing (what finished is kept:
        ``--resume`` continues) and :class:`~evolve.errors.RunFailed` when too many of the
        baseline's or the candidates' rollouts failed (the report is written first)."""
        status, own = "failed", "stopped"  # for the trackers; the run's own (RunState.status)
        try:
            self.state.status = "running"
            report = self._run()
            status = own = "finished"
            return report
        except RunFailed:
            own = "failed"
            raise
        except KeyboardInterrupt:
            status = "killed"
            raise
        finally:
            self.session.close()
            with contextlib.suppress(Exception):  # an unwritable archive: "running" with no writes reads as stopped
                self.state.status = own
            if self.tracking is not None:  # a last send (the report, the promoted system), then the end
                self.tracking.close(status)

    def _run(self) -> RunReport:
        from evolve.results.report import failure_check, write_report

        s = self.session
        stop_reason = "generations done"
        try:
            base = s.baseline()
            val, n = s.evaluate(base, "val")
            problem = failure_check(s, baseline=True)
            if problem:
                with s.outside_budget():
                    write_report(s, f"failed: {problem}", score_test=False)
                raise RunFailed(f"{problem}; the report is in {self.run_dir / 'report.md'}")
            if self.archive.current() is None:
                self.archive.set_current(base.id, "baseline")
            if self.task.deploy is not None:  # the evaluation is pinned when the run starts; a change is refused
                from evolve.deploy.manage import pins_for

                pins_for(self.task, s.base_dir, self.archive, repin=False, by="engine")
            self.state.accept(base.id, val, 0)
            if not self.state.generations():
                used = s.usage()
                self._record_generation(
                    0,
                    {
                        "children": 0,
                        "accepted": 0,
                        "rollouts": used["rollouts"],
                        "calls": used["calls"],
                        "tokens": used["tokens"],
                        "cost": round(used["cost"], 6),
                    },
                )
            for gen in range(len(self.state.generations()), self.task.budget.generations + 1):
                why = self.stopping.stop(self.state.generations())
                if why:
                    stop_reason = why
                    self.obs.message(f"stopping: {why}")
                    break
                self._generation(gen)
        except BudgetExhausted as e:
            stop_reason = str(e)
            self.obs.message(f"stopping: {stop_reason}")
        self.state.elapsed = s.elapsed()
        used_by_run = s.budget_used()  # before the final test scoring, which is outside the budget
        with s.outside_budget():
            problem = failure_check(s, baseline=False)
            report = write_report(s, f"failed: {problem}" if problem else stop_reason, used_by_run=used_by_run)
        if problem:
            raise RunFailed(f"{problem}; the report is in {self.run_dir / 'report.md'}")
        return report

    def _generation(self, gen: int) -> None:
        s = self.session
        s.check_budget()
        counted = dict(s.usage())
        t0 = s.elapsed()
        # the pool as earlier generations left it, so that a resumed generation picks the same parents
        pool = scored_pool(s, before=gen, detail=bool(getattr(self.selector, "needs_per_task", False)))
        parents = self.selector.select(pool, self.task.engine.parents, s.rng(f"select/{gen}"))
        if self.curriculum is not None:  # the levels and mix it decided, from the scores stored so far
            train, minibatch = self.curriculum.step(s, gen, list(parents), self.task.engine.minibatch)
        else:
            train = s.tasks("train")
            minibatch = self.sampler.sample(train, self.task.engine.minibatch, s.rng(f"minibatch/{gen}"), gen)
        best = max(pool, key=lambda s: (s.score, -s.generation))
        n_children = n_accepted = 0
        for pid in parents:
            parent = self.archive.get_system(pid)
            p_traj = s.rollouts(
                parent,
                minibatch,
                split="train",
                tag="eval:train",
                generation=gen,
                description=f"gen {gen}: parent {pid[:8]} on minibatch",
            )
            p_val = next(s.score for s in pool if s.system_id == pid)
            for i, op in enumerate(self.operators):
                for cand in self._propose(gen, i, op, parent, p_traj, train):
                    n_children += 1
                    verdict = self.acceptance.judge(s, gen, cand, minibatch, parent, mean_score(p_traj), p_val)
                    promoted = False
                    if verdict.accepted:
                        promoted, best = self.acceptance.promote(s, gen, cand, verdict, best)
                    event = {
                        "generation": gen,
                        "child": cand.system.id,
                        "parent": pid,
                        "operator": cand.operator,
                        "accepted": verdict.accepted,
                        "why": verdict.why,
                    }
                    if verdict.reeval:
                        event["reeval"] = verdict.reeval
                    self.archive.log_event("decision", event)
                    self.obs.message(f"gen {gen}: {cand.operator} child {cand.system.id[:8]}: {verdict.why}")
                    if verdict.accepted:
                        n_accepted += 1
                        self.state.accept(cand.system.id, verdict.score, gen)
                        if promoted:
                            self._promote(gen, cand, verdict)
        used = s.usage()
        self._record_generation(
            gen,
            {
                "children": n_children,
                "accepted": n_accepted,
                "rollouts": used["rollouts"] - counted["rollouts"],
                "calls": used["calls"] - counted["calls"],
                "tokens": used["tokens"] - counted["tokens"],
                "cost": round(used["cost"] - counted["cost"], 6),
                "seconds": round(s.elapsed() - t0, 2),
            },
        )

    def _promote(self, gen: int, cand: Candidate, verdict: Any) -> None:
        """The best so far: made current, or with a deploy policy proposed for promotion (the gates,
        canary and approval of ``evolve promote`` decide what is served)."""
        self.archive.put_state("best", cand.system.id)
        if self.task.deploy is None:
            self.archive.set_current(cand.system.id, "promote")
            return
        from evolve.deploy.lifecycle import Deployment

        Deployment(self.archive).propose(
            cand.system.id,
            by="engine",
            why=f"generation {gen}: {verdict.why}",
            evidence={
                "generation": gen,
                "operator": cand.operator,
                "val": verdict.score if verdict.score == verdict.score else None,
            },
        )

    def _propose(
        self, gen: int, i: int, op: Any, parent: System, p_traj: list[Trajectory], train: list[dict]
    ) -> list[Candidate]:
        saved = self.state.proposals(gen, i, parent.id)
        if saved is not None:
            return saved
        s = self.session
        workdir = self.run_dir / "work" / f"g{gen}-op{i}-{parent.id[:8]}"
        workdir.mkdir(parents=True, exist_ok=True)
        ctx = OperatorContext(
            generation=gen,
            seed=self.task.seed,
            rng=s.rng(f"op/{gen}/{i}/{parent.id}"),
            train=train,
            trajectories=p_traj,
            artifacts=self.archive.artifacts,
            workdir=workdir,
            rollouts=lambda system, tasks, samples=1, temperature=None, tag="explore", logprobs=True, max_tokens=None: (
                s.rollouts(
                    system,
                    tasks,
                    split="train",
                    tag=f"{tag}:g{gen}:op{i}",
                    generation=gen,
                    samples=samples,
                    temperature=temperature,
                    description=f"gen {gen}: {getattr(op, 'name', i)} {tag}",
                    logprobs=logprobs,
                    max_tokens=max_tokens,
                )
            ),
            log=self.obs.message,
            charge=s.charge,
            may_call=s.check_operator_call,
            extra={
                "pool": OperatorPool(s),
                "known": self.archive.has_system,
                "remote": getattr(s.runner, "trainer", None),
            },  # where training runs (the ray runner's)
        )
        try:
            proposed = op.propose(parent, ctx)
        except LLMError as e:  # the operator's own model (a mutating or reflecting LLM) failed
            if e.category == "request":
                raise
            raise InfraError(f"operator {getattr(op, 'name', i)!r}: its model failed ({e.category}): {e}") from None
        # a child identical to an archived system has been judged already: not a new candidate
        cands = [c for c in proposed if not self.archive.has_system(c.system.id)]
        for c in proposed:
            if c not in cands:
                self.archive.log_event(
                    "rediscovered", {"generation": gen, "system": c.system.id, "operator": c.operator}
                )
        for c in cands:
            self.archive.add_system(
                c.system, parents=c.parents, operator=c.operator, rationale=c.rationale, generation=gen, info=c.info
            )
        self.state.save_proposals(gen, i, parent.id, cands)
        return cands

    def _record_generation(self, gen: int, info: dict[str, Any]) -> None:
        best = max(scored_pool(self.session), key=lambda s: (s.score, -s.generation))
        row = {
            "index": gen,
            "best_val": round(best.score, 4),
            "best": best.system_id,
            "rollouts": 0,
            "tokens": 0,
            "seconds": round(self.session.elapsed(), 2),
            **info,
        }
        self.state.add_generation(GenerationRow(**row))
        self.state.elapsed = self.session.elapsed()
        self.obs.generation(row)
        if self.tracking is not None:
            self.tracking.sync()
