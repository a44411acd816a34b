"""The ``topology`` operator: MCTS over the parent's workflow graph (Γ), alongside the other layers.

Each proposal, for one parent:

1. the parent's graph (``System.workflow["graph"]``) is the root; ``search_tasks`` training tasks
   are drawn with ``ctx.rng`` and every workflow the search visits is scored on them through
   ``ctx.rollouts`` (memoised in the archive, counted against the budget; tag ``topology``):
   score = mean reward, cost = mean model calls per trajectory (``cost: money``: mean money);
2. :class:`~evolve.topology.search.MCTS` explores single edits from the world's ``palette``
   (:mod:`evolve.topology.edits`) for ``max_evals`` evaluations, trading score against cost
   (``cost_weight``, ``cost_mode``); the per-parent experience of earlier generations of this run
   (read back from their ``topology.json``) orders and prunes the edits;
3. the ``children`` best workflows by utility that beat the root become candidates: the parent
   with that graph, the edit path as rationale, score/cost/utility as info.

``topology.json`` (``evaluated``: every workflow scored, with id, signature, score, calls per task, utility,
parent, edit, visits; and this search's experience) and ``frontier.png`` (accuracy against model
calls per task, the chosen ones marked) are written to the operator's work directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from evolve.errors import UserError
from evolve.operators import OperatorContext
from evolve.topology.edits import normalize, refs_of
from evolve.topology.graph import Workflow, graph_of
from evolve.topology.palette import Palette
from evolve.topology.search import MCTS, Experience, SearchResult
from evolve.types import Candidate, LLMCall, System


class TopologySearch:
    name = "topology"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        palette: Any = Field(description="palette items (a list), or an import path to one, e.g. "
                                         "evolve.worlds.sql.workflow:PALETTE")
        max_evals: int = Field(20, ge=1, description="distinct workflows evaluated per proposal (the root included)")
        search_tasks: int = Field(8, ge=1, description="training tasks each workflow is scored on")
        samples: int = Field(1, ge=1, description="rollouts per task")
        temperature: float | None = None
        exploration: float = Field(0.5, ge=0, description="UCT constant c (on utilities scaled to [0, 1])")
        widen: float | None = Field(0.5, gt=0, description="progressive widening: children <= widen * sqrt(visits)")
        cost: Literal["calls", "money"] = Field("calls", description="what a workflow costs: model calls per task, "
                                                "or money per task when the backend reports it")
        cost_weight: float = Field(0.01, ge=0, description="utility = score - cost_weight * cost penalty")
        cost_mode: Literal["relative", "absolute"] = Field("relative", description="relative: penalty in multiples "
                                                           "of the root's cost minus one; absolute: the cost")
        children: int = Field(1, ge=1, description="best workflows returned as candidates")
        max_nodes: int | None = Field(24, ge=1, description="no graphs with more nodes")
        remove: Literal["palette", "any", "none"] = Field("palette", description="which nodes the search may remove")
        experience: bool = Field(True, description="reuse the experience of earlier generations of this run")

        @field_validator("palette")
        @classmethod
        def _palette(cls, v: Any) -> Any:
            from evolve.registry import import_path

            try:  # a ValueError, so that a task file's error names operators.<i>.params.palette
                return Palette.parse(import_path(v, what="topology palette") if isinstance(v, str) else v)
            except UserError as e:
                raise ValueError(str(e)) from None

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)

    @property
    def palette(self) -> Palette:
        return self.p.palette

    def estimate(self, plan: Any = None) -> dict[str, Any]:
        """Work per proposal, for dry runs: rollouts at most (cached ones cost nothing); every model
        call the search makes is inside those rollouts."""
        return {"rollouts": self.p.max_evals * self.p.search_tasks * self.p.samples, "llm_calls": 0,
                "children": self.p.children}

    # ------------------------------------------------------------------ proposing

    def propose(self, parent: System, ctx: OperatorContext) -> list[Candidate]:
        from evolve.registry import node_types

        p = self.p
        root = graph_of(parent)
        if root is None:
            raise UserError(f"the topology operator needs a workflow graph, and system {parent.id[:12]} has none: "
                            "set workflow.graph in the task file (e.g. the JSON of evolve.worlds.sql.workflow:"
                            "single_step()) and workflow.agent to evolve.topology:agent")
        self.palette.check(node_types)
        tasks = ctx.rng.sample(list(ctx.train), min(p.search_tasks, len(ctx.train)))
        if not tasks:
            raise UserError("the topology operator needs training tasks to score workflows on; the train split is empty")
        metrics: dict[str, dict[str, float]] = {}
        root_id = normalize(root, refs_of(root, node_types)).id  # the search's (normalised) root is the parent

        def system_for(wf: Workflow) -> System:
            if wf.id == root_id:
                return parent
            return parent.replace(workflow={**parent.workflow, "graph": wf.to_json()})

        def evaluate(wf: Workflow) -> tuple[float, float]:
            trajs = ctx.rollouts(system_for(wf), tasks, samples=p.samples, temperature=p.temperature, tag="topology")
            n = max(len(trajs), 1)
            m = {"score": sum(t.score for t in trajs) / n,
                 "calls": sum(sum(isinstance(s, LLMCall) for s in t.steps) for t in trajs) / n,
                 "money": sum(t.cost for t in trajs) / n, "errors": sum(t.error is not None for t in trajs)}
            metrics[wf.id] = m
            return m["score"], m["calls"] if p.cost == "calls" else m["money"]

        experience = self._experience(ctx) if p.experience else Experience()
        start = len(experience.events)
        mcts = MCTS(evaluate, self.palette, node_types, max_evals=p.max_evals, exploration=p.exploration,
                    cost_weight=p.cost_weight, cost_mode=p.cost_mode, widen=p.widen, max_nodes=p.max_nodes,
                    remove=p.remove, seed=ctx.rng.randrange(2**31), experience=experience, log=ctx.log)
        result = mcts.run(root)
        chosen = result.top(p.children)
        self._write(ctx, parent, tasks, result, metrics, chosen, experience.to_json(start))
        r, rm = result.root, metrics.get(result.root.id, {})
        ctx.log(f"topology: {result.evaluations} workflows evaluated ({result.transpositions} reached twice); root "
                f"score {r.score:.3f} at {rm.get('calls', 0):.2f} calls/task; best {result.best.score:.3f} at "
                f"{metrics.get(result.best.id, {}).get('calls', 0):.2f} calls/task: {result.best.wf.signature()}")
        out = []
        for node in chosen:
            m, path = metrics.get(node.id, {}), result.path(node.id)
            info = {"score": node.score, "calls": m.get("calls"), "money": m.get("money"), "cost": node.cost,
                    "utility": node.utility, "root_score": r.score, "root_calls": rm.get("calls"),
                    "root_utility": r.utility, "evaluations": result.evaluations, "workflow": node.id,
                    "edits": [e.describe() for e in path], "signature": node.wf.signature()}
            why = (f"topology: {'; '.join(e.describe() for e in path)} (score {node.score:.3f} vs {r.score:.3f}, "
                   f"{m.get('calls', 0):.2f} vs {rm.get('calls', 0):.2f} model calls/task on {len(tasks)} tasks)")
            out.append(Candidate(system=system_for(node.wf), parents=(parent.id,), operator=self.name, rationale=why,
                                 info=info))
        return out

    @staticmethod
    def _experience(ctx: OperatorContext) -> Experience:
        """The records of this run's earlier generations (their topology.json files), in order:
        resuming a run rebuilds exactly what an uninterrupted one had."""
        found = []
        for path in sorted(Path(ctx.workdir).parent.glob("*/topology.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and int(data.get("generation", ctx.generation)) < ctx.generation:
                found.append((int(data["generation"]), path.parent.name, data.get("experience") or []))
        exp = Experience()
        for _, _, rows in sorted(found, key=lambda x: (x[0], x[1])):
            exp.merge(Experience.from_json(rows))
        return exp

    def _write(self, ctx: OperatorContext, parent: System, tasks: list, result: SearchResult,
               metrics: dict[str, dict[str, float]], chosen: list, experience: list) -> None:
        picked = {n.id for n in chosen}
        rows = []
        for n in result.nodes:
            m = metrics.get(n.id, {})
            rows.append({"id": n.id, "signature": n.wf.signature(), "score": n.score, "calls": m.get("calls"),
                         "money": m.get("money"), "errors": m.get("errors"), "cost": n.cost, "utility": n.utility,
                         "parent": n.parent, "edit": n.edit.describe() if n.edit else None,
                         "edit_json": n.edit.to_json() if n.edit else None, "depth": n.depth, "visits": n.visits,
                         "chosen": n.id in picked, "graph": n.wf.to_json()})
        report = {"generation": ctx.generation, "parent": parent.id, "root": result.root.id, "best": result.best.id,
                  "tasks": [str(t.get("id")) for t in tasks], "evaluations": result.evaluations,
                  "iterations": result.iterations, "transpositions": result.transpositions,
                  "params": self.p.model_dump(mode="json", exclude={"palette"}),
                  "palette": [it.model_dump(mode="json") for it in self.palette.items],
                  "evaluated": rows, "experience": experience}
        Path(ctx.workdir).mkdir(parents=True, exist_ok=True)
        (Path(ctx.workdir) / "topology.json").write_text(json.dumps(report, indent=1, default=str))
        plot_frontier(rows, Path(ctx.workdir) / "frontier.png")


def plot_frontier(rows: list[dict[str, Any]], path: Path) -> Path:
    """Accuracy against model calls per task: one point per workflow, the Pareto frontier as a
    line, the root and the chosen workflows marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    pts = [(r["calls"] if r.get("calls") is not None else r["cost"], r["score"], r) for r in rows]
    fig = Figure(figsize=(6.4, 4.4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.scatter([x for x, _, _ in pts], [y for _, y, _ in pts], s=22, c="#9aa7b8", label="evaluated", zorder=2)
    front, best = [], float("-inf")
    for x, y, _ in sorted(pts, key=lambda t: (t[0], -t[1])):
        if y > best:
            front.append((x, y))
            best = y
    if front:
        ax.step([x for x, _ in front], [y for _, y in front], where="post", color="#4a6fa5", lw=1, label="Pareto frontier")
    root = [(x, y) for x, y, r in pts if r.get("parent") is None]
    chosen = [(x, y) for x, y, r in pts if r.get("chosen")]
    if root:
        ax.scatter(*zip(*root), s=70, marker="s", facecolors="none", edgecolors="black", label="root", zorder=3)
    if chosen:
        ax.scatter(*zip(*chosen), s=110, marker="*", c="#d1495b", label="chosen", zorder=4)
    ax.set_xlabel("model calls per task")
    ax.set_ylabel("accuracy (mean reward)")
    ax.set_title(f"topology search: {len(rows)} workflows")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


__all__ = ["TopologySearch", "plot_frontier"]
