"""Batched writes: intents collected by :class:`Batch` and committed by the store in one
transaction (all of them or none)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import model as M

if TYPE_CHECKING:
    from typing import Self


@dataclass
class Intent:
    op: str
    item: str | None = None
    text: str | None = None
    kind: str | None = None
    metadata: Mapping[str, Any] | None = None
    data: dict[str, Any] = field(default_factory=dict)


class Batch:
    """Writes collected and committed together: all of them or none (``with store.batch() as b``).
    Each method returns the position of its result in ``b.results`` (filled on commit)."""

    def __init__(self, commit: Callable[[list[Intent]], list[str | None]]) -> None:
        """``commit``: the store's own, carrying out the intents in one transaction."""
        self._commit = commit
        self.intents: list[Intent] = []
        self.results: list[str | None] = []

    def _push(self, intent: Intent) -> int:
        self.intents.append(intent)
        return len(self.intents) - 1

    def add(
        self,
        text: str,
        kind: str = "lesson",
        metadata: Mapping[str, Any] | None = None,
        *,
        strength: float = 1.0,
        on_duplicate: str = "noop",
    ) -> int:
        if on_duplicate not in ("noop", "strengthen"):
            raise ValueError("on_duplicate is 'noop' or 'strengthen'")
        return self._push(
            Intent(
                M.ADD,
                text=text,
                kind=kind,
                metadata=metadata,
                data={"strength": float(strength), "on_duplicate": on_duplicate},
            )
        )

    def merge(
        self, ids: Sequence[str], text: str, kind: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> int:
        return self._push(Intent(M.MERGE, text=text, kind=kind, metadata=metadata, data={"sources": list(ids)}))

    def supersede(
        self,
        old: str,
        text: str,
        kind: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> int:
        return self._push(
            Intent(
                M.SUPERSEDE,
                text=text,
                kind=kind,
                metadata=metadata,
                data={"old": old, "reason": reason or "superseded"},
            )
        )

    def delete(self, item: str, reason: str) -> int:
        if not reason:
            raise ValueError("a DELETE needs a reason")
        return self._push(Intent(M.DELETE, item=item, data={"reason": str(reason)}))

    def undelete(self, item: str) -> int:
        return self._push(Intent(M.RESTORE, item=item))

    def use(self, item: str, n: int = 1) -> int:
        return self._push(Intent(M.USE, item=item, data={"n": int(n)}))

    def strengthen(self, item: str, by: float = 1.0, reason: str | None = None) -> int:
        return self._push(Intent(M.STRENGTHEN, item=item, data={"by": float(by), "reason": reason}))

    def weaken(self, item: str, by: float = 1.0, reason: str | None = None) -> int:
        return self._push(Intent(M.WEAKEN, item=item, data={"by": float(by), "reason": reason}))

    def commit(self) -> list[str | None]:
        self.results = self._commit(self.intents)
        self.intents = []
        return self.results

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, *_: object) -> None:
        if exc_type is None:
            self.commit()
