"""Workflow graphs Γ: typed steps joined by conditional edges.

A :class:`Workflow` is plain, frozen data that lives in ``System.workflow["graph"]`` (so the
archive versions, diffs and rolls it back like every other part of Π)::

    Workflow(
        entry="write",
        nodes=(Node(id="write", type="sql.write"),
               Node(id="run", type="sql.execute"),
               Node(id="fix", type="sql.rewrite", max_visits=2),
               Node(id="answer", type="answer", params={"key": "sql"})),
        edges=(Edge(src="write", dst="run"),
               Edge(src="run", dst="fix", when="error"),
               Edge(src="fix", dst="run"),
               Edge(src="run", dst="answer")),
    )

Semantics (carried out by :mod:`evolve.topology.runtime`): start at ``entry`` with a state
dict; run the node (it returns updates to the state); then take the **first** outgoing edge,
in the order listed, whose ``when`` condition holds on the state and whose target still has
visits left (``max_visits``, when the node sets one); when none does, the run ends. So loops
are always bounded: a cycle is valid only if one of its nodes declares ``max_visits`` (its
bound). The runtime also stops any execution after ``max_steps`` node runs, as a backstop.

Conditions are a tiny expression language over state keys (see :mod:`evolve.topology.conditions`),
e.g. ``"error"``, ``"not rows"``, ``"votes < 2 and not error"``.

Which node types exist is a registry (:data:`evolve.registry.node_types`); :func:`validate`
checks a graph against it and raises one :class:`WorkflowError` that lists every problem
(including a node that would run itself: a vote in its own chain, or votes that run each other).
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import Any

from pydantic import Field, field_validator

from evolve.errors import UserError
from evolve.topology.conditions import compile_condition, condition_holds
from evolve.types import JSON, Frozen, canonical_json, content_hash

_ID = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"


class WorkflowError(UserError):
    """A workflow graph is invalid; the message lists each problem and how to fix it."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid workflow graph:\n  - " + "\n  - ".join(self.problems))


class Node(Frozen):
    """One step. ``type`` names a registered node type; ``params`` are that type's settings;
    ``max_visits`` bounds how often the node may run in one execution (None: no bound of its own;
    every cycle needs one bounded node)."""

    id: str = Field(pattern=_ID)
    type: str
    params: dict[str, JSON] = Field(default_factory=dict)
    max_visits: int | None = Field(None, ge=1, le=100)


class Edge(Frozen):
    """Data flows ``src`` → ``dst`` (through the shared state) when ``when`` holds (None: always)."""

    src: str
    dst: str
    when: str | None = None

    @field_validator("when")
    @classmethod
    def _parse(cls, v: str | None) -> str | None:
        if v is not None:
            compile_condition(v)
        return v


