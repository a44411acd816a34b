"""Running a workflow graph: the :class:`Runtime` and the generic :func:`agent`.

Semantics are those of :mod:`evolve.topology.graph`: start at ``entry`` with a state dict, run
the node, merge the updates it returns into the state, take the first outgoing edge (in listed
order) whose ``when`` holds and whose target has visits left, stop when none does. At most
``wf.max_steps`` node runs happen in the main loop; when the limit cuts an execution short, a
``workflow:cut`` step is recorded and ``state["_cut"]`` is set. Nodes that a vote runs itself
(its ``chain``) are part of the vote's run and do not count against ``max_steps`` or ``max_visits``.

Node types implement :class:`evolve.topology.base.NodeType` (what :data:`evolve.registry.node_types`
names)::

    class MyStep:
        calls_model = True                  # does a run call a model? (cost estimates, colours)

        class Params(BaseModel):            # the node's params, checked by validate()
            model_config = ConfigDict(extra="forbid")
            role: str = "policy"

        @staticmethod
        def refs(params: dict) -> list[str]:   # optional: node ids this type runs itself
            return []

        @staticmethod
        def calls(params: dict) -> int:        # optional: model calls per run (default 1 / 0)
            return 1

        def run(self, params: Params, state: dict, rt: Runtime) -> dict:
            return {"key": "value"}         # updates merged into the state

State conventions: ``state["task"]`` is the task dict; ``state["messages"]`` is a list of
:class:`~evolve.types.Message` for multi-turn nodes; keys starting with ``_`` are private to the
runtime (``_temperature``, ``_cut``); ``state[wf.output]`` is the result.

Recording: each node run adds a ToolCall step ``node:<id>`` (after the steps the node made
itself) with ``args {"type", "visit"}``, a short summary of the updates as ``result`` and the
duration. A node that raises gets ``error`` on its step, and the execution ends with
:class:`NodeError` naming the node, which :func:`evolve.rollout.run_agent` records as the
trajectory's error (the steps before it are kept).
"""

from __future__ import annotations

import copy
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from evolve.topology.graph import Workflow, WorkflowError, condition_holds, graph_of, validate
from evolve.types import ToolCall

_SUMMARY_STR = 200
_SUMMARY_ITEMS = 20
_lock = threading.Lock()
_instances: dict[Any, Any] = {}  # type class -> its one instance
_prepared: dict[tuple[str, int], dict[str, tuple[Any, Any]]] = {}  # (wf id, registry) -> node id -> (impl, params)


class NodeError(RuntimeError):
    """A node raised while running; the message names the node, its type and the exception."""


def _registry(types: Any) -> Any:
    if types is None:
        from evolve.registry import node_types

        return node_types
    return types


def _instance(kind: Any) -> Any:
    with _lock:
        inst = _instances.get(kind)
        if inst is None:
            inst = kind() if isinstance(kind, type) else kind
            _instances[kind] = inst
        return inst


def prepare(wf: Workflow, types: Any = None) -> dict[str, tuple[Any, Any]]:
    """Validate ``wf`` (once per workflow id) and return node id -> (type instance, parsed params)."""
    types = _registry(types)
    key = (wf.id, id(types))
    with _lock:
        done = _prepared.get(key)
    if done is not None:
        return done
    validate(wf, types)
    out: dict[str, tuple[Any, Any]] = {}
    for n in wf.nodes:
        kind = types.get(n.type)
        model = getattr(kind, "Params", None)
        params = model.model_validate(n.params) if model is not None else dict(n.params)
        out[n.id] = (_instance(kind), params)
    with _lock:
        if len(_prepared) > 512:
            _prepared.clear()
        _prepared[key] = out
    return out


