"""The data model of the memory store: items, events, and the fold that turns an event log into
the set of items. Pure Python, no SQLite and no embeddings: everything here is testable alone.

The log is the truth. Each event has a sequence number ``seq`` (1, 2, 3, ...) that is also the
store's *version* after it. The state at version ``k`` is ``fold(events with seq <= k)``.
An item's text, kind and metadata never change after it is created; every other field
(status, strength, uses, links, reason) changes only through events. Nothing is ever removed
from the fold: deleted, merged and superseded items stay in it with an inactive status.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

KINDS = ("experience", "lesson", "fact")

# statuses
ACTIVE, MERGED, SUPERSEDED, DELETED = "active", "merged", "superseded", "deleted"
STATUSES = (ACTIVE, MERGED, SUPERSEDED, DELETED)

# event ops
ADD, MERGE, SUPERSEDE, DELETE, RESTORE = "ADD", "MERGE", "SUPERSEDE", "DELETE", "RESTORE"
USE, STRENGTHEN, WEAKEN = "USE", "STRENGTHEN", "WEAKEN"
CREATING = (ADD, MERGE, SUPERSEDE)  # ops that create a new item (with a new vector)
OPS = (ADD, MERGE, SUPERSEDE, DELETE, RESTORE, USE, STRENGTHEN, WEAKEN)

MUTABLE = ("status", "strength", "uses", "links", "reason")  # what events may change on an item


class LogError(ValueError):
    """An event that does not fit the state it is applied to (unknown id, wrong status, ...)."""


_SPACE = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """What "the same text" means for duplicate detection: NFKC, case-folded, whitespace
    collapsed, surrounding whitespace and trailing sentence punctuation dropped."""
    t = unicodedata.normalize("NFKC", text).casefold()
    t = _SPACE.sub(" ", t).strip()
    return t.rstrip(" .!;")


def text_hash(kind: str, text: str) -> str:
    """The duplicate key: same kind and same normalised text give the same hash."""
    return hashlib.sha256(f"{kind}\x00{normalize_text(text)}".encode()).hexdigest()[:32]


def item_id(seq: int) -> str:
    """Items are named after the event that created them: the ADD at seq 17 makes ``m17``."""
    return f"m{seq}"


@dataclass(frozen=True)
class Item:
    id: str
    kind: str
    text: str
    hash: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    status: str = ACTIVE
    created: int = 0  # version (seq) of the event that created it
    updated: int = 0  # version of the last event that touched it
    strength: float = 1.0  # ExpeL-style importance: STRENGTHEN +, WEAKEN -
    uses: int = 0  # how many times it was retrieved and used (USE events)
    links: Mapping[str, Any] = field(default_factory=dict)  # merged_from, merged_into, supersedes, superseded_by
    reason: str | None = None  # why it is inactive (DELETE / SUPERSEDE reason)

    @property
    def active(self) -> bool:
        return self.status == ACTIVE

    def state(self) -> dict[str, Any]:
        """Everything but ``updated``: two views are "the same" when their items' states are."""
        d = dataclasses.asdict(self)
        d.pop("updated")
        d["metadata"], d["links"] = dict(self.metadata), dict(self.links)
        return d

    def to_dict(self) -> dict[str, Any]:
        d = self.state()
        d["updated"] = self.updated
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Item:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


@dataclass(frozen=True)
class Event:
    seq: int
    op: str
    item: str | None  # the item it creates or acts on
    data: Mapping[str, Any] = field(default_factory=dict)
    ts: float = 0.0

    def touched(self) -> list[str]:
        """Every item id this event changes (the created one first)."""
        ids = [self.item] if self.item else []
        if self.op == MERGE:
            ids += list(self.data["sources"])
        elif self.op == SUPERSEDE:
            ids.append(self.data["old"])
        return ids


def _need(items: Mapping[str, Item], iid: str | None, ev: Event, statuses: Iterable[str] | None = (ACTIVE,)) -> Item:
    it = items.get(iid) if iid is not None else None
    if it is None:
        raise LogError(f"{ev.op} at {ev.seq}: unknown item {iid!r}")
    if statuses is not None and it.status not in statuses:
        raise LogError(f"{ev.op} at {ev.seq}: item {iid} is {it.status}, expected {'/'.join(statuses)}")
    return it


