"""Curators: given new evidence (lessons, experiences, facts, or feedback on items that
were used), decide which operations to apply to a store. Pure decisions; :func:`apply` writes
them, all in one transaction (all ops or none). The protocol and its types (Op, Evidence) are in
:mod:`.base`.

    ops = curator.decide(store, evidence)  # -> list[Op]
    apply(store, ops)                      # -> ids, one per op (None for NOOP)

:class:`HeuristicCurator` needs no model (ExpeL-style counters and similarity thresholds);
:class:`~evolve.memory.llm_curator.LLMCurator` asks an LLM and checks what it answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import model as M
from .base import NOOP, OP_NAMES, Curator, Evidence, Op, as_evidence  # noqa: F401 - the curators' shared types
from .model import LogError, text_hash


def apply(store: Any, ops: Sequence[Op], *, source: str = "apply") -> list[str | None]:
    """Apply ``ops`` to ``store`` in one transaction. An op that does not fit the store (an
    unknown or inactive id, ...) rolls the whole set back, is recorded in the store's
    rejections, and raises :class:`~evolve.memory.model.LogError`."""
    b = store.batch()
    slots: list[int | None] = []
    for op in ops:
        if op.op == NOOP:
            slots.append(None)
        elif op.op == M.ADD:
            slots.append(b.add(op.text or "", op.kind or "lesson", op.metadata))
        elif op.op == M.MERGE:
            slots.append(b.merge(list(op.ids), op.text or "", op.kind, op.metadata))
        elif op.op == M.SUPERSEDE:
            slots.append(b.supersede(op.id, op.text or "", op.kind, op.metadata, op.reason))
        elif op.op == M.DELETE:
            slots.append(b.delete(op.id, op.reason or "deleted by curator"))
        elif op.op == M.STRENGTHEN:
            slots.append(b.strengthen(op.id, op.by, op.reason))
        elif op.op == M.WEAKEN:
            slots.append(b.weaken(op.id, op.by, op.reason))
        else:
            raise ValueError(f"unknown op {op.op!r}")
    try:
        results = b.commit()
    except (LogError, ValueError) as e:
        store.record_rejection(source, f"apply failed: {e}", None, {"ops": [_op_json(o) for o in ops]})
        raise
    return [None if s is None else results[s] for s in slots]


def _op_json(op: Op) -> dict[str, Any]:
    d = {"op": op.op, "text": op.text, "kind": op.kind, "ids": list(op.ids), "id": op.id, "reason": op.reason}
    return {k: v for k, v in d.items() if v not in (None, [])}


class HeuristicCurator:
    """ExpeL-style updates without a model.

    * feedback on an item (``about``, ``helpful``): the evidence about one item in one decision
      is netted into one STRENGTHEN or one WEAKEN. An item is DELETEd only when its strength is
      at or below 0 *and* it has been weakened in at least ``min_weakens`` decisions: one bad
      decision never removes a memory.
    * an explicit ``supersedes`` -> SUPERSEDE (the only way this curator retires a memory for a
      contradiction; similarity alone never does).
    * a candidate memory: an exact duplicate -> STRENGTHEN it (rediscovered); else the most
      similar active item of the same kind: cosine >= ``same`` -> STRENGTHEN it; >= ``similar``
      -> MERGE it with the new text (the longer text is kept as the merged text; the source
      stays recoverable); otherwise ADD.
    """

    def __init__(self, *, same: float = 0.95, similar: float = 0.85, min_weakens: int = 2) -> None:
        if not 0 < similar <= same <= 1:
            raise ValueError("need 0 < similar <= same <= 1")
        self.same, self.similar, self.min_weakens = same, similar, int(min_weakens)

    def decide(self, store: Any, evidence: Sequence[Any]) -> list[Op]:
        ops: list[Op] = []
        net: dict[str, int] = {}
        consumed: set[str] = set()
        for e in map(as_evidence, evidence):
            if e.about is not None:
                if e.helpful is not None:
                    net[e.about] = net.get(e.about, 0) + (1 if e.helpful else -1)
                continue
            if e.supersedes is not None:
                if e.supersedes not in consumed:
                    consumed.add(e.supersedes)
                    ops.append(Op.supersede(e.supersedes, e.text, e.reason or "contradicted by new evidence", e.kind))
                continue
            if not e.text.strip():
                continue
            dup = store.log.find_active(e.kind, text_hash(e.kind, e.text))
            if dup is not None:
                net[dup] = net.get(dup, 0) + 1
                continue
            hits = store.search(e.text, 3, kinds=[e.kind], alpha=1.0)
            best = next((h for h in hits if h.id not in consumed), None)
            if best is not None and best.similarity >= self.same:
                net[best.id] = net.get(best.id, 0) + 1
            elif best is not None and best.similarity >= self.similar:
                consumed.add(best.id)
                text = e.text if len(e.text) > len(best.text) else best.text
                ops.append(Op.merge([best.id], text, e.kind))
            else:
                ops.append(Op(M.ADD, text=e.text, kind=e.kind, metadata=dict(e.metadata)))
        counts: list[Op] = []  # applied first, so that a MERGE in the same decision carries them
        for iid, delta in net.items():
            it = store.get(iid)
            if delta == 0 or it is None or not it.active:
                continue
            if delta > 0:
                counts.append(Op.strengthen(iid, delta, "helpful / rediscovered"))
                continue
            counts.append(Op.weaken(iid, -delta, "unhelpful"))
            weakens = store.log.count_ops(iid, M.WEAKEN) + 1
            if it.strength + delta <= 0 and weakens >= self.min_weakens and iid not in consumed:
                counts.append(Op.delete(iid, f"strength {it.strength + delta:g} after {weakens} weakening decisions"))
        return counts + ops