def summarize(value: Any, depth: int = 0) -> Any:
    """A short JSON-able version of ``value``: strings cut to 200 chars, long lists cut."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value if len(value) <= _SUMMARY_STR else value[:_SUMMARY_STR] + f"... ({len(value)} chars)"
    if depth >= 4:
        return summarize(repr(value), depth)
    if isinstance(value, dict):
        items = list(value.items())
        out = {str(k): summarize(v, depth + 1) for k, v in items[:_SUMMARY_ITEMS]}
        if len(items) > _SUMMARY_ITEMS:
            out["..."] = f"{len(items) - _SUMMARY_ITEMS} more"
        return out
    if isinstance(value, (list, tuple)):
        out_l = [summarize(v, depth + 1) for v in value[:_SUMMARY_ITEMS]]
        if len(value) > _SUMMARY_ITEMS:
            out_l.append(f"... {len(value) - _SUMMARY_ITEMS} more")
        return out_l
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return summarize(dump(mode="json"), depth)
    return summarize(repr(value), depth)


def _summary(updates: dict) -> dict:
    return {k: summarize(v) for k, v in updates.items() if not str(k).startswith("_") and k != "messages"}


class Runtime:
    """One execution of a workflow inside one rollout."""

    def __init__(self, ctx: Any, wf: Workflow | None = None, types: Any = None) -> None:
        self.ctx = ctx
        self.wf = wf if wf is not None else graph_of(ctx.system)
        if self.wf is None:
            raise WorkflowError(
                [
                    (
                        "the system has no workflow graph (System.workflow['graph']); add one, "
                        "e.g. Workflow(...).to_json(), or run a hand-written agent instead"
                    )
                ]
            )
        self._nodes = prepare(self.wf, types)
        self.runs: Counter[str] = Counter()  # every run of a node (main loop and vote chains)
        self.visits: Counter[str] = Counter()  # main-loop runs, bounded by max_visits
        self.steps = 0  # main-loop node runs (bounded by wf.max_steps)
        self._stack: list[str] = []

    @property
    def task(self) -> dict:
        return self.ctx.task

    def llm(self, role: str = "policy") -> Any:
        return self.ctx.llm(role)

    @staticmethod
    def temperature(state: dict, default: float | None = None) -> float | None:
        """The vote's sampling temperature when a vote runs this node, else ``default``."""
        t = state.get("_temperature")
        return default if t is None else t

    # ------------------------------------------------------------------ running nodes

    def run_node(self, node_id: str, state: dict) -> dict:
        """Run one node on ``state``; return a new state with its updates merged in."""
        from evolve.errors import RolloutTimeout

        if node_id not in self._nodes:
            raise NodeError(f"node {node_id!r} is not in the workflow; nodes are {list(self._nodes)}")
        if node_id in self._stack:
            raise NodeError(
                f"node {node_id!r} would run itself (through {' -> '.join(self._stack)}); "
                "a vote's chain must not contain the vote"
            )
        self.ctx.check_deadline()
        impl, params = self._nodes[node_id]
        ntype = self.wf.node(node_id).type
        self.runs[node_id] += 1
        args = {"type": ntype, "visit": self.runs[node_id]}
        self._stack.append(node_id)
        t0 = time.perf_counter()
        try:
            updates = impl.run(params, state, self)
            if updates is None:
                updates = {}
            if not isinstance(updates, dict):
                raise TypeError(f"run() returned {type(updates).__name__}, expected a dict of state updates")
        except (RolloutTimeout, NodeError) as e:
            self._record(node_id, args, t0, error=f"{type(e).__name__}: {e}")
            raise
        except Exception as e:
            msg = f"{type(e).__name__}: {e}"
            self._record(node_id, args, t0, error=msg)
            raise NodeError(f"node {node_id!r} ({ntype}) raised {msg}") from e
        finally:
            self._stack.pop()
        self._record(node_id, args, t0, result=_summary(updates))
        return {**state, **updates}

    def _record(self, node_id: str, args: dict, t0: float, result: Any = None, error: str | None = None) -> None:
        self.ctx.add_step(
            ToolCall(name=f"node:{node_id}", args=args, result=result, error=error, duration=time.perf_counter() - t0)
        )

    def run_chain(self, ids: Iterable[str], state: dict) -> dict:
        """Run the listed nodes once each, in order, on ``state`` (edges are ignored)."""
        for node_id in ids:
            state = self.run_node(node_id, state)
        return state

    def run_chains(self, ids: Sequence[str], starts: Sequence[dict], parallel: int) -> list[dict]:
        """Run ``ids`` once on each start state, up to ``parallel`` at a time, each in its own
        fork of the rollout (:meth:`RolloutContext.fork`): seeds depend on the branch, not on
        timing, and the branches' steps are added branch after branch. With ``parallel`` 1,
        or a context that cannot fork, the chains run one after another in this context."""
        fork = getattr(self.ctx, "fork", None)
        if parallel <= 1 or len(starts) <= 1 or fork is None:
            return [self.run_chain(ids, s) for s in starts]
        from concurrent.futures import ThreadPoolExecutor

        # branch i counts node runs from where sample i would start in a sequential vote (a plain
        # chain runs each node once per sample), so recorded visit numbers are the same
        starts_at = [self.runs + Counter(dict.fromkeys(ids, i)) for i in range(len(starts))]
        branches = [self._branch(fork(i), starts_at[i]) for i in range(len(starts))]
        with ThreadPoolExecutor(max_workers=min(parallel, len(starts)), thread_name_prefix="vote") as pool:
            futures = [pool.submit(b.run_chain, ids, s) for b, s in zip(branches, starts)]
            outcomes = [(f.exception(), None if f.exception() else f.result()) for f in futures]
        self.ctx.join([b.ctx for b in branches])
        for b, began in zip(branches, starts_at):
            self.runs.update(b.runs - began)
        for error, _ in outcomes:
            if error is not None:
                raise error
        return [state for _, state in outcomes if state is not None]  # each is one: no chain failed

    def _branch(self, ctx: Any, runs: Counter) -> Runtime:
        b = copy.copy(self)
        b.ctx, b.runs, b._stack = ctx, Counter(runs), list(self._stack)
        return b

    def _has_visits_left(self, node_id: str) -> bool:
        bound = self.wf.node(node_id).max_visits
        return bound is None or self.visits[node_id] < bound

    def next_node(self, node_id: str, state: dict) -> str | None:
        """The target of the first outgoing edge that holds and has visits left, else None. A
        condition that fails to evaluate raises :class:`NodeError` naming the edge."""
        for e in self.wf.out_edges(node_id):
            try:
                holds = condition_holds(e.when, state)
            except Exception as err:  # noqa: BLE001 - e.g. a value whose truth is ambiguous
                raise NodeError(
                    f"edge {e.src} -> {e.dst} when {e.when}: the condition raised {type(err).__name__}: {err}"
                ) from err
            if holds and self._has_visits_left(e.dst):
                return e.dst
        return None

    def execute(self, state: dict | None = None) -> dict:
        """Run the workflow from its entry; return the final state."""
        state = dict(state or {})
        state.setdefault("task", self.ctx.task)
        state.setdefault("messages", [])
        current: str | None = self.wf.entry
        while current is not None:
            if self.steps >= self.wf.max_steps:
                self.ctx.add_step(
                    ToolCall(
                        name="workflow:cut", args={"max_steps": self.wf.max_steps}, result={"next": current}, error=None
                    )
                )
                state["_cut"] = True
                break
            self.visits[current] += 1
            self.steps += 1
            state = self.run_node(current, state)
            current = self.next_node(current, state)
        return state


