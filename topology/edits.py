"""Single edits of a workflow graph, from a world-supplied *palette*.

The grammar is world-agnostic; the world supplies the palette (the operator's ``palette``), e.g.::

    palette:
      - {name: repair, type: sql.rewrite, kind: loop, at: sql.execute, when: ["error", "error or empty"],
         max_visits: [1, 2, 3]}
      - {name: vote, kind: wrap, chain_types: [sql.write, sql.execute], params: {key: rows, exclude_when: error},
         grid: {n: [3, 5, 8], temperature: [0.5, 0.8, 1.0]}}
      - {name: check, type: check, kind: step, params: {expr: "rows"}}

Edit kinds (a new node gets ``params`` plus the first value of each ``grid`` list, and the first
``max_visits``; its id is ``name``, ``name2``, ...):

* ``step`` — insert a node T on an edge A→B: A→T→B (the edge keeps its ``when``; not next to a
  node of T's own type, nor after a vote whose chain ends in one; ``at`` limits A's types);
* ``loop`` — at a node A of a type in ``at``: A -(when)-> T -> A, placed before A's other
  out-edges; at a vote (or any node with ``refs``) whose chain ends in such a type, the loop
  returns to the chain's last node, which takes a copy of the vote's out-edges;
* ``wrap`` — replace a linear segment A1→…→Ak whose types are ``chain_types`` by a vote node V
  (``type``, default ``vote``) with ``chain = [A1..Ak]``: V takes A1's in-edges (and the entry)
  and a copy of Ak's out-edges; the chained nodes lose their edges among themselves (the vote
  runs them in order) and Ak keeps its out-edges only when something else (a repair loop) enters it;
* ``remove`` — a node (never the entry), predecessors reconnected to successors (conditions
  joined with ``and``, self-loops dropped); removing a vote unwraps it (exactly undoing ``wrap``);
* ``set`` — one param of a node of the item's type to another value of the item's ``grid``, or
  its ``max_visits`` to another value of the item's list;
* ``rewire`` — the ``when`` of a conditional edge into a node of the item's type, to another of
  the item's ``when`` options.

:func:`enumerate_edits` returns every distinct single edit whose result passes ``validate``, as
normalised graphs (nodes in execution order, edges grouped by source: that order means nothing).
New ids are handed out in edit order, so one graph reached by two edit paths can still carry
different ids (``check`` and ``check2`` swapped): :func:`shape_key` identifies graphs up to their
node ids, and results, the search's table and its evaluation cache are keyed by it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from evolve.topology.graph import Edge, Node, Workflow, WorkflowError, validate
from evolve.topology.palette import Palette, PaletteError, PaletteItem
from evolve.types import canonical_json, content_hash


@dataclass(frozen=True)
class Edit:
    """One edit: its kind, the palette item it uses ('' for none), the node ids it targets, and
    the values it sets (key, canonical JSON)."""

    kind: str
    item: str
    targets: tuple[str, ...]
    values: tuple[tuple[str, str], ...] = ()

    @property
    def signature(self) -> str:
        """What the edit does, without where: kind, item and values (the global prior's key)."""
        vals = ",".join(f"{k}={v}" for k, v in self.values)
        return f"{self.kind}:{self.item}" + (f":{vals}" if vals else "")

    def describe(self) -> str:
        t, v = self.targets, {k: _show(x) for k, x in self.values}
        if self.kind == "step":
            return f"insert {self.item} between {t[0]} and {t[1]}"
        if self.kind == "loop":
            return f"loop {self.item} at {t[0]} when {v.get('when', '')} (x{v.get('max_visits', '?')})"
        if self.kind == "wrap":
            return f"wrap {' -> '.join(t)} in {self.item}"
        if self.kind == "remove":
            return f"remove {t[0]}" + (" (unwrap its chain)" if v.get("unwrap") else "")
        if self.kind == "set":
            return f"set {t[0]}." + ", ".join(f"{k}={x}" for k, x in v.items())
        if self.kind == "rewire":
            return f"rewire {t[0]} -> {t[1]} when {v.get('when', '')}"
        return self.signature

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "item": self.item,
            "targets": list(self.targets),
            "values": [list(x) for x in self.values],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Edit:
        return cls(
            str(data["kind"]),
            str(data["item"]),
            tuple(data["targets"]),
            tuple((str(k), str(v)) for k, v in data.get("values", ())),
        )


def _show(text: str) -> str:
    value = json.loads(text)
    return value if isinstance(value, str) else text


def _val(**kw: Any) -> tuple[tuple[str, str], ...]:
    return tuple((k, canonical_json(v)) for k, v in kw.items())


# ----------------------------------------------------------------------------- graph helpers


def refs_of(wf: Workflow, types: Any) -> dict[str, list[str]]:
    """node id -> the node ids it runs itself (a vote's chain), from the types' ``refs``."""
    out: dict[str, list[str]] = {}
    for n in wf.nodes:
        kind = types.get(n.type) if n.type in types else None
        fn = getattr(kind, "refs", None)
        if fn is not None:
            try:
                out[n.id] = [str(r) for r in fn(n.params)]
            except Exception:  # noqa: BLE001 - malformed params: validate() reports them
                out[n.id] = []
    return out


def normalize(wf: Workflow, refs: Mapping[str, list[str]] | None = None) -> Workflow:
    """The same graph with nodes in execution order (breadth-first from the entry, edges then
    refs) and edges grouped by source in that order (their order per source is kept)."""
    refs = refs or {}
    ids = [n.id for n in wf.nodes]
    succ: dict[str, list[str]] = {i: [] for i in ids}
    for e in wf.edges:
        if e.src in succ:
            succ[e.src].append(e.dst)
    order, seen, queue = [], {wf.entry}, [wf.entry] if wf.entry in succ else []
    while queue:
        u = queue.pop(0)
        order.append(u)
        for v in succ[u] + list(refs.get(u, ())):
            if v not in seen and v in succ:
                seen.add(v)
                queue.append(v)
    order += [i for i in ids if i not in seen]
    rank = {i: k for k, i in enumerate(order)}
    nodes = sorted(wf.nodes, key=lambda n: rank[n.id])
    edges = sorted(wf.edges, key=lambda e: rank.get(e.src, len(rank)))
    return wf.with_nodes(nodes, edges)


def shape_key(wf: Workflow, refs: Mapping[str, list[str]] | None = None) -> str:
    """A hash of ``wf`` that does not depend on its node ids: :func:`normalize`'s form with each
    id replaced by its index in execution order, in edges, the entry and the params that name a
    node's ``refs`` (a vote's chain). ``refs``: as :func:`refs_of` gives them."""
    refs = refs or {}
    wf = normalize(wf, refs)
    index = {n.id: k for k, n in enumerate(wf.nodes)}

    def sub(value: Any, own: set[str]) -> Any:
        if isinstance(value, str):
            return {"$node": index[value]} if value in own else value
        if isinstance(value, list):
            return [sub(v, own) for v in value]
        if isinstance(value, dict):
            return {k: sub(v, own) for k, v in value.items()}
        return value

    nodes = [[n.type, sub(n.params, set(refs.get(n.id, ())) & set(index)), n.max_visits] for n in wf.nodes]
    edges = [[index.get(e.src, e.src), index.get(e.dst, e.dst), e.when] for e in wf.edges]
    return content_hash(
        {
            "entry": index.get(wf.entry, wf.entry),
            "nodes": nodes,
            "edges": edges,
            "output": wf.output,
            "max_steps": wf.max_steps,
        }
    )


def _edge_reachable(wf: Workflow) -> set[str]:
    succ: dict[str, list[str]] = {}
    for e in wf.edges:
        succ.setdefault(e.src, []).append(e.dst)
    seen, stack = {wf.entry}, [wf.entry]
    while stack:
        for v in succ.get(stack.pop(), ()):
            if v not in seen:
                seen.add(v)
                stack.append(v)
    return seen


def _and(a: str | None, b: str | None) -> str | None:
    if a is None or b is None:
        return a if b is None else b
    return a if a == b else f"({a}) and ({b})"


def _dedupe(edges: Iterable[Edge]) -> list[Edge]:
    out: list[Edge] = []
    for e in edges:
        if e not in out:
            out.append(e)
    return out


# ----------------------------------------------------------------------------- edit builders


def _step(wf: Workflow, it: PaletteItem, i: int) -> Workflow:
    e = wf.edges[i]
    t = Node(id=wf.fresh_id(it.name), type=it.type, params=it.node_params())
    edges = [*wf.edges[:i], Edge(src=e.src, dst=t.id, when=e.when), *wf.edges[i + 1 :], Edge(src=t.id, dst=e.dst)]
    return wf.with_nodes([*wf.nodes, t], edges)


def _loop(wf: Workflow, it: PaletteItem, a: str, back: str) -> Workflow:
    t = Node(id=wf.fresh_id(it.name), type=it.type, params=it.node_params(), max_visits=it.max_visits[0])
    first = next((k for k, e in enumerate(wf.edges) if e.src == a), len(wf.edges))
    edges = [*wf.edges[:first], Edge(src=a, dst=t.id, when=it.when[0]), *wf.edges[first:], Edge(src=t.id, dst=back)]
    if back != a and not any(e.src == back for e in edges):  # the chain's last node continues like the vote
        edges += [Edge(src=back, dst=e.dst, when=e.when) for e in edges if e.src == a]
    return wf.with_nodes([*wf.nodes, t], edges)


def _segments(wf: Workflow, it: PaletteItem, reach: set[str], chained: set[str]) -> list[list[str]]:
    out = []
    for a in wf.nodes:
        if a.type != it.chain_types[0] or a.id not in reach or a.id in chained:
            continue
        seg = [a.id]
        for want in it.chain_types[1:]:
            outs = wf.out_edges(seg[-1])
            if len(outs) != 1 or outs[0].when is not None:
                break
            nxt = outs[0].dst
            if nxt in seg or nxt in chained or wf.node(nxt).type != want:
                break
            if len(seg) + 1 < len(it.chain_types) and len(wf.in_edges(nxt)) != 1:
                break
            seg.append(nxt)
        if len(seg) == len(it.chain_types):
            out.append(seg)
    return out


def _wrap(wf: Workflow, it: PaletteItem, seg: list[str]) -> Workflow:
    v = Node(id=wf.fresh_id(it.name), type=it.type, params={**it.node_params(), it.chain_param: list(seg)})
    inner, last = set(seg), seg[-1]
    keep_last = any(e.dst == last and e.src not in inner for e in wf.edges)
    edges = []
    for e in wf.edges:
        if e.src in inner and e.dst in inner:
            continue  # the vote runs the chain itself
        if e.dst == seg[0]:
            e = Edge(src=e.src, dst=v.id, when=e.when)
        if e.src == last and not keep_last:
            continue
        edges.append(e)
    edges += [Edge(src=v.id, dst=e.dst, when=e.when) for e in wf.out_edges(last)]
    entry = v.id if wf.entry == seg[0] else wf.entry
    return wf.with_nodes([*wf.nodes, v], edges, entry=entry)


def _remove(wf: Workflow, n: str) -> Workflow:
    outs = wf.out_edges(n)
    edges: list[Edge] = []
    for e in wf.edges:
        if e.src == n:
            continue
        if e.dst == n:
            edges += [Edge(src=e.src, dst=o.dst, when=_and(e.when, o.when)) for o in outs if o.dst not in (n, e.src)]
        else:
            edges.append(e)
    return wf.with_nodes([x for x in wf.nodes if x.id != n], _dedupe(edges))


def _unwrap(wf: Workflow, v: str, chain: list[str]) -> Workflow:
    edges = [Edge(src=e.src, dst=chain[0], when=e.when) if e.dst == v else e for e in wf.edges if e.src != v]
    for a, b in zip(chain, chain[1:]):
        if not any(e.src == a for e in edges):
            edges.append(Edge(src=a, dst=b))
    if not any(e.src == chain[-1] for e in edges):
        edges += [Edge(src=chain[-1], dst=e.dst, when=e.when) for e in wf.out_edges(v)]
    entry = chain[0] if wf.entry == v else wf.entry
    return wf.with_nodes([x for x in wf.nodes if x.id != v], _dedupe(edges), entry=entry)


def _candidates(wf: Workflow, pal: Palette, types: Any, remove: str) -> Iterable[tuple[Edit, Any]]:
    """(edit, thunk building the new graph) for every single edit; results are not validated yet."""
    refs = refs_of(wf, types)
    chained = {r for rs in refs.values() for r in rs}
    reach = _edge_reachable(wf)
    count = {t: len(wf.of_type(t)) for t in pal.types()}
    type_of = {n.id: n.type for n in wf.nodes}
    for it in pal.items:
        full = it.max_count is not None and count.get(it.type, 0) >= it.max_count
        if it.kind == "step" and not full:
            for i, e in enumerate(wf.edges):
                last = refs.get(e.src, [])[-1:]  # a vote acts as the last node of its chain
                near = {type_of.get(e.src), type_of.get(e.dst)} | {type_of.get(x) for x in last}
                if e.src not in reach or (it.at and type_of.get(e.src) not in it.at) or it.type in near:
                    continue
                yield Edit("step", it.name, (e.src, e.dst)), lambda it=it, i=i: _step(wf, it, i)
        elif it.kind == "loop" and not full:
            for a in wf.nodes:
                if a.id not in reach or any(type_of.get(e.dst) == it.type for e in wf.out_edges(a.id)):
                    continue
                back = a.id if a.type in it.at else None
                chain = refs.get(a.id) or []
                if back is None and chain and chain[-1] != a.id and type_of.get(chain[-1]) in it.at:
                    back = chain[-1]
                if back is not None:
                    yield (
                        Edit("loop", it.name, (a.id,), _val(when=it.when[0], max_visits=it.max_visits[0])),
                        lambda it=it, a=a.id, back=back: _loop(wf, it, a, back),
                    )
        elif it.kind == "wrap" and not full:
            for seg in _segments(wf, it, reach, chained):
                yield Edit("wrap", it.name, tuple(seg)), lambda it=it, seg=seg: _wrap(wf, it, seg)
        for n in wf.of_type(it.type) if it.type else []:  # set: params along the grid, max_visits along its list
            for key, values in it.grid.items():
                for x in values:
                    if n.params.get(key) != x:
                        yield (
                            Edit("set", it.name, (n.id,), _val(**{key: x})),
                            lambda n=n, key=key, x=x: wf.replace_node(
                                n.model_copy(update={"params": {**n.params, key: x}})
                            ),
                        )
            for m in it.max_visits if n.max_visits is not None else []:
                if m != n.max_visits:
                    yield (
                        Edit("set", it.name, (n.id,), _val(max_visits=m)),
                        lambda n=n, m=m: wf.replace_node(n.model_copy(update={"max_visits": m})),
                    )
        for i, e in enumerate(wf.edges if len(it.when) > 1 else ()):  # rewire
            if e.when is not None and type_of.get(e.dst) == it.type:
                for w in it.when:
                    if w != e.when:
                        yield (
                            Edit("rewire", it.name, (e.src, e.dst), _val(when=w)),
                            lambda i=i, w=w: wf.with_nodes(
                                wf.nodes,
                                [*wf.edges[:i], wf.edges[i].model_copy(update={"when": w}), *wf.edges[i + 1 :]],
                            ),
                        )
    if remove == "none":
        return
    own = pal.types()
    for n in wf.nodes:
        if n.id == wf.entry and n.id not in refs or n.id in chained or (remove == "palette" and n.type not in own):
            continue
        item = next((it.name for it in pal.items if it.type == n.type), "")
        if refs.get(n.id):
            yield Edit("remove", item, (n.id,), _val(unwrap=True)), lambda n=n.id: _unwrap(wf, n, refs[n])
        elif n.id != wf.entry:
            yield Edit("remove", item, (n.id,)), lambda n=n.id: _remove(wf, n)


def candidate_edits(
    wf: Workflow, palette: Any, types: Any = None, *, remove: Literal["palette", "any", "none"] = "palette"
) -> list[tuple[Edit, Callable[[], Workflow]]]:
    """Every single edit of ``wf`` with a function that builds its result (not yet normalised,
    deduplicated or validated: see :func:`realize`). Cheap; the search builds only what it tries."""
    if types is None:
        from evolve.registry import node_types as types
    return list(_candidates(wf, Palette.parse(palette), types, remove))


def realize(
    build: Callable[[], Workflow],
    types: Any,
    *,
    max_nodes: int | None = None,
    checked: dict[str, bool] | None = None,
    skip: set[str] | None = None,
) -> Workflow | None:
    """Build an edit's result and normalise it; None when it is invalid, has more than
    ``max_nodes`` nodes, or its :func:`shape_key` is in ``skip`` (which it is then added to).
    ``checked`` (shape key -> valid) remembers validations across calls."""
    try:
        new = build()
        if max_nodes is not None and len(new.nodes) > max_nodes:
            return None
        refs = refs_of(new, types)
        new = normalize(new, refs)
        key = shape_key(new, refs)
    except (WorkflowError, ValidationError, ValueError):
        return None
    if skip is not None:
        if key in skip:
            return None
        skip.add(key)
    ok = checked.get(key) if checked is not None else None
    if ok is None:
        try:
            validate(new, types)
            ok = True
        except WorkflowError:
            ok = False
        if checked is not None:
            checked[key] = ok
    return new if ok else None


def enumerate_edits(
    wf: Workflow,
    palette: Any,
    types: Any = None,
    *,
    max_nodes: int | None = None,
    remove: Literal["palette", "any", "none"] = "palette",
    checked: dict[str, bool] | None = None,
) -> list[tuple[Edit, Workflow]]:
    """Every distinct single edit of ``wf`` whose result validates, with the normalised result.

    ``palette``: a :class:`Palette` or its list form; ``types``: the node type registry (default
    :data:`evolve.registry.node_types`); ``max_nodes`` drops results with more nodes; ``remove``:
    which nodes may be removed (``palette``: those of a palette item's type; ``any``; ``none``).
    Results identical to ``wf`` or to an earlier result (same :func:`shape_key`) are dropped."""
    if types is None:
        from evolve.registry import node_types as types
    seen = {shape_key(wf, refs_of(wf, types))}
    out = []
    for edit, build in candidate_edits(wf, palette, types, remove=remove):
        new = realize(build, types, max_nodes=max_nodes, checked=checked, skip=seen)
        if new is not None:
            out.append((edit, new))
    return out


__all__ = [
    "Edit",
    "Palette",
    "PaletteError",
    "PaletteItem",
    "candidate_edits",
    "enumerate_edits",
    "normalize",
    "realize",
    "refs_of",
    "shape_key",
]
