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

For dry runs, :meth:`TopologySearch.estimate` counts the rollouts of a proposal (``llm_calls`` is 0:
every model call is inside a rollout) and ``calls_per_rollout_max``, the most model calls one of
those rollouts makes (:meth:`TopologySearch.calls_per_rollout_max`).

``topology.json`` (``evaluated``: every workflow scored, with id, signature, score, calls per task, utility,
parent, edit, visits; and this search's experience) and ``frontier.png`` (accuracy against model
calls per task, the chosen ones marked) are written to the operator's work directory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from evolve.errors import UserError
from evolve.loop.operators import OperatorContext
from evolve.topology.edits import normalize, refs_of
from evolve.topology.graph import Workflow, graph_of
from evolve.topology.palette import Palette
from evolve.topology.search import MCTS, Experience, SearchResult
from evolve.types import Candidate, LLMCall, System


class TopologySearch:
    name = "topology"
    world_params = {"palette": "topology.palette"}  # filled from the task's world when not given

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        palette: Any = Field(
            description="palette items (a list), or an import path to one, e.g. evolve.worlds.sql.workflow:PALETTE"
        )
        max_evals: int = Field(20, ge=1, description="distinct workflows evaluated per proposal (the root included)")
        search_tasks: int = Field(8, ge=1, description="training tasks each workflow is scored on")
        samples: int = Field(1, ge=1, description="rollouts per task")
        temperature: float | None = None
        exploration: float = Field(0.5, ge=0, description="UCT constant c (on utilities scaled to [0, 1])")
        widen: float | None = Field(0.5, gt=0, description="progressive widening: children <= widen * sqrt(visits)")
        cost: Literal["calls", "money"] = Field(
            "calls",
            description="what a workflow costs: model calls per task, or money per task when the backend reports it",
        )
        cost_weight: float = Field(0.01, ge=0, description="utility = score - cost_weight * cost penalty")
        cost_mode: Literal["relative", "absolute"] = Field(
            "relative", description="relative: penalty in multiples of the root's cost minus one; absolute: the cost"
        )
        children: int = Field(1, ge=1, description="best workflows returned as candidates")
        max_nodes: int | None = Field(24, ge=1, description="no graphs with more nodes")
        remove: Literal["palette", "any", "none"] = Field("palette", description="which nodes the search may remove")
        experience: bool = Field(True, description="reuse the experience of earlier generations of this run")

        @field_validator("palette")
        @classmethod
        def _palette(cls, v: Any) -> Any:
            from evolve.registry import import_path, node_types

            try:  # a ValueError, so that a task file's error names operators.<i>.params.palette
                palette = Palette.parse(import_path(v, what="topology palette") if isinstance(v, str) else v)
                palette.check(node_types)  # its node types must exist
                return palette
            except UserError as e:
                raise ValueError(str(e)) from None

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)

    @property
    def palette(self) -> Palette:
        return self.p.palette

    def estimate(self, plan: Any = None) -> dict[str, Any]:
        """Work per proposal, for dry runs: rollouts at most (cached ones cost nothing); every model
        call the search makes is inside those rollouts, so ``llm_calls`` (calls outside rollouts)
        is 0. ``calls_per_rollout_max``: :meth:`calls_per_rollout_max` of the plan's
        ``calls_per_rollout`` (the starting graph's bound, when the run has one; else 1)."""
        root = getattr(plan, "calls_per_rollout", None) or 1
        return {
            "rollouts": self.p.max_evals * self.p.search_tasks * self.p.samples,
            "llm_calls": 0,
            "children": self.p.children,
            "calls_per_rollout_max": self.calls_per_rollout_max(root),
        }

    def calls_per_rollout_max(self, root: Workflow | float, types: Any = None) -> int | None:
        """The most model calls one rollout of a workflow this search builds from ``root`` makes,
        when it applies each palette item at most once, at its largest settings (the shapes a
        proposal explores; items applied again, e.g. repair loops on several steps, or votes
        nested in votes, can exceed it). ``root``: the starting graph (its
        :func:`~evolve.topology.runtime.calls_upper_bound`, with the nodes of palette types at
        their largest grid values and ``max_visits``) or that bound itself; None when unbounded.

        The bound: the root's calls, those of nodes a vote can still wrap (of a chain type, in
        no chain; all of them for a number) multiplied by the largest vote ``n``; each loop adds
        its largest ``max_visits`` x the calls of its node and of the node it returns to, each
        step its calls x (1 + the loops' bounds), also multiplied when a vote can wrap its type."""
        from evolve.topology.runtime import calls_per_run, calls_upper_bound

        if types is None:
            from evolve.registry import node_types as types
        items = self.palette.items

        def calls(t: str | None, params: dict | None = None) -> int:  # unknown types: 1 (conservative)
            return calls_per_run(types.get(t), params or {}) if t and t in types else 1

        chained = {t for it in items if it.kind == "wrap" for t in it.chain_types}
        if isinstance(root, Workflow):
            wf = _maxed(root, items)
            inside = {r for rs in refs_of(wf, types).values() for r in rs}

            def wrappable(n: Any) -> bool:  # a vote can still wrap it: a chain type, in no chain, no vote itself
                return (
                    n.type in chained
                    and n.id not in inside
                    and n.type in types
                    and not hasattr(types.get(n.type), "refs")
                )

            rest = wf.with_nodes([n.model_copy(update={"type": _ZERO}) if wrappable(n) else n for n in wf.nodes])
            total, fixed = calls_upper_bound(wf, types), calls_upper_bound(rest, _Zeroed(types))
            if total is None or fixed is None:
                return None
            inner, outer = float(total - fixed), float(fixed)
        else:
            inner, outer = float(root), 0.0
        loops = {it.name: max(it.max_visits) for it in items if it.kind == "loop"}

        def runs(it: Any) -> int:  # the most times one vote of a wrap item runs its chain
            fn = getattr(types.get(it.type), "ref_runs", None) if it.type in types else None
            trials = [it.node_params()] + [{**it.node_params(), k: v} for k, vs in it.grid.items() for v in vs]
            if fn is not None:
                return max(int(fn(p)) for p in trials)
            return max([1, *(int(p["n"]) for p in trials if isinstance(p.get("n"), (int, float)))])

        votes = [runs(it) for it in items if it.kind == "wrap"]
        for it in items:
            if it.kind == "wrap":
                continue
            if it.kind == "loop":
                add = loops[it.name] * (calls(it.type, it.node_params()) + max(calls(t) for t in it.at))
            else:
                add = calls(it.type, it.node_params()) * (1 + sum(loops.values()))
            if it.type in chained:
                inner += add
            else:
                outer += add
        return int(math.ceil(inner * max([1, *votes]) + outer))

    # ------------------------------------------------------------------ proposing

    def propose(self, parent: System, ctx: OperatorContext) -> list[Candidate]:
        from evolve.registry import node_types

        p = self.p
        root = graph_of(parent)
        if root is None:
            raise UserError(
                f"the topology operator needs a workflow graph, and system {parent.id[:12]} has none: "
                "set the task's top-level `agent: evolve.topology:agent` and a `workflow.graph` (e.g. "
                "the JSON of evolve.worlds.sql.workflow:single_step())"
            )
        self.palette.check(node_types)
        tasks = ctx.rng.sample(list(ctx.train), min(p.search_tasks, len(ctx.train)))
        if not tasks:
            raise UserError(
                "the topology operator needs training tasks to score workflows on; the train split is empty"
            )
        metrics: dict[str, dict[str, float]] = {}
        root_id = normalize(root, refs_of(root, node_types)).id  # the search's (normalised) root is the parent

        def system_for(wf: Workflow) -> System:
            if wf.id == root_id:
                return parent
            return parent.replace(workflow={**parent.workflow, "graph": wf.to_json()})

        def evaluate(wf: Workflow) -> tuple[float, float]:
            trajs = ctx.rollouts(
                system_for(wf), tasks, samples=p.samples, temperature=p.temperature, tag="topology", logprobs=False
            )  # scores only: a vote's samples need no log-probs
            n = max(len(trajs), 1)
            m = {
                "score": sum(t.score for t in trajs) / n,
                "calls": sum(sum(isinstance(s, LLMCall) for s in t.steps) for t in trajs) / n,
                "money": sum(t.cost for t in trajs) / n,
                "errors": sum(t.error is not None for t in trajs),
            }
            metrics[wf.id] = m
            return m["score"], m["calls"] if p.cost == "calls" else m["money"]

        experience = self._experience(ctx) if p.experience else Experience()
        start = len(experience.events)
        mcts = MCTS(
            evaluate,
            self.palette,
            node_types,
            max_evals=p.max_evals,
            exploration=p.exploration,
            cost_weight=p.cost_weight,
            cost_mode=p.cost_mode,
            widen=p.widen,
            max_nodes=p.max_nodes,
            remove=p.remove,
            seed=ctx.rng.randrange(2**31),
            experience=experience,
            log=ctx.log,
        )
        result = mcts.run(root)
        chosen = result.top(p.children)
        self._write(ctx, parent, tasks, result, metrics, chosen, experience.to_json(start))
        r, rm = result.root, metrics.get(result.root.id, {})
        ctx.log(
            f"topology: {result.evaluations} workflows evaluated ({result.transpositions} reached twice); root "
            f"score {r.score:.3f} at {rm.get('calls', 0):.2f} calls/task; best {result.best.score:.3f} at "
            f"{metrics.get(result.best.id, {}).get('calls', 0):.2f} calls/task: {result.best.wf.signature()}"
        )
        out = []
        for node in chosen:
            m, path = metrics.get(node.id, {}), result.path(node.id)
            info = {
                "score": node.score,
                "calls": m.get("calls"),
                "money": m.get("money"),
                "cost": node.cost,
                "utility": node.utility,
                "root_score": r.score,
                "root_calls": rm.get("calls"),
                "root_utility": r.utility,
                "evaluations": result.evaluations,
                "workflow": node.id,
                "edits": [e.describe() for e in path],
                "signature": node.wf.signature(),
            }
            why = (
                f"topology: {'; '.join(e.describe() for e in path)} (score {node.score:.3f} vs {r.score:.3f}, "
                f"{m.get('calls', 0):.2f} vs {rm.get('calls', 0):.2f} model calls/task on {len(tasks)} tasks)"
            )
            out.append(
                Candidate(
                    system=system_for(node.wf), parents=(parent.id,), operator=self.name, rationale=why, info=info
                )
            )
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

    def _write(
        self,
        ctx: OperatorContext,
        parent: System,
        tasks: list,
        result: SearchResult,
        metrics: dict[str, dict[str, float]],
        chosen: list,
        experience: list,
    ) -> None:
        picked = {n.id for n in chosen}
        rows = []
        for n in result.nodes:
            m = metrics.get(n.id, {})
            rows.append(
                {
                    "id": n.id,
                    "signature": n.wf.signature(),
                    "score": n.score,
                    "calls": m.get("calls"),
                    "money": m.get("money"),
                    "errors": m.get("errors"),
                    "cost": n.cost,
                    "utility": n.utility,
                    "parent": n.parent,
                    "edit": n.edit.describe() if n.edit else None,
                    "edit_json": n.edit.to_json() if n.edit else None,
                    "depth": n.depth,
                    "visits": n.visits,
                    "chosen": n.id in picked,
                    "graph": n.wf.to_json(),
                }
            )
        report = {
            "generation": ctx.generation,
            "parent": parent.id,
            "root": result.root.id,
            "best": result.best.id,
            "tasks": [str(t.get("id")) for t in tasks],
            "evaluations": result.evaluations,
            "iterations": result.iterations,
            "transpositions": result.transpositions,
            "params": self.p.model_dump(mode="json", exclude={"palette"}),
            "palette": [it.model_dump(mode="json") for it in self.palette.items],
            "evaluated": rows,
            "experience": experience,
        }
        Path(ctx.workdir).mkdir(parents=True, exist_ok=True)
        (Path(ctx.workdir) / "topology.json").write_text(json.dumps(report, indent=1, default=str))
        plot_frontier(rows, Path(ctx.workdir) / "frontier.png")