def agent(task: dict, ctx: Any) -> Any:
    """The generic agent: run the system's workflow graph on ``task``; return ``state[wf.output]``."""
    wf = graph_of(ctx.system)
    if wf is None:
        raise WorkflowError(
            [
                (
                    f"system {ctx.system.id[:12]} has no workflow graph (System.workflow['graph']); "
                    "give it one (Workflow(...).to_json()) or use a hand-written agent"
                )
            ]
        )
    state = Runtime(ctx, wf).execute()
    return state.get(wf.output)


# ----------------------------------------------------------------------------- static cost bound


def calls_per_run(kind: Any, params: dict) -> int:
    fn = getattr(kind, "calls", None)
    if fn is not None:
        return int(fn(params))
    return 1 if getattr(kind, "calls_model", False) else 0


def graph_calls_bound(workflow: Any) -> int | None:
    """:func:`calls_upper_bound` of the graph in a ``System.workflow`` dict (for budgets and the dry
    run): None when there is no graph, it is unbounded, or it is invalid (reported elsewhere: when
    the task loads, or by its failing rollouts)."""
    graph = workflow.get("graph") if isinstance(workflow, dict) else None
    if not graph:
        return None
    try:
        return calls_upper_bound(Workflow.from_json(graph))
    except Exception:  # noqa: BLE001 - see the docstring
        return None


