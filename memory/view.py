"""What a memory version holds, for readers outside the loop (the dashboard): the items at that
version (retired ones too, with their links and why), and the events since an earlier version.
The store is opened read-only; nothing is embedded or indexed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .log import EventLog
from .model import fold


def memory_view(spec: Mapping[str, Any], since: int | None = None, *, limit: int = 2000) -> dict[str, Any]:
    """``spec`` is a system's ``memory`` (``store`` folder, ``version``). Returns ``items`` (each as
    :meth:`~evolve.memory.model.Item.to_dict`, active first, newest first), ``active`` (how many),
    ``changes`` (the events after ``since``, when given) or ``missing`` (the store is not here)."""
    store, version = spec.get("store"), spec.get("version")
    if not store or version is None:
        return {"items": [], "changes": []}
    db = Path(store) / "memory.db"
    if not db.is_file():
        return {"items": [], "changes": [], "missing": f"the memory store {store} is not on this machine"}
    log = EventLog(db, readonly=True, leave_no_files=True)  # the dashboard leaves no file
    try:
        events = list(log.events(upto=int(version)))
    finally:
        log.close()
    items = fold(events, active_only=False)
    out: dict[str, Any] = {
        "items": sorted(
            (it.to_dict() for it in items.values()), key=lambda d: (d["status"] != "active", -d["created"])
        )[:limit],
        "active": sum(1 for it in items.values() if it.active),
        "changes": [],
    }
    if since is not None:
        out["changes"] = [
            {"seq": e.seq, "op": e.op, "item": e.item, "data": dict(e.data)} for e in events if e.seq > int(since)
        ][:limit]
    return out