def _new(ev: Event, **extra: Any) -> Item:
    d = ev.data
    if d.get("kind") not in KINDS:
        raise LogError(f"{ev.op} at {ev.seq}: kind must be one of {KINDS}, got {d.get('kind')!r}")
    if not str(d.get("text", "")).strip():
        raise LogError(f"{ev.op} at {ev.seq}: empty text")
    assert ev.item, "apply_event checks that a creating event names its new item"
    return Item(
        id=ev.item,
        kind=d["kind"],
        text=d["text"],
        hash=d["hash"],
        metadata=dict(d.get("metadata") or {}),
        created=ev.seq,
        updated=ev.seq,
        **extra,
    )


def apply_event(items: dict[str, Item], ev: Event) -> list[str]:
    """Apply one event to ``items`` (id -> Item, all statuses) in place; return the ids it changed.
    Raises :class:`LogError` (and changes nothing) when the event does not fit the state."""
    d, s = ev.data, ev.seq
    upd: dict[str, Item] = {}
    if ev.op in CREATING and (not ev.item or ev.item in items):
        raise LogError(f"{ev.op} at {s}: item id {ev.item!r} is missing or already exists")
    new = ev.item or ""  # the id a creating op gives its item (checked just above)
    if ev.op == ADD:
        upd[new] = _new(ev, strength=float(d.get("strength", 1.0)))
    elif ev.op == MERGE:
        srcs = [_need(items, i, ev) for i in d["sources"]]
        if not srcs or len(set(d["sources"])) != len(srcs):
            raise LogError(f"MERGE at {s}: needs one or more distinct sources")
        upd[new] = _new(
            ev,
            strength=max(1.0, sum(x.strength for x in srcs)),
            uses=sum(x.uses for x in srcs),
            links={"merged_from": list(d["sources"])},
        )
        for x in srcs:
            upd[x.id] = dataclasses.replace(x, status=MERGED, updated=s, links={**x.links, "merged_into": ev.item})
    elif ev.op == SUPERSEDE:
        old = _need(items, d["old"], ev)
        upd[new] = _new(ev, links={"supersedes": old.id})
        upd[old.id] = dataclasses.replace(
            old, status=SUPERSEDED, updated=s, reason=d.get("reason"), links={**old.links, "superseded_by": ev.item}
        )
    elif ev.op == DELETE:
        it = _need(items, ev.item, ev)
        upd[it.id] = dataclasses.replace(it, status=DELETED, updated=s, reason=d.get("reason") or "deleted")
    elif ev.op == RESTORE:
        state = d.get("state")
        if state is not None:  # set the mutable fields exactly (used by store.restore(version))
            it = _need(items, ev.item, ev, statuses=None)
            fields = {k: state[k] for k in MUTABLE}
            if fields["status"] not in STATUSES:
                raise LogError(f"RESTORE at {s}: bad status {fields['status']!r}")
            upd[it.id] = dataclasses.replace(it, updated=s, **fields)
        else:  # undo a delete / merge / supersede of this item: it is active again
            it = _need(items, ev.item, ev, statuses=(DELETED, MERGED, SUPERSEDED))
            links = {k: v for k, v in it.links.items() if k not in ("merged_into", "superseded_by")}
            upd[it.id] = dataclasses.replace(it, status=ACTIVE, updated=s, reason=None, links=links)
    elif ev.op in (USE, STRENGTHEN, WEAKEN):
        it = _need(items, ev.item, ev)
        if ev.op == USE:
            upd[it.id] = dataclasses.replace(it, uses=it.uses + int(d.get("n", 1)), updated=s)
        else:
            by = float(d.get("by", 1.0))
            by = by if ev.op == STRENGTHEN else -by
            upd[it.id] = dataclasses.replace(it, strength=it.strength + by, updated=s)
    else:
        raise LogError(f"unknown op {ev.op!r} at {s}")
    items.update(upd)
    return list(upd)


def fold(events: Iterable[Event], *, active_only: bool = True) -> dict[str, Item]:
    """The view a log gives: fold the events in order from an empty store. By default only the
    active items; ``active_only=False`` keeps deleted / merged / superseded ones too."""
    items: dict[str, Item] = {}
    last = 0
    for ev in events:
        if ev.seq <= last:
            raise LogError(f"events out of order: {ev.seq} after {last}")
        last = ev.seq
        apply_event(items, ev)
    return {k: v for k, v in items.items() if v.active} if active_only else items


def same_view(a: Mapping[str, Item], b: Mapping[str, Item]) -> bool:
    """Two views hold the same items in the same state (versions stamps aside)."""
    return a.keys() == b.keys() and all(a[k].state() == b[k].state() for k in a)