def calls_upper_bound(wf: Workflow, types: Any = None) -> int | None:
    """Model calls one execution makes at most (from ``calls_model``/``calls``, visits, vote
    sizes and ``max_steps``), or None when nothing bounds them (a cycle without ``max_visits``).
    Does not validate: an unknown node type raises :class:`WorkflowError`."""
    import networkx as nx

    from evolve.registry import did_you_mean

    types = _registry(types)
    kinds: dict[str, Any] = {}
    for n in wf.nodes:
        if n.type not in types:
            raise WorkflowError(
                [(f"node {n.id!r} has type {n.type!r}, which does not exist; {did_you_mean(n.type, types.names())}")]
            )
        kinds[n.id] = types.get(n.type)
    ids = set(kinds)
    own = {v: calls_per_run(kinds[v], wf.node(v).params) for v in ids}
    refs: dict[str, tuple[list[str], int]] = {}
    for n in wf.nodes:
        ref_fn = getattr(kinds[n.id], "refs", None)
        if ref_fn is not None:
            times = getattr(kinds[n.id], "ref_runs", None)
            refs[n.id] = ([r for r in ref_fn(n.params) if r in ids], int(times(n.params)) if times else 1)
    # runs(v) <= [v is entry] + sum over distinct predecessors u of runs(u) (+ chain runs of votes);
    # a node with max_visits caps its main-loop runs, so edges into it add nothing and every cycle
    # of a valid graph is cut.
    bounded = {n.id: n.max_visits for n in wf.nodes if n.max_visits}
    g: nx.DiGraph[str] = nx.DiGraph()
    g.add_nodes_from(ids)
    for e in wf.edges:
        if e.src in ids and e.dst in ids and e.dst not in bounded:
            g.add_edge(e.src, e.dst, w=1)
    for u, (targets, times) in refs.items():
        for r in targets:
            g.add_edge(u, r, w=g.edges[u, r]["w"] + times if g.has_edge(u, r) else times)
    try:
        order = list(nx.topological_sort(g))
    except nx.NetworkXUnfeasible:
        return None
    runs: dict[str, int] = {}
    for v in order:
        main = bounded.get(v, 0) + int(v == wf.entry and v not in bounded)
        runs[v] = main + sum(runs[u] * d["w"] for u, _, d in g.in_edges(v, data=True))
    total = sum(runs[v] * own[v] for v in ids)

    def per_main_run(v: str, seen: frozenset) -> int:  # calls of one main-loop run of v, chains included
        targets, times = refs.get(v, ([], 1))
        return own[v] + times * sum(per_main_run(r, seen | {v}) for r in targets if r not in seen)

    cap = wf.max_steps * max((per_main_run(v, frozenset()) for v in ids), default=0)
    return min(total, cap)


__all__ = ["NodeError", "Runtime", "agent", "calls_upper_bound", "prepare", "summarize"]
