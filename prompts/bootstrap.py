"""The ``bootstrap_demos`` operator: few-shot demonstrations bootstrapped from the system's own
successful trajectories, with the selection of demos as the searchable choice (DSPy's
BootstrapFewShot / BootstrapFewShotWithRandomSearch: Khattab et al., 2023, "DSPy: Compiling
Declarative Language Model Calls into Self-Improving Pipelines", arXiv:2310.03714).

Each proposal, for one parent:

1. every trajectory of the parent (``ctx.trajectories``) that ran without error and scored at
   least ``threshold`` gives a demo candidate ``{input, output}``: the user message of its
   first LLM call (of ``call_role``, default the component's step) and that call's output.
   Failed, erroring, call-less, over-long and duplicate ones are rejected with the reason;
2. when fewer candidates than the largest ``k_choices`` are found, up to ``max_rollouts``
   further training tasks (outside the minibatch) are rolled out through ``ctx.rollouts`` and
   their successes added;
3. the parent's current demos join the pool first (they were successes too), so the pool runs
   from oldest to newest;
4. children get a different ``demos`` component each: ``k`` demos (from ``k_choices``) picked by
   a strategy — ``random``, ``recent`` (the newest ``k``) or ``diverse`` (greedy max-min word
   Jaccard distance between inputs). (k, strategy) pairs are tried in ``ctx.rng`` order; a
   selection equal (as a set) to the parent's or to an earlier child's is skipped.

Agents render demos with :func:`evolve.prompts.components.render_demos` (in a system message:
a demo taken from a user message that already holds demos would nest them). Everything is
logged to ``bootstrap_demos.json`` in the work directory.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from evolve.loop.operators import OperatorContext
from evolve.prompts._common import OperatorLog, first_llm_call, first_user
from evolve.prompts.components import get_demos, is_io_demo, parse_name, set_demos
from evolve.types import Candidate, System, Trajectory

Strategy = Literal["random", "recent", "diverse"]


def _words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"\w+", text.lower()))


def jaccard_distance(a: str, b: str) -> float:
    """1 - |A ∩ B| / |A ∪ B| over the lower-cased words of two texts (0 for two empty texts)."""
    wa, wb = _words(a), _words(b)
    union = wa | wb
    return 1.0 - len(wa & wb) / len(union) if union else 0.0


def select(pool: list[dict[str, str]], k: int, strategy: str, rng: Any) -> list[dict[str, str]]:
    """``k`` demos from ``pool`` (oldest first) by ``strategy``; all of them when ``k >= len(pool)``."""
    if k <= 0 or not pool:
        return []
    if k >= len(pool):
        return list(pool)
    if strategy == "recent":
        return list(pool[-k:])
    if strategy == "random":
        return [pool[i] for i in sorted(rng.sample(range(len(pool)), k))]
    if strategy == "diverse":
        chosen = [rng.randrange(len(pool))]
        while len(chosen) < k:
            best, best_d = -1, -1.0
            for i in range(len(pool)):
                if i in chosen:
                    continue
                d = min(jaccard_distance(pool[i]["input"], pool[j]["input"]) for j in chosen)
                if d > best_d:  # ties go to the older demo: deterministic
                    best, best_d = i, d
            chosen.append(best)
        return [pool[i] for i in chosen]
    raise ValueError(f"unknown demo selection strategy {strategy!r}; use random, recent or diverse")


def _key(demos: list[dict[str, Any]]) -> frozenset[str]:
    return frozenset(json.dumps(d, sort_keys=True, ensure_ascii=False) for d in demos)


class DemoBootstrap:
    name = "bootstrap_demos"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        component: str = Field("demos", description="the demos component: '<step>.demos' or 'demos'")
        call_role: str | None = Field(
            None,
            description="role of the LLM call a demo is taken from; default: the "
            "component's step, else the first call of any role",
        )
        threshold: float = Field(1.0, description="a trajectory scoring at least this is a success")
        k_choices: list[int] = Field([0, 2, 4], description="how many demos a child may carry")
        strategies: list[Strategy] = Field(["random", "recent", "diverse"])
        children: int = Field(3, ge=1)
        max_rollouts: int = Field(0, ge=0, description="training tasks rolled out when too few successes")
        temperature: float | None = Field(None, description="sampling temperature of those rollouts")
        keep_parent_demos: bool = Field(True, description="the parent's demos join the pool")
        max_chars: int = Field(2000, ge=1, description="longest demo input or output accepted")

        @field_validator("component")
        @classmethod
        def _demos(cls, v: str) -> str:
            if parse_name(v)[1] != "demos":
                raise ValueError(f"component {v!r} is not a demos component; name it 'demos' or '<step>.demos'")
            return v

        @field_validator("k_choices")
        @classmethod
        def _ks(cls, v: list[int]) -> list[int]:
            if not v or any(k < 0 for k in v):
                raise ValueError("k_choices must be a non-empty list of counts >= 0, e.g. [0, 2, 4]")
            return v

        @field_validator("strategies")
        @classmethod
        def _strategies(cls, v: list[str]) -> list[str]:
            if not v:
                raise ValueError("give at least one strategy: random, recent or diverse")
            return v

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)
        self.step = parse_name(self.p.component)[0]

    def demo_of(self, t: Trajectory) -> tuple[dict[str, str] | None, str]:
        """The demo a trajectory gives, or ``None`` and why it gives none."""
        p = self.p
        if t.error is not None:
            return None, f"the rollout failed: {t.error.splitlines()[0][:200] if t.error else ''}"
        if t.score < p.threshold:
            return None, f"score {t.score:g} below threshold {p.threshold:g}"
        call = first_llm_call(t, p.call_role or self.step) or first_llm_call(t)
        user = first_user(call) if call is not None else None
        if call is None or user is None:
            return None, "no LLM call with a user message"
        if not call.output.strip():
            return None, "the model's output is empty"
        if max(len(user), len(call.output)) > p.max_chars:
            return None, f"input or output over max_chars={p.max_chars}"
        return {"input": user, "output": call.output}, ""

    def _harvest(self, trajs: list[Trajectory], pool: list[dict[str, str]], log: OperatorLog, source: str) -> int:
        inputs = {d["input"] for d in pool}
        added = 0
        for t in trajs:
            demo, why = self.demo_of(t)
            if demo is not None and demo["input"] in inputs:
                demo, why = None, "duplicate input"
            if demo is None:
                log.reject(f"{source} trajectory of task {t.task_id}: {why}", task=t.task_id)
                continue
            inputs.add(demo["input"])
            pool.append(demo)
            added += 1
        return added

    def estimate(self, plan: Any) -> dict[str, int]:
        """Per proposal, at most: ``max_rollouts`` extra training rollouts, no calls of its own."""
        return {"rollouts": min(self.p.max_rollouts, plan.train), "llm_calls": 0, "children": self.p.children}

    def propose(self, parent: System, ctx: OperatorContext) -> list[Candidate]:
        p = self.p
        log = OperatorLog(self.name, parent, ctx)
        try:
            current = get_demos(parent, self.step)
            pool: list[dict[str, str]] = []
            if p.keep_parent_demos:
                pool = [dict(d) for d in current if is_io_demo(d)]
                if len(pool) < len(current):
                    log.note(
                        f"{len(current) - len(pool)} parent demos are not {{input, output}} objects; "
                        "left out of the pool"
                    )
            trajs = list(ctx.trajectories)
            found = self._harvest(trajs, pool, log, "minibatch")
            want = max(p.k_choices)
            rolled = 0
            if len(pool) < want and p.max_rollouts:
                seen_ids = {t.task_id for t in trajs}
                fresh = [t for t in ctx.train if str(t["id"]) not in seen_ids]
                tasks = ctx.rng.sample(fresh, min(p.max_rollouts, len(fresh)))
                if tasks:
                    extra = ctx.rollouts(parent, tasks, temperature=p.temperature, tag="bootstrap", logprobs=False)
                    rolled = len(extra)
                    found += self._harvest(list(extra), pool, log, "extra rollout")
            log.note(
                f"{found} demo candidates from {len(trajs)} minibatch trajectories and {rolled} extra rollouts; "
                f"pool of {len(pool)} (parent carries {len(current)})"
            )
            combos = sorted({(k, s if k else "none") for k in p.k_choices for s in p.strategies})
            ctx.rng.shuffle(combos)
            taken = [_key(current)]
            out: list[Candidate] = []
            for k, strategy in combos:
                if len(out) >= p.children:
                    break
                demos = select(pool, k, strategy, ctx.rng)
                if k and not demos:
                    log.reject(f"k={k} {strategy}: the pool is empty")
                    continue
                if _key(demos) in taken:
                    same = "the parent's demos" if _key(demos) == taken[0] else "an earlier child's demos"
                    log.reject(f"k={k} {strategy}: the selection ({len(demos)} demos) is {same}")
                    continue
                taken.append(_key(demos))
                system = set_demos(parent, demos, self.step)
                rationale = f"{p.component}: {len(demos)} bootstrapped demos ({strategy}) from a pool of {len(pool)}"
                info = {"k": k, "strategy": strategy, "demos": len(demos), "pool": len(pool), "rollouts": rolled}
                log.child(system, rationale, **info)
                out.append(
                    Candidate(system=system, parents=(parent.id,), operator=self.name, rationale=rationale, info=info)
                )
            return out
        finally:
            log.write()
