"""Monte Carlo tree search over workflow graphs (the search of AFlow, with its experience).

Tree nodes are workflows keyed by :func:`~evolve.topology.edits.shape_key` (a transposition table:
one graph reached by two edit paths is one node, with one evaluation and shared statistics, even
when the paths gave its new nodes different ids; the first graph found represents it). Each
iteration:

1. **selection** from the root: a node expands while it has untried edits and fewer children
   than ``widen * sqrt(visits)`` (progressive widening; ``widen=None``: all edits before going
   deeper), else it descends to the child with the best UCT value ``Q + c * sqrt(ln N / n)``
   (Q: the child's mean utility, scaled to [0, 1] over the utilities seen so far, so that ``c``
   does not depend on the scale of scores and costs; a child on the current path is skipped);
2. **expansion**: the untried edit with the best prior (see :class:`Experience`; ties broken by
   the seeded rng) is applied (edits are enumerated cheaply and built, deduplicated and validated
   only when tried: an invalid one is skipped); a new graph is evaluated with ``evaluate(wf) -> (score, cost)``
   (cached by shape key: a graph is never evaluated twice);
3. **backpropagation** of the child's utility along the path.

Utility trades score against cost (model calls per task, or money): ``relative`` (default)
``score - cost_weight * (cost / root_cost - 1)``, so with ``cost_weight=0.01`` a workflow three
times as costly as the root must gain 0.02 in score; ``absolute`` ``score - cost_weight * cost``.
The search stops after ``max_evals`` evaluations, or when no edit is left to try.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from evolve.topology.edits import Edit, candidate_edits, normalize, realize, refs_of, shape_key
from evolve.topology.graph import Workflow, validate
from evolve.topology.palette import Palette

Evaluate = Callable[[Workflow], "tuple[float, float]"]


def utility(
    score: float, cost: float, root_cost: float, cost_weight: float, mode: Literal["relative", "absolute"] = "relative"
) -> float:
    """Score less the cost penalty; ``relative`` measures cost in multiples of the root's (the
    plain cost when the root costs nothing)."""
    if mode == "absolute":
        return score - cost_weight * cost
    extra = cost / root_cost - 1.0 if root_cost > 0 else cost
    return score - cost_weight * extra


class Experience:
    """What edits did (AFlow's experience). Per parent workflow: each edit tried from it and the
    child's utility minus the parent's (helped when > 0, else hurt); an edit that hurt from a
    parent is not tried from it again. Globally: the mean gain per edit signature (kind, item,
    values) and per kind, which orders untried edits (best first)."""

    def __init__(self) -> None:
        self.by_parent: dict[str, dict[Edit, float]] = {}
        self.by_signature: dict[str, list[float]] = {}  # signature -> [n, total gain]
        self.by_kind: dict[str, list[float]] = {}
        self.events: list[tuple[str, Edit, float]] = []  # every record, in order

    def record(self, parent: str, edit: Edit, delta: float) -> None:
        self.events.append((parent, edit, delta))
        self.by_parent.setdefault(parent, {})[edit] = delta
        for table, key in ((self.by_signature, edit.signature), (self.by_kind, edit.kind)):
            acc = table.setdefault(key, [0, 0.0])
            acc[0] += 1
            acc[1] += delta

    def hurt(self, parent: str, edit: Edit) -> bool:
        delta = self.by_parent.get(parent, {}).get(edit)
        return delta is not None and delta <= 0

    def prior(self, edit: Edit) -> float:
        """Expected gain: the mean for this signature, else for this kind, else 0."""
        for table, key in ((self.by_signature, edit.signature), (self.by_kind, edit.kind)):
            if key in table and table[key][0]:
                return table[key][1] / table[key][0]
        return 0.0

    def records(self, parent: str) -> list[dict[str, Any]]:
        return [
            {"edit": e.describe(), "delta": round(d, 6), "outcome": "helped" if d > 0 else "hurt"}
            for e, d in self.by_parent.get(parent, {}).items()
        ]

    def merge(self, other: Experience) -> Experience:
        for parent, edit, delta in other.events:
            self.record(parent, edit, delta)
        return self

    def to_json(self, start: int = 0) -> list[dict[str, Any]]:
        """The records from ``start`` on (JSON rows); :meth:`from_json` reads them back."""
        return [
            {"parent": p, "edit": e.to_json(), "delta": d, "outcome": "helped" if d > 0 else "hurt"}
            for p, e, d in self.events[start:]
        ]

    @classmethod
    def from_json(cls, rows: list[dict[str, Any]] | None) -> Experience:
        exp = cls()
        for row in rows or ():
            exp.record(str(row["parent"]), Edit.from_json(row["edit"]), float(row["delta"]))
        return exp


@dataclass
class TreeNode:
    wf: Workflow
    id: str
    score: float
    cost: float
    utility: float
    parent: str | None
    edit: Edit | None
    depth: int
    order: int  # evaluation index (0: the root)
    key: str = ""  # shape_key of wf: what the table, the cache and ``children`` are keyed by
    visits: int = 0
    value: float = 0.0
    children: dict[str, Edit] = field(default_factory=dict)
    untried: list[tuple[float, Edit, Callable[[], Workflow]]] | None = None  # (tie-break, edit, build); None: not yet
    results: set[str] = field(default_factory=set)  # shape keys of the graphs its edits gave so far (and its own)
    exhausted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "signature": self.wf.signature(),
            "score": self.score,
            "cost": self.cost,
            "utility": self.utility,
            "parent": self.parent,
            "edit": self.edit.describe() if self.edit else None,
            "depth": self.depth,
            "order": self.order,
            "visits": self.visits,
            "mean_utility": self.value / self.visits if self.visits else None,
            "graph": self.wf.to_json(),
        }


@dataclass
class SearchResult:
    nodes: list[TreeNode]  # every evaluated workflow, in evaluation order
    root: TreeNode
    best: TreeNode
    evaluations: int
    cache_hits: int
    iterations: int
    transpositions: int  # edits that led to a graph already in the tree
    experience: Experience

    def node(self, wf_id: str) -> TreeNode:
        return next(n for n in self.nodes if n.id == wf_id)

    def path(self, wf_id: str) -> list[Edit]:
        """The edits from the root to ``wf_id`` (along first-found parents)."""
        out, n = [], self.node(wf_id)
        while n.parent is not None and n.edit is not None:
            out.append(n.edit)
            n = self.node(n.parent)
        return out[::-1]

    def top(self, k: int, *, better_than_root: bool = True) -> list[TreeNode]:
        ranked = sorted(self.nodes, key=lambda n: (-n.utility, n.cost, n.order))
        return [n for n in ranked if not better_than_root or n.utility > self.root.utility][:k]

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root.id,
            "best": self.best.id,
            "evaluations": self.evaluations,
            "cache_hits": self.cache_hits,
            "iterations": self.iterations,
            "transpositions": self.transpositions,
            "workflows": [n.to_json() for n in self.nodes],
            "experience": self.experience.to_json(),
        }


class MCTS:
    """The search; :meth:`run` returns a :class:`SearchResult`. Deterministic given ``seed``
    (and a deterministic ``evaluate``)."""

    def __init__(
        self,
        evaluate: Evaluate,
        palette: Any,
        types: Any = None,
        *,
        max_evals: int = 30,
        exploration: float = 0.5,
        cost_weight: float = 0.01,
        cost_mode: Literal["relative", "absolute"] = "relative",
        widen: float | None = 0.5,
        max_nodes: int | None = None,
        remove: Literal["palette", "any", "none"] = "palette",
        seed: int = 0,
        experience: Experience | None = None,
        cache: dict[str, tuple[float, float]] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if types is None:
            from evolve.registry import node_types as types
        if max_evals < 1:
            raise ValueError("max_evals must be at least 1")
        self.evaluate_fn, self.palette, self.types = evaluate, Palette.parse(palette), types
        self.max_evals, self.c, self.widen = max_evals, exploration, widen
        self.cost_weight, self.cost_mode = cost_weight, cost_mode
        self.max_nodes, self.remove = max_nodes, remove
        self.rng = random.Random(seed)
        self.experience = experience if experience is not None else Experience()
        self.cache = cache if cache is not None else {}
        self.log = log or (lambda msg: None)
        self.table: dict[str, TreeNode] = {}  # shape key -> node
        self.checked: dict[str, bool] = {}  # shape key -> passed validate (edits from two parents can agree)
        self.evaluations = self.cache_hits = self.iterations = self.transpositions = 0
        self.root_cost = 0.0
        self._range = (0.0, 1.0)

    def key(self, wf: Workflow) -> str:
        """``wf``'s :func:`shape_key` (its identity up to node ids)."""
        return shape_key(wf, refs_of(wf, self.types))

    def _evaluate(self, wf: Workflow, key: str) -> tuple[float, float]:
        if key in self.cache:
            self.cache_hits += 1
            return self.cache[key]
        self.evaluations += 1
        score, cost = self.evaluate_fn(wf)
        self.cache[key] = (float(score), float(cost))
        return self.cache[key]

    def _node(self, wf: Workflow, key: str, parent: TreeNode | None, edit: Edit | None) -> TreeNode:
        score, cost = self._evaluate(wf, key)
        if parent is None:
            self.root_cost = cost
        u = utility(score, cost, self.root_cost, self.cost_weight, self.cost_mode)
        node = TreeNode(
            wf,
            wf.id,
            score,
            cost,
            u,
            parent.id if parent else None,
            edit,
            parent.depth + 1 if parent else 0,
            len(self.table),
            key,
        )
        self.table[key] = node
        self.log(
            f"topology: eval {node.order}: score {score:.3f}, cost {cost:.2f}, utility {u:.4f}"
            + (f" <- {edit.describe()}" if edit else " (root)")
        )
        return node

    def _untried(self, node: TreeNode) -> list[tuple[float, Edit, Callable[[], Workflow]]]:
        if node.untried is None:  # edits are built and validated only when tried (see _expand)
            edits = candidate_edits(node.wf, self.palette, self.types, remove=self.remove)
            node.untried = [(self.rng.random(), e, build) for e, build in edits]
            node.results.add(node.key)
        return node.untried

    def _can_expand(self, node: TreeNode) -> bool:
        if not self._untried(node):
            return False
        return self.widen is None or len(node.children) < max(1, math.ceil(self.widen * math.sqrt(node.visits)))

    def _uct(self, parent: TreeNode, child: TreeNode) -> float:
        if child.visits == 0:
            return math.inf
        lo, hi = self._range
        q = (child.value / child.visits - lo) / (hi - lo) if hi > lo else 0.5
        return q + self.c * math.sqrt(math.log(max(parent.visits, 1)) / child.visits)

    def _select_child(self, node: TreeNode, on_path: set[str]) -> TreeNode | None:
        options = [self.table[c] for c in node.children if c not in on_path and not self.table[c].exhausted]
        if not options:
            return None
        utilities = [n.utility for n in self.table.values()]
        self._range = (min(utilities), max(utilities))
        return max(options, key=lambda ch: (self._uct(node, ch), -ch.order))

    def _expand(self, node: TreeNode, on_path: set[str]) -> TreeNode | None:
        """Apply the untried edit with the best prior that did not hurt from this node before and
        whose result is valid and new from it; None when none is left, or it led back onto the path."""
        untried, wf = self._untried(node), None
        while untried and wf is None:
            best = max(range(len(untried)), key=lambda k: (self.experience.prior(untried[k][1]), untried[k][0]))
            _, edit, build = untried.pop(best)
            if not self.experience.hurt(node.id, edit):
                wf = realize(build, self.types, max_nodes=self.max_nodes, checked=self.checked, skip=node.results)
        if wf is None:
            return None
        key = self.key(wf)
        child = self.table.get(key)
        if child is None:
            child = self._node(wf, key, node, edit)
        else:
            self.transpositions += 1
            if key in on_path:
                return None
        node.children.setdefault(key, edit)
        self.experience.record(node.id, edit, child.utility - node.utility)
        return child

    def run(self, root: Workflow) -> SearchResult:
        root = normalize(validate(root, self.types), refs_of(root, self.types))
        top = self._node(root, self.key(root), None, None)
        limit = 50 * self.max_evals + 1000  # iterations without evaluations (cache hits) are cheap but bounded
        while self.evaluations < self.max_evals and not top.exhausted and self.iterations < limit:
            self.iterations += 1
            path, node = [top], top
            while not self._can_expand(node):
                nxt = self._select_child(node, {n.key for n in path})
                if nxt is None:  # nothing to descend to: expand here after all, or it is a dead end
                    node.exhausted = not self._untried(node)
                    break
                path.append(node := nxt)
            if node.exhausted:
                continue
            child = self._expand(node, {n.key for n in path})
            if child is None:
                continue
            for n in path + [child]:
                n.visits += 1
                n.value += child.utility
        nodes = sorted(self.table.values(), key=lambda n: n.order)
        best = max(nodes, key=lambda n: (n.utility, -n.cost, -n.order))
        return SearchResult(
            nodes, top, best, self.evaluations, self.cache_hits, self.iterations, self.transpositions, self.experience
        )


def search(root: Workflow, evaluate: Evaluate, palette: Any, types: Any = None, **options: Any) -> SearchResult:
    """Run :class:`MCTS` from ``root``; ``options`` are its keyword arguments."""
    return MCTS(evaluate, palette, types, **options).run(root)


__all__ = ["Evaluate", "Experience", "MCTS", "SearchResult", "TreeNode", "search", "utility"]
