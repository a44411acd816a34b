"""A copy mechanism in the tokenizer: rare words become pointers to their first occurrence.

A character-level model from scratch must learn to copy a name from its prompt one character
at a time, which a tiny model does not learn in CPU-minutes (measured: 0% on held-out schemas
after 1,200 SFT steps, with or without name augmentation and copy pre-training). Copy
mechanisms are the classic answer (pointer networks, CopyNet, the copy attention of early
text-to-SQL models). Here it lives in the tokenizer, so the model stays a stock Llama:

* words of the *vocabulary* (``keep``: the words frequent in the cold-start demos — SQL
  keywords, the question's function words) are spelled in characters as before;
* every other word is replaced by a pointer token ``<p k>``: the k-th distinct rare word of
  the conversation, counted from its start. The model writes ``<p 3>`` to mean "the third
  name in the chat", and decoding maps it back to that name.

The model still has to learn *which* name goes where (the question's wording decides), but
copying it is one token. Held-out names are no easier than training names: both are pointers.
Pointers are numbered per conversation, so ``encode``/``decode`` take the messages that come
before the text as ``context``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from evolve.policy.tiny import DEFAULT_CHARS, SPECIALS, CharTokenizer
from evolve.types import Message

WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _content(m: Message | dict) -> tuple[str, str]:
    return (m.role, m.content) if isinstance(m, Message) else (m["role"], m["content"])


class PointerTokenizer(CharTokenizer):
    def __init__(self, keep: Iterable[str], n_pointers: int = 48, chars: str = DEFAULT_CHARS) -> None:
        super().__init__(chars)
        self.keep = frozenset(keep)
        self.n_pointers = int(n_pointers)
        self._p0 = self._offset + len(self.chars)

    @classmethod
    def fit(
        cls,
        texts: Sequence[str],
        *,
        min_share: float = 0.03,
        n_pointers: int = 48,
        extra: Iterable[str] = (),
        pointers: Iterable[str] = (),
    ) -> PointerTokenizer:
        """Keep the words that occur in at least ``min_share`` of ``texts`` (one count per text),
        and the words of ``extra`` (e.g. the names of the system's tools), but never a word of
        ``pointers`` (e.g. the schema names of the demos: a name frequent in training would be
        spelled while every unseen name is a pointer, so what is learnt about it would not carry over)."""
        docs = Counter(w for t in texts for w in set(WORD.findall(t)))
        need = max(2, int(min_share * len(texts)))
        keep = {w for w, n in docs.items() if n >= need} - set(pointers)
        return cls(keep | set(extra), n_pointers=n_pointers)

    @property
    def vocab_size(self) -> int:
        return self._p0 + self.n_pointers

    def is_pointer(self, token_id: int) -> bool:
        return token_id >= self._p0

    # ---------------------------------------------------------------- encoding

    def _encode(self, text: str, table: dict[str, int]) -> list[int]:
        out: list[int] = []
        pos = 0
        for m in WORD.finditer(text):
            out += super().encode(text[pos : m.start()])
            word = m.group()
            if word in self.keep:
                out += super().encode(word)
            else:
                if word not in table:
                    table[word] = len(table)
                k = table[word]
                out += [self._p0 + k] if k < self.n_pointers else [self.unk_id]
            pos = m.end()
        return out + super().encode(text[pos:])

    def pointer_table(self, context: Sequence[Message | dict] = ()) -> dict[str, int]:
        table: dict[str, int] = {}
        for m in context:
            self._encode(_content(m)[1], table)
        return table

    def encode(self, text: str, context: Sequence[Message | dict] = ()) -> list[int]:
        return self._encode(text, self.pointer_table(context))

    def render_chat(self, messages: Sequence[Message | dict], add_generation_prompt: bool = True) -> list[int]:
        table: dict[str, int] = {}
        ids = [self.bos_id]
        for m in messages:
            role, content = _content(m)
            if role not in self.role_ids:
                raise ValueError(f"PointerTokenizer.render_chat: unknown role {role!r}")
            ids.append(self.role_ids[role])
            ids.extend(self._encode(content, table))
            ids.append(self.eos_id)
        if add_generation_prompt:
            ids.append(self.role_ids["assistant"])
        return ids

    # ---------------------------------------------------------------- decoding

    def decode(self, ids: Iterable[int], context: Sequence[Message | dict] = ()) -> str:
        """Ids to text; a pointer becomes its word from ``context`` (``w<k>`` when it points nowhere)."""
        words = {k: w for w, k in self.pointer_table(context).items()}
        out = []
        for i in ids:
            if i >= self._p0:
                k = i - self._p0
                out.append(words.get(k, f"w{k}"))
            else:
                out.append(super().decode((i,)))
        return "".join(out)

    def token_text(self, token_id: int) -> str:
        return f"w{token_id - self._p0}" if token_id >= self._p0 else super().token_text(token_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "pointer",
            "version": 1,
            "chars": self.chars,
            "specials": list(SPECIALS),
            "keep": sorted(self.keep),
            "n_pointers": self.n_pointers,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PointerTokenizer:
        if data.get("type") != "pointer" or tuple(data.get("specials", SPECIALS)) != SPECIALS:
            raise ValueError(f"not a PointerTokenizer: {data.get('type')!r}")
        return cls(data["keep"], n_pointers=data["n_pointers"], chars=data["chars"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PointerTokenizer) and (other.chars, other.keep, other.n_pointers) == (
            self.chars,
            self.keep,
            self.n_pointers,
        )

    def __repr__(self) -> str:
        return f"PointerTokenizer(keep={len(self.keep)} words, n_pointers={self.n_pointers})"


def tokenizer_from_dict(data: dict[str, Any]) -> CharTokenizer:
    return PointerTokenizer.from_dict(data) if data.get("type") == "pointer" else CharTokenizer.from_dict(data)
