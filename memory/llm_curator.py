"""LLMCurator: the model sees the new evidence and the related memories, numbered 1..n (real ids
never reach it, so it cannot invent a plausible one), and answers JSON operations. The answer
is checked before anything is written: malformed JSON, an unknown op or number, conflicting
ops on one memory, a missing text, or deleting more than ``max_delete_fraction`` of the shown
memories (or all of them) rejects the *whole* answer. A rejected answer changes nothing in the
store and is recorded in its rejections table (raw output and reason).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from evolve.types import Message

from . import model as M
from .base import NOOP, Evidence, Op, as_evidence
from .curator import apply
from .model import Item

SYSTEM = """You maintain the long-term memory of an agent: lessons, experiences and facts it \
carries from one task to the next. You are shown the memories related to some new evidence, \
numbered [1], [2], ..., and the new evidence. Decide how to update the memory. Operations:
  {"op": "ADD", "text": "...", "kind": "lesson|experience|fact"}   a new memory
  {"op": "MERGE", "ids": [1, 2], "text": "..."}                    combine memories (and evidence) into one text
  {"op": "SUPERSEDE", "id": 3, "text": "...", "reason": "..."}     the evidence contradicts or updates memory 3
  {"op": "DELETE", "id": 4, "reason": "..."}                       memory 4 is wrong or useless
  {"op": "STRENGTHEN", "id": 1}  /  {"op": "WEAKEN", "id": 2}      the evidence confirms / undermines a memory
  {"op": "NOOP"}                                                   nothing to change
