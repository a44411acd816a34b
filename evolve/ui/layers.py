"""What a system holds in each layer beyond its prompts, as the dashboard shows it: its memory
(the items at the version it reads, and what changed since its parent's), its tool library
(code, tests, use counts, and the sandbox's verdicts on every tool the run proposed) and its
workflow graph (positions from :func:`evolve.topology.render.drawing`).

Each layer answers through :data:`evolve.registry.views` (the memory store opened read-only)."""

from __future__ import annotations

import json
from typing import Any

from evolve.ui.run import RunView
from evolve.ui.system import resolve

MAX_ITEMS = 2000


def memory(run: RunView, ref: str) -> dict[str, Any]:
    """The items of the system's memory at its version (active and retired, with their history
    links), the events since its parent's version, and the versions the run's systems read."""
    sid = resolve(run, ref)
    return run.cached(("memory", sid), lambda: _memory(run, sid))


def _memory(run: RunView, sid: str) -> dict[str, Any]:
    from evolve.registry import views

    spec = dict(run.archive.get_system(sid).memory or {})
    out: dict[str, Any] = {"system": sid, "spec": spec, "items": [], "changes": [], "versions": _versions(run, sid)}
    if not spec.get("store") or spec.get("version") is None:
        return out
    parents = run.archive.record(sid).parents
    before = dict(run.archive.get_system(parents[0]).memory or {}) if parents else {}
    since = before.get("version") if before.get("store") == spec["store"] else None
    out.update(views.get("memory")(spec, since, limit=MAX_ITEMS))
    if since is not None:
        out["since"] = since
    return out


def _versions(run: RunView, sid: str) -> list[dict[str, Any]]:
    """The memory versions read along the system's lineage (it and its ancestors), oldest first."""
    seen: dict[tuple[str, int], list[str]] = {}
    for a in reversed([sid, *run.archive.ancestors(sid)]):
        m = run.archive.get_system(a).memory or {}
        if m.get("store") and m.get("version") is not None:
            seen.setdefault((m["store"], int(m["version"])), []).append(a)
    return [{"store": s, "version": v, "systems": ids} for (s, v), ids in seen.items()]


def tools(run: RunView, ref: str) -> dict[str, Any]:
    """The system's tool library and the sandbox's verdicts on the tools the run's tool operator proposed."""
    sid = resolve(run, ref)
    lib = run.archive.get_system(sid).tools or {}
    out = []
    for name, t in lib.items():
        t = dict(t) if isinstance(t, dict) else {"value": t}
        out.append({"name": name, **t})
    return {"system": sid, "tools": out, "verdicts": verdicts(run)}


def verdicts(run: RunView) -> list[dict[str, Any]]:
    """Every tool proposal the run's tool operator judged (``work/*/toolforge.json``): admitted,
    rejected (with the sandbox's reason) or a duplicate, with the generation it came in."""
    out = []
    for path in sorted((run.run_dir / "work").glob("*/toolforge.json")):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        where = path.parent.name  # g{gen}-op{i}-{parent}
        gen = where.split("-")[0].lstrip("g")
        for verdict in ("admitted", "rejected", "duplicates", "retired"):
            for e in report.get(verdict) or []:
                out.append(
                    {
                        "verdict": verdict.rstrip("s") if verdict != "duplicates" else "duplicate",
                        "generation": int(gen) if gen.isdigit() else None,
                        "work": where,
                        **e,
                    }
                )
    return out


def workflow(run: RunView, ref: str) -> dict[str, Any]:
    """The system's workflow graph laid out for drawing (None without one), and its other workflow settings."""
    from evolve.registry import views

    sid = resolve(run, ref)
    wf = dict(run.archive.get_system(sid).workflow or {})
    return {
        "system": sid,
        "settings": {k: v for k, v in wf.items() if k != "graph"},
        "graph": views.get("workflow")(wf),
    }
