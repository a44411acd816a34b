"""What a memory curator is: the :class:`Curator` protocol (what to add, merge, strengthen, weaken,
supersede or delete, given new evidence) and the types it speaks — an :class:`Op` (one decision about
the store) and :class:`Evidence` (what a task taught).

The curators beside it implement it: :class:`~evolve.memory.curator.HeuristicCurator` (no model) and
:class:`~evolve.memory.llm_curator.LLMCurator` (asks an LLM, checks its answer);
:func:`~evolve.memory.curator.apply` writes a curator's ops to a store in one transaction.
(``Policy``, this protocol's old name, still resolves here, with a DeprecationWarning.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import model as M

NOOP = "NOOP"
OP_NAMES = (M.ADD, M.MERGE, M.SUPERSEDE, M.DELETE, M.STRENGTHEN, M.WEAKEN, NOOP)


@dataclass(frozen=True)
class Op:
    """One decision: ADD(text) / MERGE(ids, text) / SUPERSEDE(id, text) / DELETE(id, reason) /
    STRENGTHEN(id, by) / WEAKEN(id, by) / NOOP."""

    op: str
    text: str | None = None
    kind: str | None = None
    ids: tuple[str, ...] = ()  # MERGE: the sources
    id: str | None = None  # SUPERSEDE: the old item; DELETE / STRENGTHEN / WEAKEN: the target
    reason: str | None = None
    metadata: Mapping[str, Any] | None = None
    by: float = 1.0

    @classmethod
    def add(cls, text: str, kind: str = "lesson", metadata: Mapping[str, Any] | None = None) -> Op:
        return cls(M.ADD, text=text, kind=kind, metadata=metadata)

    @classmethod
    def merge(cls, ids: Sequence[str], text: str, kind: str | None = None) -> Op:
        return cls(M.MERGE, text=text, kind=kind, ids=tuple(ids))

    @classmethod
    def supersede(cls, old: str, text: str, reason: str | None = None, kind: str | None = None) -> Op:
        return cls(M.SUPERSEDE, text=text, id=old, reason=reason, kind=kind)

    @classmethod
    def delete(cls, item: str, reason: str) -> Op:
        return cls(M.DELETE, id=item, reason=reason)

    @classmethod
    def strengthen(cls, item: str, by: float = 1.0, reason: str | None = None) -> Op:
        return cls(M.STRENGTHEN, id=item, by=by, reason=reason)

    @classmethod
    def weaken(cls, item: str, by: float = 1.0, reason: str | None = None) -> Op:
        return cls(M.WEAKEN, id=item, by=by, reason=reason)

    @classmethod
    def noop(cls) -> Op:
        return cls(NOOP)


@dataclass(frozen=True)
class Evidence:
    """What a task taught. Either a candidate memory (``text``, ``kind``, ``metadata``; with
    ``supersedes`` naming the item it explicitly replaces, e.g. a contradicted fact), or feedback
    on an existing item (``about`` an item id, ``helpful`` True / False)."""

    text: str = ""
    kind: str = "lesson"
    metadata: Mapping[str, Any] = field(default_factory=dict)
    supersedes: str | None = None
    about: str | None = None
    helpful: bool | None = None
    reason: str | None = None


def as_evidence(x: Any) -> Evidence:
    """Evidence from an Evidence, a str, a dict, or anything item-like (``.text``, ``.kind``, ...)."""
    if isinstance(x, Evidence):
        return x
    if isinstance(x, str):
        return Evidence(text=x)
    if not isinstance(x, Mapping):
        x = getattr(x, "item", x)  # a search Hit: its item
    get = x.get if isinstance(x, Mapping) else (lambda k, d=None: getattr(x, k, d))
    return Evidence(
        text=get("text", "") or "",
        kind=get("kind", "lesson") or "lesson",
        metadata=dict(get("metadata", None) or {}),
        supersedes=get("supersedes", None),
        about=get("about", None),
        helpful=get("helpful", None),
        reason=get("reason", None),
    )


class Curator(Protocol):
    def decide(self, store: Any, evidence: Sequence[Any]) -> list[Op]: ...


def __getattr__(name: str) -> Any:
    if name == "Policy":  # the protocol's name until the curators were named for what they do
        import warnings

        warnings.warn(
            "evolve.memory.base.Policy is deprecated: it is evolve.memory.base.Curator",
            DeprecationWarning,
            stacklevel=2,
        )
        return Curator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
