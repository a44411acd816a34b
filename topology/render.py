"""Pictures of workflow graphs: :func:`render_png` (matplotlib + networkx, no graphviz) and
:func:`render_text` (for terminals and reports).

The picture is layered left to right by the longest path from the entry (loop-closing edges left
out); a vote's chain follows the vote, one column per step. Nodes that call a model are orange, the others blue, unknown types
grey; the entry has a thick border. Edge labels are the ``when`` conditions; edges that go back
(loops) are curved; a vote's chain is drawn as dashed edges labelled with the sample count.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evolve.topology.graph import Workflow, to_text

MODEL_COLOUR = "#f6bd60"
PLAIN_COLOUR = "#a8dadc"
UNKNOWN_COLOUR = "#d9d9d9"
X_GAP, Y_GAP = 3.0, 1.6


def _kinds(wf: Workflow, types: Any) -> dict[str, Any]:
    if types is None:
        from evolve.registry import node_types as types
    out = {}
    for n in wf.nodes:
        try:
            out[n.id] = types.get(n.type) if n.type in types else None
        except Exception:  # noqa: BLE001 - a type that fails to import is drawn as unknown
            out[n.id] = None
    return out


def _chains(wf: Workflow, kinds: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(vote node, chain node, samples) for every node a type runs itself."""
    out = []
    for n in wf.nodes:
        ref_fn = getattr(kinds.get(n.id), "refs", None)
        if ref_fn is None:
            continue
        times_fn = getattr(kinds[n.id], "ref_runs", None)
        times = int(times_fn(n.params)) if times_fn else 1
        out += [(n.id, r, times) for r in ref_fn(n.params) if wf.has(r)]
    return out


def back_edges(wf: Workflow, chains: Sequence[tuple[str, str, int]] = ()) -> set[tuple[str, str]]:
    """Edges that close a loop: (src, dst) pairs found going back up a depth-first search."""
    succ = _successors(wf, chains)
    back: set[tuple[str, str]] = set()
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(u: str) -> None:
        state[u] = 1
        for x in succ.get(u, []):
            if state.get(x) == 1:
                back.add((u, x))
            elif x not in state:
                visit(x)
        state[u] = 2

    for start in [wf.entry] + [n.id for n in wf.nodes]:
        if start in succ and start not in state:
            visit(start)
    return back


def _successors(wf: Workflow, chains: Sequence[tuple[str, str, int]]) -> dict[str, list[str]]:
    succ: dict[str, list[str]] = {n.id: [] for n in wf.nodes}
    for e in wf.edges:
        if e.src in succ and e.dst in succ:
            succ[e.src].append(e.dst)
    prev: dict[str, str] = {}
    for v, r, _ in chains:  # a chain runs in order: vote -> first -> second ...
        succ[prev.get(v, v)].append(r)
        prev[v] = r
    return succ


def layers(wf: Workflow, chains: Sequence[tuple[str, str, int]] = ()) -> dict[str, int]:
    """Column of each node: the longest path from the entry once loop-closing edges are left
    out (so the flow reads left to right); nodes never reached go in a last column."""
    succ = _successors(wf, chains)
    back = back_edges(wf, chains)
    preds: dict[str, list[str]] = {u: [] for u in succ}
    for u, xs in succ.items():
        for x in xs:
            if (u, x) not in back:
                preds[x].append(u)
    depth: dict[str, int] = {}
    reached: set[str] = set()
    stack = [wf.entry] if wf.entry in succ else []
    while stack:
        u = stack.pop()
        if u not in reached:
            reached.add(u)
            stack += succ[u]

    def d(u: str) -> int:
        if u not in depth:
            depth[u] = 0  # guards recursion; the DAG has no cycles left
            depth[u] = max((d(p) + 1 for p in preds[u] if p in reached), default=0)
        return depth[u]

    for u in reached:
        d(u)
    last = max(depth.values(), default=-1) + 1
    return {n.id: depth.get(n.id, last) if n.id in reached else last for n in wf.nodes}


