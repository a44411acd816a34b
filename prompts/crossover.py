"""The ``prompt_crossover`` operator: merge two lineages' prompts component by component (GEPA's
merge: Agrawal et al., 2025, "GEPA: Reflective Prompt Evolution Can Outperform Reinforcement
Learning", arXiv:2507.19457, §3.4; and PromptBreeder's Lamarckian crossover).

Each proposal, for one parent:

1. the mate comes from ``ctx.extra["pool"]``: a list of ``{"system": System, "score": float,
   "per_task": {task_id: score} | None}`` of accepted systems, supplied by the engine. The mate
   is the highest-scoring system whose prompts (restricted to ``components`` when given) differ
   from the parent's — another lineage, not a copy (ties broken by ``ctx.rng``);
2. for every component that differs: when only one of the two has it, it is that lineage's
   addition and is taken; when both have it, the text comes from the parent that scored better
   on the tasks where their per-task scores differ (both ``per_task`` known), else from a
   ``ctx.rng`` coin flip (and on a tie);
3. further children (``children`` > 1), and the first one when the rule reproduces a parent,
   flip one component's choice at a time, in ``ctx.rng`` order;
4. only children whose prompts differ from both parents (and from each other) are proposed.

Everything except ``prompts`` (models, memory, tools, workflow) is the parent's. Without a pool
(or without a mate), nothing is proposed and the reason is logged in
``prompt_crossover.json`` in the work directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from evolve.loop.operators import OperatorContext
from evolve.prompts._common import OperatorLog
from evolve.prompts.components import parse_name
from evolve.types import Candidate, System


@dataclass(frozen=True)
class Entry:
    system: System
    score: float
    per_task: Mapping[str, float] | None


def as_entry(raw: Any) -> Entry:
    """A pool entry from the engine's dict (``system`` may also be its JSON dict)."""
    if not isinstance(raw, Mapping) or "system" not in raw:
        raise ValueError("a pool entry is a dict {'system': System, 'score': float, 'per_task': dict | None}")
    system = raw["system"]
    if not isinstance(system, System):
        system = System.model_validate(system)
    per_task = raw.get("per_task")
    per_task = {str(k): float(v) for k, v in per_task.items()} if per_task else None
    return Entry(system=system, score=float(raw.get("score", 0.0)), per_task=per_task)


def better_on_differing(a: Mapping[str, float] | None, b: Mapping[str, float] | None) -> tuple[int, list[str]]:
    """``1`` when ``a`` scored more than ``b`` on the tasks where their scores differ, ``-1`` when
    less, ``0`` on a tie or when either is unknown; and those tasks."""
    if not a or not b:
        return 0, []
    tasks = sorted(t for t in set(a) & set(b) if a[t] != b[t])
    sa, sb = sum(a[t] for t in tasks), sum(b[t] for t in tasks)
    return (1 if sa > sb else -1 if sb > sa else 0), tasks