_ZERO = "topology.no-calls"


class _Zeroed:
    """``types`` plus a type that makes no model calls (for the calls of the other nodes)."""

    calls_model = False

    def __init__(self, types: Any) -> None:
        self.types = types

    def __contains__(self, name: str) -> bool:
        return name == _ZERO or name in self.types

    def get(self, name: str) -> Any:
        return self if name == _ZERO else self.types.get(name)

    def names(self) -> list[str]:
        return self.types.names()


def _maxed(wf: Workflow, items: Any) -> Workflow:
    """``wf`` with each node of a palette item's type at the item's largest numeric grid values
    and ``max_visits`` (what ``set`` edits can raise it to)."""
    nodes = []
    for n in wf.nodes:
        for it in items:
            if it.type == n.type:
                top = {k: max(v) for k, v in it.grid.items() if all(isinstance(x, (int, float)) for x in v)}
                bound = max([n.max_visits, *it.max_visits]) if n.max_visits and it.max_visits else n.max_visits
                n = n.model_copy(update={"params": {**n.params, **top}, "max_visits": bound})
        nodes.append(n)
    return wf.with_nodes(nodes)


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
        ax.step(
            [x for x, _ in front], [y for _, y in front], where="post", color="#4a6fa5", lw=1, label="Pareto frontier"
        )
    root = [(x, y) for x, y, r in pts if r.get("parent") is None]
    chosen = [(x, y) for x, y, r in pts if r.get("chosen")]
    if root:
        xs, ys = zip(*root)
        ax.scatter(xs, ys, s=70, marker="s", facecolors="none", edgecolors="black", label="root", zorder=3)
    if chosen:
        xs, ys = zip(*chosen)
        ax.scatter(xs, ys, s=110, marker="*", c="#d1495b", label="chosen", zorder=4)
    ax.set_xlabel("model calls per task")
    ax.set_ylabel("accuracy (mean reward)")
    ax.set_title(f"topology search: {len(rows)} workflows")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


__all__ = ["TopologySearch", "plot_frontier"]