def positions(depth: dict[str, int], order: list[str]) -> dict[str, tuple[float, float]]:
    cols: dict[int, list[str]] = {}
    for nid in order:
        cols.setdefault(depth[nid], []).append(nid)
    pos = {}
    for col, ids in cols.items():
        for i, nid in enumerate(ids):
            pos[nid] = (col * X_GAP, ((len(ids) - 1) / 2 - i) * Y_GAP)
    return pos


def _geometry(
    wf: Workflow, types: Any
) -> tuple[
    dict[str, Any], list[tuple[str, str, int]], dict[str, int], set[tuple[str, str]], dict[str, tuple[float, float]]
]:
    """Node kinds, vote chains, columns, loop-closing edges and positions of a drawing of ``wf``."""
    kinds = _kinds(wf, types)
    chains = _chains(wf, kinds)
    depth = layers(wf, chains)
    return kinds, chains, depth, back_edges(wf, chains), positions(depth, [n.id for n in wf.nodes])


def drawing(wf: Workflow, types: Any = None) -> dict[str, Any]:
    """The picture as data, for drawing elsewhere (the dashboard draws it as SVG): nodes with their
    position (``x`` columns left to right, ``y`` up) and whether they call a model (None: unknown
    type), edges with their condition and whether they close a loop, vote chains."""
    kinds, chains, _, back, pos = _geometry(wf, types)
    nodes = [
        {
            "id": n.id,
            "type": n.type,
            "x": pos[n.id][0],
            "y": pos[n.id][1],
            "max_visits": n.max_visits,
            "params": n.params,
            "entry": n.id == wf.entry,
            "model": None if kinds.get(n.id) is None else bool(getattr(kinds[n.id], "calls_model", False)),
        }
        for n in wf.nodes
    ]
    edges = [{"src": e.src, "dst": e.dst, "when": e.when, "back": (e.src, e.dst) in back} for e in wf.edges]
    return {
        "id": wf.id,
        "entry": wf.entry,
        "output": wf.output,
        "nodes": nodes,
        "edges": edges,
        "chains": [{"vote": v, "node": r, "samples": k} for v, r, k in chains],
    }


def drawing_of(workflow: Any) -> dict[str, Any] | None:
    """:func:`drawing` of a system's workflow graph (``workflow["graph"]``), or None without one."""
    from evolve.topology.graph import graph_of

    graph = graph_of(workflow)
    return None if graph is None else drawing(graph)


