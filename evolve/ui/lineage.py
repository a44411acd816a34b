"""The lineage tree's picture: which systems to draw, and where.

A run of a few hundred systems is drawn whole. A larger one is drawn collapsed: the systems the
loop accepted, the marked ones (baseline, current, best, any with a deployment state) and their
ancestors, with each drawn system's other children folded into a ``+k`` count that expands on
request. Past ``cap`` systems even that is cut to the lineage of the marked systems.

The layout is a tidy tree on the first parent: one row per generation (``y``), each subtree on
its own contiguous stretch of columns (``x``), a parent centred over its children, so no two
systems of a generation share a place. Second parents (merges) are extra edges.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WHOLE = 300  # runs up to this many systems are drawn whole
CAP = 1500  # the most systems a collapsed view draws before it keeps only the marked lineages


@dataclass(frozen=True)
class Node:
    id: str
    generation: int
    parents: tuple[str, ...]
    seq: int


def visible(nodes: Sequence[Node], keep: Iterable[str], marked: Iterable[str], expanded: Iterable[str] = (),
            *, whole: bool = False, cap: int = CAP) -> tuple[set[str], str]:
    """The ids to draw and how the view was cut (``"whole"``, ``"collapsed"`` or ``"lineage"``).

    ``keep``: systems always drawn when collapsed (the accepted ones); ``marked``: baseline, current,
    best and the like (drawn in every view); ``expanded``: systems whose every child is drawn."""
    by_id = {n.id: n for n in nodes}
    if whole or len(nodes) <= WHOLE:
        return set(by_id), "whole"
    children = _children(nodes)
    expanded = [e for e in expanded if e in by_id]
    marked = [m for m in marked if m in by_id]

    def close(seed: Iterable[str]) -> set[str]:
        out: set[str] = set()
        for sid in seed:
            while sid in by_id and sid not in out:  # up the first-parent chain
                out.add(sid)
                ps = by_id[sid].parents
                sid = ps[0] if ps else ""
        return out

    extra = [c for e in expanded for c in children.get(e, ())]
    shown = close([k for k in keep if k in by_id] + marked + expanded + extra)
    if len(shown) <= cap:
        return shown, "collapsed"
    return close(marked + expanded + extra), "lineage"


def layout(nodes: Sequence[Node], shown: set[str]) -> dict[str, tuple[float, int]]:
    """``id -> (x, y)`` for the drawn systems: y the generation, x a column (see the module doc)."""
    by_id = {n.id: n for n in nodes if n.id in shown}
    kids: dict[str, list[str]] = {}
    roots = []
    for n in sorted(by_id.values(), key=lambda n: n.seq):
        p = n.parents[0] if n.parents else None
        if p is not None and p in by_id:
            kids.setdefault(p, []).append(n.id)
        else:
            roots.append(n.id)
    pos: dict[str, tuple[float, int]] = {}
    col = 0.0
    # iterative post-order: leaves take the next column, a parent the middle of its children's
    stack: list[tuple[str, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        sid, done = stack.pop()
        ks = kids.get(sid, ())
        if not ks:
            pos[sid] = (col, by_id[sid].generation)
            col += 1
        elif done:
            pos[sid] = ((pos[ks[0]][0] + pos[ks[-1]][0]) / 2, by_id[sid].generation)
        else:
            stack.append((sid, True))
            stack.extend((k, False) for k in reversed(ks))
    return pos


def hidden_children(nodes: Sequence[Node], shown: set[str]) -> dict[str, int]:
    """For each drawn system, how many of its children (on the first parent) are not drawn."""
    out: dict[str, int] = {}
    for parent, ks in _children(nodes).items():
        if parent in shown:
            n = sum(1 for k in ks if k not in shown)
            if n:
                out[parent] = n
    return out


def _children(nodes: Sequence[Node]) -> dict[str, list[str]]:
    kids: dict[str, list[str]] = {}
    for n in sorted(nodes, key=lambda n: n.seq):
        if n.parents:
            kids.setdefault(n.parents[0], []).append(n.id)
    return kids


def picture(nodes: Sequence[Node], facts: Mapping[str, Mapping[str, Any]], *, keep: Iterable[str],
            marked: Iterable[str], expanded: Iterable[str] = (), whole: bool = False, cap: int = CAP) -> dict[str, Any]:
    """The JSON the dashboard draws: ``nodes`` (each with its ``facts``, x, y and hidden children),
    ``edges`` ``[parent, child, position]`` among drawn systems, ``view`` and the counts."""
    shown, view = visible(nodes, keep, marked, expanded, whole=whole, cap=cap)
    pos = layout(nodes, shown)
    hidden = hidden_children(nodes, shown)
    out_nodes, edges = [], []
    for n in sorted((n for n in nodes if n.id in shown), key=lambda n: n.seq):
        x, y = pos[n.id]
        out_nodes.append({"id": n.id, "generation": n.generation, "parents": list(n.parents), "x": x, "y": y,
                          "hidden": hidden.get(n.id, 0), **facts.get(n.id, {})})
        edges += [[p, n.id, i] for i, p in enumerate(n.parents) if p in shown]
    return {"nodes": out_nodes, "edges": edges, "view": view, "total": len(nodes), "shown": len(shown),
            "generations": max((n.generation for n in nodes), default=0)}