Refer to memories only by their numbers. Prefer keeping information: merge or supersede \
rather than delete. Answer with one JSON object and nothing else: {"ops": [...]}"""


class Rejected(ValueError):
    pass


def _extract_json(raw: str) -> Any:
    text = raw.strip()
    fence = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fence:
        text = fence.group(1).strip()
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        raise Rejected("no JSON in the answer")
    try:
        value, _ = json.JSONDecoder().raw_decode(text[min(starts) :])
    except json.JSONDecodeError as e:
        raise Rejected(f"malformed JSON: {e}") from None
    return value


class LLMCurator:
    def __init__(
        self,
        llm: Any,
        *,
        k: int = 5,
        max_delete_fraction: float = 0.5,
        temperature: float | None = 0.0,
        max_tokens: int | None = 1024,
        seed: int | None = None,
    ) -> None:
        self.llm = llm
        self.k = int(k)
        self.max_delete_fraction = float(max_delete_fraction)
        self.temperature, self.max_tokens, self.seed = temperature, max_tokens, seed
        self.last_raw: str | None = None
        self.last_rejection: str | None = None

    # ------------------------------------------------------------------ prompt

    def related(self, store: Any, evidence: Sequence[Evidence]) -> list[Item]:
        seen: dict[str, Item] = {}
        for e in evidence:
            if e.about is not None:
                it = store.get(e.about)
                if it is not None and it.active:
                    seen.setdefault(it.id, it)
            for ref in (e.supersedes,):
                it = store.get(ref) if ref else None
                if it is not None and it.active:
                    seen.setdefault(it.id, it)
            if e.text.strip():
                for h in store.search(e.text, self.k):
                    seen.setdefault(h.id, h.item)
        return list(seen.values())

    def messages(self, shown: Sequence[Item], evidence: Sequence[Evidence]) -> list[Message]:
        lines = ["Existing memories:"]
        lines += [
            f"[{n}] ({it.kind}, strength {it.strength:g}, used {it.uses}x) {it.text}" for n, it in enumerate(shown, 1)
        ] or ["(none)"]
        num = {it.id: n for n, it in enumerate(shown, 1)}
        lines.append("\nNew evidence:")
        for e in evidence:
            if e.about is not None and e.about in num:
                lines.append(
                    f"- memory [{num[e.about]}] was {'helpful' if e.helpful else 'not helpful'} in a task"
                    + (f": {e.text}" if e.text else "")
                )
            else:
                note = f" (replaces memory [{num[e.supersedes]}])" if e.supersedes in num else ""
                lines.append(f"- ({e.kind}){note} {e.text}")
        return [Message(role="system", content=SYSTEM), Message(role="user", content="\n".join(lines))]

    # ------------------------------------------------------------------ checking the answer

    def parse(self, raw: str, shown: Sequence[Item], evidence: Sequence[Evidence]) -> list[Op]:
        """The ops in ``raw``, mapped to real ids; raises :class:`Rejected` for a bad answer."""
        value = _extract_json(raw)
        ops_in = value.get("ops", value.get("operations")) if isinstance(value, dict) else value
        if not isinstance(ops_in, list):
            raise Rejected('expected {"ops": [...]}')
        n = len(shown)
        default_kind = evidence[0].kind if evidence else "lesson"

        def ref(x: Any) -> str:
            if isinstance(x, bool) or not (isinstance(x, int) or (isinstance(x, str) and x.strip().isdigit())):
                raise Rejected(f"memory reference {x!r} is not a number from 1 to {n}")
            i = int(x)
            if not 1 <= i <= n:
                raise Rejected(f"unknown memory [{i}] (only 1..{n} were shown)")
            return shown[i - 1].id

        def text_of(d: dict) -> str:
            t = d.get("text")
            if not isinstance(t, str) or not t.strip():
                raise Rejected(f"{d.get('op')} without a text")
            return t.strip()

        out: list[Op] = []
        retired: set[str] = set()
        for d in ops_in:
            if not isinstance(d, dict) or not isinstance(d.get("op"), str):
                raise Rejected(f"not an operation: {d!r}"[:200])
            name = d["op"].strip().upper()
            if name not in (M.ADD, M.MERGE, M.SUPERSEDE, M.DELETE, M.STRENGTHEN, M.WEAKEN, NOOP):
                raise Rejected(f"unknown op {d['op']!r}")
            kind = d.get("kind") or None
            if kind is not None and kind not in M.KINDS:
                raise Rejected(f"unknown kind {kind!r}")
            if name == NOOP:
                continue
            if name == M.ADD:
                out.append(Op.add(text_of(d), kind or default_kind))
                continue
            if name == M.MERGE:
                ids = d.get("ids")
                if not isinstance(ids, list) or not ids:
                    raise Rejected("MERGE needs a non-empty list of ids")
                targets = [ref(x) for x in ids]
                if len(set(targets)) != len(targets):
                    raise Rejected("MERGE names a memory twice")
                op = Op.merge(targets, text_of(d), kind)
            else:
                targets = [ref(d.get("id"))]
                if name == M.SUPERSEDE:
                    op = Op.supersede(
                        targets[0], text_of(d), str(d.get("reason") or "superseded by LLM decision"), kind
                    )
                elif name == M.DELETE:
                    op = Op.delete(targets[0], str(d.get("reason") or "deleted by LLM decision"))
                else:
                    op = Op(name, id=targets[0], reason="LLM decision")
            if name in (M.MERGE, M.SUPERSEDE, M.DELETE):
                clash = retired.intersection(targets)
                if clash:
                    raise Rejected(f"conflicting ops on memory {sorted(clash)}")
                retired.update(targets)
            out.append(op)
        deleted = {o.id for o in out if o.op == M.DELETE}
        allowed = max(1, math.floor(self.max_delete_fraction * n))
        if deleted and ((n >= 2 and len(deleted) >= n) or len(deleted) > allowed):
            raise Rejected(f"would delete {len(deleted)} of the {n} memories shown (at most {allowed} allowed)")
        live = {o.id for o in out if o.op in (M.STRENGTHEN, M.WEAKEN) and o.id is not None}
        if live & retired:
            raise Rejected(f"counts a memory it also retires: {sorted(live & retired)}")
        return out

    # ------------------------------------------------------------------ the curator

    def decide(self, store: Any, evidence: Sequence[Any]) -> list[Op]:
        evidence = [as_evidence(x) for x in evidence]
        shown = self.related(store, evidence)
        msgs = self.messages(shown, evidence)
        raw = self.llm.complete(msgs, temperature=self.temperature, max_tokens=self.max_tokens, seed=self.seed).text
        self.last_raw, self.last_rejection = raw, None
        try:
            return self.parse(raw, shown, evidence)
        except Rejected as e:
            self.last_rejection = str(e)
            store.record_rejection(
                "LLMCurator",
                str(e),
                raw,
                {
                    "shown": {str(n): it.id for n, it in enumerate(shown, 1)},
                    "evidence": [
                        {"text": x.text, "kind": x.kind, "about": x.about, "supersedes": x.supersedes} for x in evidence
                    ],
                },
            )
            return []

    def update(self, store: Any, evidence: Sequence[Any]) -> list[str | None]:
        """decide + apply."""
        return apply(store, self.decide(store, evidence), source="LLMCurator")