def render_png(wf: Workflow, path: str | Path, title: str = "", types: Any = None) -> Path:
    """Draw ``wf`` to a PNG at ``path``; return the path."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.patches import Arc, FancyArrowPatch
    except ImportError as exc:  # pragma: no cover - matplotlib comes with the local extra
        from evolve.errors import MissingDependency

        raise MissingDependency(
            f"drawing a workflow needs matplotlib ({exc}); pip install 'evolvekit[local]'"
        ) from None

    path = Path(path)
    kinds, chains, depth, back, pos = _geometry(wf, types)
    xs = [p[0] for p in pos.values()] or [0.0]
    ys = [p[1] for p in pos.values()] or [0.0]
    xr, yr = max(xs) - min(xs) + 3.2, max(ys) - min(ys) + 3.0
    scale = 0.8  # inches per unit; the axes keep roughly equal aspect so arcs and labels line up
    fig = Figure(figsize=(max(5.0, xr * scale), max(3.2, yr * scale + 0.8)), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(111)
    ax.set_axis_off()
    ax.set_xlim(min(xs) - 1.6, max(xs) + 1.6)
    ax.set_ylim(min(ys) - 1.5, max(ys) + 1.5)

    def arrow(a: str, b: str, rad: float, label: str | None, dashed: bool = False, colour: str = "#333333") -> None:
        (x1, y1), (x2, y2) = pos[a], pos[b]
        if a == b:  # a self-loop: an arc above the node
            ax.add_patch(Arc((x1, y1 + 0.45), 0.9, 0.7, theta1=-20, theta2=200, color=colour, lw=1.2))
            if label:
                ax.text(x1, y1 + 0.9, label, ha="center", va="bottom", fontsize=7, color="#7a1f1f")
            return
        ax.add_patch(
            FancyArrowPatch(
                (x1, y1),
                (x2, y2),
                connectionstyle=f"arc3,rad={rad}",
                arrowstyle="-|>",
                mutation_scale=12,
                lw=1.2,
                color=colour,
                shrinkA=28,
                shrinkB=28,
                linestyle="--" if dashed else "-",
                zorder=1,
            )
        )
        if label:
            mx, my = (x1 + x2) / 2 + rad * (y2 - y1) / 2, (y1 + y2) / 2 - rad * (x2 - x1) / 2
            ax.text(
                mx,
                my,
                label,
                ha="center",
                va="center",
                fontsize=7,
                color="#7a1f1f",
                zorder=3,
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85},
            )

    seen_pairs: dict[tuple[str, str], int] = {}
    for e in wf.edges:
        if e.src not in pos or e.dst not in pos:
            continue
        k = seen_pairs[(e.src, e.dst)] = seen_pairs.get((e.src, e.dst), -1) + 1
        same_row = abs(pos[e.src][1] - pos[e.dst][1]) < 1e-9
        skips = same_row and abs(depth[e.dst] - depth[e.src]) > 1  # would cross the nodes between
        rad = (0.45 if (e.src, e.dst) in back else 0.3 if skips else 0.0) + 0.2 * k
        arrow(e.src, e.dst, rad, e.when)
    prev: dict[str, str] = {}
    for v, r, times in chains:  # vote -> first of its chain -> next ... (dashed)
        a = prev.get(v, v)
        arrow(a, r, -0.2 if a == v else 0.0, f"x{times}" if a == v else None, dashed=True, colour="#6c757d")
        prev[v] = r

    for n in wf.nodes:
        kind = kinds.get(n.id)
        colour = (
            UNKNOWN_COLOUR if kind is None else MODEL_COLOUR if getattr(kind, "calls_model", False) else PLAIN_COLOUR
        )
        label = f"{n.id}\n{n.type}" + (f" (x{n.max_visits})" if n.max_visits else "")
        ax.text(
            *pos[n.id],
            label,
            ha="center",
            va="center",
            fontsize=8,
            zorder=4,
            bbox={"boxstyle": "round,pad=0.4", "fc": colour, "ec": "black", "lw": 2.2 if n.id == wf.entry else 0.8},
        )
    handles = [
        Line2D([], [], marker="s", ls="", ms=9, mfc=MODEL_COLOUR, mec="black", label="calls a model"),
        Line2D([], [], marker="s", ls="", ms=9, mfc=PLAIN_COLOUR, mec="black", label="no model call"),
    ]
    if chains:
        handles.append(Line2D([], [], ls="--", color="#6c757d", label="vote chain (samples)"))
    ax.legend(handles=handles, loc="lower left", fontsize=7, frameon=False)
    head = title or f"workflow {wf.id[:8]}"
    ax.set_title(f"{head}\nentry {wf.entry}, returns {wf.output!r}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def render_text(wf: Workflow, types: Any = None) -> str:
    """:func:`~evolve.topology.graph.to_text` plus the model-call bound of one execution."""
    from evolve.topology.runtime import calls_upper_bound

    text = to_text(wf)
    try:
        bound = calls_upper_bound(wf, types)
    except Exception:  # noqa: BLE001 - an unknown type: the text alone still helps
        return text
    return text + f"\n  model calls per execution: {'unbounded' if bound is None else f'at most {bound}'}"


__all__ = ["back_edges", "drawing", "drawing_of", "layers", "positions", "render_png", "render_text"]