class Workflow(Frozen):
    entry: str
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...] = ()
    output: str = Field("answer", description="the state key the workflow returns")
    max_steps: int = Field(100, ge=1, le=10_000, description="backstop: node runs per execution")

    # ------------------------------------------------------------------ access

    @cached_property
    def id(self) -> str:  # computed once per (immutable) instance
        return content_hash(self.to_json())

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Workflow:
        """A copy with ``update`` applied, validated and with its own id (pydantic's copy would
        keep the original's cached ``id``, and would not validate the update)."""
        data = {k: getattr(self, k) for k in type(self).model_fields}
        if deep:
            data = copy.deepcopy(data)
        return type(self)(**{**data, **(update or {})})

    def node(self, node_id: str) -> Node:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(f"no node {node_id!r}; nodes are {[n.id for n in self.nodes]}")

    def has(self, node_id: str) -> bool:
        return any(n.id == node_id for n in self.nodes)

    def out_edges(self, node_id: str) -> list[Edge]:
        return [e for e in self.edges if e.src == node_id]

    def in_edges(self, node_id: str) -> list[Edge]:
        return [e for e in self.edges if e.dst == node_id]

    def of_type(self, *types: str) -> list[Node]:
        return [n for n in self.nodes if n.type in types]

    def fresh_id(self, stem: str) -> str:
        """An id not used yet: ``stem``, ``stem2``, ``stem3``, ..."""
        taken = {n.id for n in self.nodes}
        if stem not in taken:
            return stem
        i = 2
        while f"{stem}{i}" in taken:
            i += 1
        return f"{stem}{i}"

    # ------------------------------------------------------------------ edits (new graphs)

    def with_nodes(self, nodes: Iterable[Node], edges: Iterable[Edge] | None = None, **changes: Any) -> Workflow:
        data = {
            "entry": self.entry,
            "output": self.output,
            "max_steps": self.max_steps,
            **changes,
            "nodes": tuple(nodes),
            "edges": tuple(self.edges if edges is None else edges),
        }
        return Workflow(**data)

    def replace_node(self, node: Node) -> Workflow:
        return self.with_nodes([node if n.id == node.id else n for n in self.nodes])

    # ------------------------------------------------------------------ serialisation

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Workflow:
        from pydantic import ValidationError

        try:
            return cls.model_validate(dict(data))
        except ValidationError as e:
            raise WorkflowError(
                [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
            ) from None

    def to_nx(self):  # -> networkx.MultiDiGraph
        import networkx as nx

        g: nx.MultiDiGraph[str] = nx.MultiDiGraph(entry=self.entry, output=self.output)
        for n in self.nodes:
            g.add_node(n.id, type=n.type, params=dict(n.params), max_visits=n.max_visits)
        for i, e in enumerate(self.edges):
            g.add_edge(e.src, e.dst, key=i, when=e.when, order=i)
        return g

    def signature(self) -> str:
        """A readable one-line summary with each node's numeric settings, e.g.
        ``vote{n=5,temperature=0.8} -> answer`` or ``write -> run; run -[error]-> fix(x2); ...``."""

        def label(node_id: str) -> str:
            if not self.has(node_id):
                return node_id
            n = self.node(node_id)
            nums = ",".join(
                f"{k}={v}"
                for k, v in sorted(n.params.items())
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            )
            return node_id + (f"{{{nums}}}" if nums else "") + (f"(x{n.max_visits})" if n.max_visits else "")

        parts = [f"{label(e.src)} {'-[' + e.when + ']->' if e.when else '->'} {label(e.dst)}" for e in self.edges]
        return "; ".join(parts) or label(self.entry)


def graph_of(system: Any) -> Workflow | None:
    """The workflow graph of a System (``workflow["graph"]``), or None when it has none."""
    wf = getattr(system, "workflow", system) or {}
    data = wf.get("graph") if isinstance(wf, Mapping) else None
    return Workflow.from_json(data) if data else None


# ----------------------------------------------------------------------------- validation


def check_task_workflow(workflow: dict[str, Any]) -> None:
    """A task file's ``workflow.graph``, when given, must be a valid graph of known node types
    (:data:`evolve.registry.workflow_checks`); raises :class:`WorkflowError` (a UserError)."""
    graph = workflow.get("graph")
    if graph is None:
        return
    if not isinstance(graph, dict):
        raise WorkflowError([f"expected a mapping (entry, nodes, edges), got {type(graph).__name__}"])
    validate(Workflow.from_json(graph))


def validate(wf: Workflow, types: Any = None) -> Workflow:
    """Check ``wf``; raise :class:`WorkflowError` listing every problem, else return it.

    ``types`` is a registry with ``__contains__`` / ``get`` / ``names`` (default:
    :data:`evolve.registry.node_types`); a type's object may carry a pydantic ``Params`` model
    that the node's params are checked against, and ``refs(params) -> node ids`` for nodes it
    runs itself (a vote's chain), which count as reachable."""
    from pydantic import ValidationError

    from evolve.registry import did_you_mean

    if types is None:
        from evolve.registry import node_types as types
    problems: list[str] = []
    ids = [n.id for n in wf.nodes]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        problems.append(f"duplicate node ids {dup}; give each node its own id")
    if not wf.nodes:
        problems.append("the graph has no nodes; add at least one")
    if wf.entry not in ids:
        problems.append(f"entry {wf.entry!r} is not a node; set entry to one of {ids}")
    for i, e in enumerate(wf.edges):
        for end in ("src", "dst"):
            if getattr(e, end) not in ids:
                problems.append(
                    f"edge {i} ({e.src} -> {e.dst}) is dangling: its {end} {getattr(e, end)!r} is not a node; "
                    f"{did_you_mean(getattr(e, end), ids) if ids else 'add the node'}"
                )
    refs: dict[str, list[str]] = {}
    for n in wf.nodes:
        if n.type not in types:
            problems.append(
                f"node {n.id!r} has type {n.type!r}, which does not exist; {did_you_mean(n.type, types.names())}"
            )
            continue
        kind = types.get(n.type)
        params_model = getattr(kind, "Params", None)
        if params_model is not None:
            try:
                params_model.model_validate(n.params)
            except ValidationError as err:
                for x in err.errors():
                    where = ".".join(str(p) for p in x["loc"])
                    problems.append(f"node {n.id!r} ({n.type}): params.{where}: {x['msg']}")
                continue
        ref_fn = getattr(kind, "refs", None)
        if ref_fn is not None:
            refs[n.id] = list(ref_fn(n.params))
            for r in refs[n.id]:
                if r not in ids:
                    problems.append(f"node {n.id!r} refers to {r!r}, which is not a node")
    if problems:
        raise WorkflowError(problems)
    _check_cycles(wf, problems)
    _check_refs(refs, problems)
    _check_reachable(wf, refs, problems)
    if problems:
        raise WorkflowError(problems)
    return wf


def _check_cycles(wf: Workflow, problems: list[str]) -> None:
    """Every cycle needs a bounded node: equivalently, the nodes without ``max_visits`` must form
    no cycle among themselves (linear time, unlike listing every cycle)."""
    import networkx as nx

    free = {n.id for n in wf.nodes if not n.max_visits}
    g = nx.DiGraph([(e.src, e.dst) for e in wf.edges if e.src in free and e.dst in free])
    try:
        cycle = [u for u, _ in nx.find_cycle(g)]
    except nx.NetworkXNoCycle:
        return
    loop = " -> ".join(cycle + [cycle[0]])
    problems.append(f"cycle {loop} has no bound; set max_visits on one of its nodes (e.g. on {cycle[-1]!r})")


def _check_refs(refs: dict[str, list[str]], problems: list[str]) -> None:
    """No node may run itself: not in its own refs (a vote's chain), nor through other nodes' refs."""
    import networkx as nx

    for n, targets in refs.items():
        if n in targets:
            problems.append(f"node {n!r} would run itself: it is in its own refs (a vote's chain); remove it")
    g = nx.DiGraph([(u, t) for u, targets in refs.items() for t in targets if t != u])
    try:
        cycle = [u for u, _ in nx.find_cycle(g)]
    except nx.NetworkXNoCycle:
        return
    problems.append(f"nodes run each other through their refs: {' -> '.join(cycle + [cycle[0]])}; break the cycle")


def _check_reachable(wf: Workflow, refs: dict[str, list[str]], problems: list[str]) -> None:
    import networkx as nx

    g: nx.DiGraph = nx.DiGraph()
    g.add_nodes_from(n.id for n in wf.nodes)
    g.add_edges_from((e.src, e.dst) for e in wf.edges)
    for src, targets in refs.items():
        g.add_edges_from((src, t) for t in targets)
    lost = sorted(set(g) - nx.descendants(g, wf.entry) - {wf.entry})
    if lost:
        problems.append(f"nodes {lost} can never run (not reachable from entry {wf.entry!r}); connect or remove them")


# ----------------------------------------------------------------------------- diff and text


def diff_workflows(a: Workflow, b: Workflow) -> list[str]:
    """What changed from ``a`` to ``b``: nodes added/removed/changed, edges added/removed."""
    out: list[str] = []
    na, nb = {n.id: n for n in a.nodes}, {n.id: n for n in b.nodes}
    for i in sorted(nb.keys() - na.keys()):
        out.append(f"+ node {i} ({nb[i].type}) {canonical_json(nb[i].params) if nb[i].params else ''}".rstrip())
    for i in sorted(na.keys() - nb.keys()):
        out.append(f"- node {i} ({na[i].type})")
    for i in sorted(na.keys() & nb.keys()):
        if na[i] != nb[i]:
            before = canonical_json(na[i].model_dump(mode="json", exclude={"id"}))
            after = canonical_json(nb[i].model_dump(mode="json", exclude={"id"}))
            out.append(f"~ node {i}: {before} -> {after}")
    ea = [(e.src, e.dst, e.when) for e in a.edges]
    eb = [(e.src, e.dst, e.when) for e in b.edges]
    for line in difflib.unified_diff([_edge_text(*e) for e in ea], [_edge_text(*e) for e in eb], lineterm="", n=0):
        if line[:1] in "+-" and not line.startswith(("+++", "---")):
            out.append(f"{line[0]} edge {line[1:]}")
    if a.entry != b.entry:
        out.append(f"~ entry {a.entry} -> {b.entry}")
    return out


def _edge_text(src: str, dst: str, when: str | None) -> str:
    return f"{src} -> {dst}" + (f" [when {when}]" if when else "")


def to_text(wf: Workflow) -> str:
    """A terminal rendering: each node with its type, settings and where it goes next."""
    lines = [f"workflow (entry {wf.entry}, returns state[{wf.output!r}])"]
    for n in wf.nodes:
        bound = f" x{n.max_visits}" if n.max_visits else ""
        params = " " + canonical_json(n.params) if n.params else ""
        lines.append(f"  [{n.id}] {n.type}{bound}{params}")
        for e in wf.out_edges(n.id):
            lines.append(f"      -> {e.dst}" + (f"   if {e.when}" if e.when else ""))
        if not wf.out_edges(n.id):
            lines.append("      (end)")
    return "\n".join(lines)


__all__ = [
    "Edge",
    "Node",
    "Workflow",
    "WorkflowError",
    "compile_condition",
    "condition_holds",
    "diff_workflows",
    "graph_of",
    "to_text",
    "validate",
]
