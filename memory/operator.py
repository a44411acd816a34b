"""The ``memory`` operator: grow and maintain the system's experience memory from its trajectories.

Each proposal, for one parent:

1. solved trajectories become experiences (``extract``: an import path of
   ``fn(trajectories, tasks_by_id) -> [{"kind", "text", "metadata"}]``; default: the SQL world's
   :func:`~evolve.worlds.sql.hooks.experiences`), added to the store in one transaction (an
   exact duplicate is a no-op, never a delete);
2. with ``feedback``, the items each trajectory recalled (its ``recall_memory`` tool step) are
   judged by the outcome, ExpeL-style, through :class:`~evolve.memory.HeuristicCurator`: a solved
   task strengthens what it recalled, a failed one weakens it, and an item is deleted (a
   tombstone, undoable) only after repeated weakening — never on one decision;
3. the child is the parent with ``System.memory`` pointing at the new store version, and the
   retrieval settings (``k``, ``kinds``) set when given — so the archive records which memory
   each system ran with, and rollback restores it. ``variants`` adds one child per alternative
   recall setting (how many, which kinds, how shown), so the engine's acceptance picks among them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evolve.loop.operators import OperatorContext
from evolve.types import Candidate, System, ToolCall


class MemoryOperator:
    name = "memory"
    world_params = {"extract": "memory.extract"}  # filled from the task's world when not given

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        store: str | None = Field(None, description="store folder; default: the parent's, else <run>/memory")
        extract: str = Field(
            description="import path of extract(trajectories, tasks, *, threshold) -> memory entries "
            "(the world's memory.extract hook, e.g. evolve.worlds.sql:experiences)"
        )
        tasks: int = Field(0, ge=0, description="extra training tasks rolled out to learn from (0: the minibatch)")
        samples: int = Field(1, ge=1)
        temperature: float | None = None
        threshold: float = 1.0
        feedback: bool = Field(True, description="strengthen / weaken recalled items by the outcome")
        k: int | None = Field(None, ge=0, description="experiences recalled per task, set on the child")
        kinds: list[str] | None = None
        embedder: str = Field("minilm", description="minilm (all-MiniLM-L6-v2, offline) or hashing (tests)")
        variants: list[dict[str, Any]] = Field(
            default_factory=list,
            description="recall settings to try as extra children, e.g. [{k: 2}, {render: skeleton}, {k: 0}]",
        )

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)
        self._extract: Any = None

    def estimate(self, plan: Any) -> dict[str, int]:
        """Per proposal (for ``evolve run --dry-run``): ``tasks`` x ``samples`` extra rollouts to
        learn from; one child, plus one per ``variants`` entry."""
        return {
            "rollouts": min(self.p.tasks, plan.train) * self.p.samples,
            "llm_calls": 0,
            "children": 1 + len(self.p.variants),
        }

    def _store(self, parent: System, ctx: OperatorContext) -> Any:
        from evolve.memory import HashingEmbedder, MemoryStore

        path = self.p.store or (parent.memory or {}).get("store") or str(Path(ctx.workdir).parents[1] / "memory")
        embedder = HashingEmbedder() if self.p.embedder == "hashing" else None
        return MemoryStore(path, embedder=embedder)

    def propose(self, parent: System, ctx: OperatorContext) -> list[Candidate]:
        from evolve.memory import Evidence, HeuristicCurator, apply
        from evolve.registry import import_path

        p = self.p
        if self._extract is None:
            self._extract = import_path(p.extract, what="memory operator extract")
        trajs = list(ctx.trajectories)
        if p.tasks:
            tasks = ctx.rng.sample(list(ctx.train), min(p.tasks, len(ctx.train)))
            trajs += ctx.rollouts(
                parent, tasks, samples=p.samples, temperature=p.temperature, tag="memory", logprobs=False
            )  # scores and text only
        by_id = {str(t["id"]): t for t in ctx.train}
        store = self._store(parent, ctx)
        try:
            before, n_before = store.version, len(store.items())
            entries = self._extract(trajs, by_id, threshold=p.threshold)
            if entries:
                store.add_many(entries)
            judged = 0
            if p.feedback:
                evidence = []
                for t in trajs:
                    ok = t.error is None and t.score >= p.threshold
                    for s in t.steps:
                        if isinstance(s, ToolCall) and s.name == "recall_memory" and isinstance(s.result, list):
                            evidence += [
                                Evidence(about=str(r["id"]), helpful=ok) for r in s.result if isinstance(r, dict)
                            ]
                judged = len(evidence)
                if evidence:
                    apply(store, HeuristicCurator().decide(store, evidence), source="memory operator")
            spec = {**(parent.memory or {}), "store": str(store.path.resolve()), "version": store.version}
            spec.setdefault("k", 1)
            spec.setdefault("kinds", ["experience"])
            if p.embedder != "minilm":
                spec["embedder"] = p.embedder
            if p.k is not None:
                spec["k"] = p.k
            if p.kinds is not None:
                spec["kinds"] = list(p.kinds)
            n_items = len(store.items())
        finally:
            store.close()
        new = n_items - n_before
        ctx.log(
            f"memory: {len(entries)} experiences from {len(trajs)} trajectories, {new} new; {judged} recalls judged; "
            f"version {before} -> {spec['version']}, {n_items} active items"
        )
        info = {"entries": len(entries), "new": new, "judged": judged, "version": spec["version"], "items": n_items}
        why = f"memory v{spec['version']}: +{new} experiences, {judged} recalls judged"
        out, seen = [], [parent.memory or {}]
        variants: list[dict[str, Any]] = [{}] + [dict(v) for v in p.variants]
        for extra in variants:  # the recall settings are part of the system too
            child_spec = {**spec, **extra}
            if child_spec in seen:
                continue
            seen.append(child_spec)
            how = ", ".join(f"{k}={child_spec.get(k)}" for k in ("k", "kinds", "render") if k in child_spec)
            out.append(
                Candidate(
                    system=parent.replace(memory=child_spec),
                    parents=(parent.id,),
                    operator=self.name,
                    rationale=f"{why}; recall {how}",
                    info={**info, "variant": extra},
                )
            )
        return out