class Crossover:
    name = "prompt_crossover"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        children: int = Field(1, ge=1)
        components: list[str] | None = Field(
            None, description="component names merged (default: all); the others stay the parent's"
        )

        @field_validator("components")
        @classmethod
        def _names(cls, v: list[str] | None) -> list[str] | None:
            for name in v or []:
                parse_name(name)
            return v

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)

    def _mergeable(self, prompts: Mapping[str, str]) -> dict[str, str]:
        allowed = self.p.components
        return {k: v for k, v in prompts.items() if allowed is None or k in allowed}

    def estimate(self, plan: Any) -> dict[str, int]:
        """Per proposal, at most: no rollouts or calls of its own."""
        return {"rollouts": 0, "llm_calls": 0, "children": self.p.children}

    def propose(self, parent: System, ctx: OperatorContext) -> list[Candidate]:
        log = OperatorLog(self.name, parent, ctx)
        try:
            return self._propose(parent, ctx, log)
        finally:
            log.write()

    def _propose(self, parent: System, ctx: OperatorContext, log: OperatorLog) -> list[Candidate]:
        raw_pool = (ctx.extra or {}).get("pool")
        if not raw_pool:
            log.note(
                "no pool of accepted systems in ctx.extra['pool']; crossover needs a second lineage, nothing proposed"
            )
            return []
        entries = []
        for i, raw in enumerate(raw_pool):
            try:
                entries.append(as_entry(raw))
            except Exception as e:  # noqa: BLE001 - a malformed entry is skipped, and said so
                log.reject(f"pool entry {i} skipped: {type(e).__name__}: {e}")
        mine = next((e for e in entries if e.system.id == parent.id), None)
        pa = self._mergeable(parent.prompts)
        mates = [e for e in entries if e.system.id != parent.id and self._mergeable(e.system.prompts) != pa]
        if not mates:
            log.note(
                f"none of the {len(entries)} pool systems has prompts that differ from the parent's; nothing proposed"
            )
            return []
        top = max(e.score for e in mates)
        mate = ctx.rng.choice(sorted((e for e in mates if e.score == top), key=lambda e: e.system.id))
        pb = self._mergeable(mate.system.prompts)
        differing = sorted(n for n in set(pa) | set(pb) if pa.get(n) != pb.get(n))
        verdict, tasks = better_on_differing(mine.per_task if mine else None, mate.per_task)
        if verdict:
            basis = (
                f"per-task scores: the {'parent' if verdict > 0 else 'mate'} scored better on the "
                f"{len(tasks)} tasks where they differ"
            )
        else:
            known = bool(mine and mine.per_task and mate.per_task)
            basis = "coin flips: " + (
                "they tie on the tasks where they differ" if known else "per-task scores are not known for both"
            )
        choice: dict[str, str] = {}
        for name in differing:
            if (name in pa) != (name in pb):
                choice[name] = "parent" if name in pa else "mate"  # one lineage's addition
            elif verdict:
                choice[name] = "parent" if verdict > 0 else "mate"
            else:
                choice[name] = "parent" if ctx.rng.random() < 0.5 else "mate"
        log.note(
            f"mate {mate.system.id[:8]} (score {mate.score:g}); {len(differing)} components differ; {basis}",
            mate=mate.system.id,
            differing=differing,
            choice=dict(choice),
            tasks=tasks[:50],
        )
        flips = list(differing)
        ctx.rng.shuffle(flips)
        plans = [dict(choice)] + [{**choice, n: "mate" if choice[n] == "parent" else "parent"} for n in flips]
        seen = [dict(parent.prompts), dict(mate.system.prompts)]
        out: list[Candidate] = []
        for k, plan in enumerate(plans):
            if len(out) >= self.p.children:
                break
            prompts = dict(parent.prompts)
            for name, side in plan.items():
                source = pa if side == "parent" else pb
                if name in source:
                    prompts[name] = source[name]
                else:
                    prompts.pop(name, None)
            label = "the rule's merge" if k == 0 else f"flip {flips[k - 1]!r}"
            if prompts in seen:
                log.reject(f"{label}: the merged prompts equal a parent's or an earlier child's", plan=plan)
                continue
            seen.append(prompts)
            system = parent.replace(prompts=prompts)
            from_mate = sorted(n for n, s in plan.items() if s == "mate")
            rationale = (
                f"crossover with {mate.system.id[:8]}: {', '.join(from_mate)} from the mate, "
                f"{', '.join(sorted(n for n, s in plan.items() if s == 'parent')) or 'nothing else'} "
                f"from the parent ({basis})"
            )
            info = {"mate": mate.system.id, "taken": plan, "basis": basis, "differing_tasks": len(tasks)}
            log.child(system, rationale, **info)
            out.append(
                Candidate(
                    system=system,
                    parents=(parent.id, mate.system.id),
                    operator=self.name,
                    rationale=rationale,
                    info=info,
                )
            )
        return out
