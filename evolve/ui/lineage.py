"""The lineage tree's picture: which systems to draw, and where.

A run of a few hundred systems is drawn whole. A larger one is drawn collapsed: the systems the
loop accepted, the marked ones (baseline, current, best, any with a deployment state) and their
ancestors, with each drawn system's other children folded into a ``+k`` count that expands on
request. When that is still more than ``cap`` systems, only the lineages of the marked systems
are drawn (``mode="accepted"`` draws the accepted ones anyway, ``mode="all"`` everything).

The layout is a tidy tree on the first parent: a row per generation (``y``; a system whose parent
is of its own generation goes a row lower, so a row can hold two), each subtree on its own
contiguous stretch of columns (``x``), a parent centred over its children, so no two systems share
a place. Second parents (merges) are extra edges.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WHOLE = 300  # runs up to this many systems are drawn whole
CAP = 400  # the most systems the collapsed view draws before it keeps only the marked lineages
MODES = ("auto", "accepted", "all")


@dataclass(frozen=True)
class Node:
    id: str
    generation: int
    parents: tuple[str, ...]
    seq: int


def visible(
    nodes: Sequence[Node],
    keep: Iterable[str],
    marked: Iterable[str],
    expanded: Iterable[str] = (),
    *,
    mode: str = "auto",
    cap: int = CAP,
) -> tuple[set[str], str]:
    """The ids to draw and how the view was cut (``"whole"``, ``"collapsed"`` or ``"lineage"``).

    ``keep``: systems always drawn when collapsed (the accepted ones); ``marked``: baseline, current,
    best and the like (drawn in every view); ``expanded``: systems whose every child is drawn."""
    if mode not in MODES:
        raise ValueError(f"the lineage view is one of {', '.join(MODES)}, not {mode!r}")
    by_id = {n.id: n for n in nodes}
    if mode == "all" or len(nodes) <= WHOLE:
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
    if len(shown) <= cap or mode == "accepted":
        return shown, "collapsed"
    return close(marked + expanded + extra), "lineage"


def layout(nodes: Sequence[Node], shown: set[str]) -> dict[str, tuple[float, int]]:
    """``id -> (x, y)`` for the drawn systems: y the generation's row, x a column (see the module doc)."""
    by_id = {n.id: n for n in nodes if n.id in shown}
    kids: dict[str, list[str]] = {}
    roots = []
    row: dict[str, int] = {}
    for n in sorted(by_id.values(), key=lambda n: n.seq):  # parents come before their children
        p = n.parents[0] if n.parents else None
        row[n.id] = max([n.generation] + [row[q] + 1 for q in n.parents if q in row])
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
            pos[sid] = (col, row[sid])
            col += 1
        elif done:
            pos[sid] = ((pos[ks[0]][0] + pos[ks[-1]][0]) / 2, row[sid])
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


def picture(
    nodes: Sequence[Node],
    facts: Mapping[str, Mapping[str, Any]],
    *,
    keep: Iterable[str],
    marked: Iterable[str],
    expanded: Iterable[str] = (),
    mode: str = "auto",
    cap: int = CAP,
) -> dict[str, Any]:
    """The JSON the dashboard draws: ``nodes`` (each with its ``facts``, x, y and hidden children),
    ``edges`` ``[parent, child, position]`` among drawn systems, ``view`` and the counts."""
    keep = list(keep)
    shown, view = visible(nodes, keep, marked, expanded, mode=mode, cap=cap)
    pos = layout(nodes, shown)
    hidden = hidden_children(nodes, shown)
    out_nodes, edges = [], []
    for n in sorted((n for n in nodes if n.id in shown), key=lambda n: n.seq):
        x, y = pos[n.id]
        out_nodes.append(
            {
                "id": n.id,
                "generation": n.generation,
                "parents": list(n.parents),
                "x": x,
                "y": y,
                "hidden": hidden.get(n.id, 0),
                **facts.get(n.id, {}),
            }
        )
        edges += [[p, n.id, i] for i, p in enumerate(n.parents) if p in shown]
    return {
        "nodes": out_nodes,
        "edges": edges,
        "view": view,
        "total": len(nodes),
        "shown": len(shown),
        "kept": len(set(keep)),
        "generations": max((n.generation for n in nodes), default=0),
    }
