"""STaR's rationalization on this world: a model's own reply to a *generated* training prompt,
edited until it follows every instruction of that prompt (the ``star.repair`` hook).

A 135M model rarely follows a format instruction by chance (ten instruction types score 0% on
IFEval's prompts untouched), so sampling and keeping what passed leaves little to learn from. The
instructions of a generated prompt are known with their parameters, so most of them can be met by
editing the reply mechanically: cut where it starts to loop, drop forbidden words and commas,
regroup its sentences into the asked number of paragraphs, sections or bullets, add the title, the
postscript or the closing phrase, change its case, wrap it in quotes or JSON. The content stays the
model's. What the edits cannot give (a language, a letter's frequency, more words or sentences
than the model wrote) must already hold. The result is returned only when the reference checkers
(:mod:`evolve.worlds.ifeval.checks`, strict) pass it on every instruction; otherwise None.

Only training prompts reach this (STaR samples the training split); IFEval's own prompts are never
repaired, learned or looked at here.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from evolve.worlds.ifeval.checks import CONSTRAINED_RESPONSES, count_words, sentences, verdicts, word_tokens

Edit = Callable[[str, Mapping[str, Any], dict], str | None]

_UNIT = re.compile(r"[^.!?\n]+[.!?]*|\n")
_PLACEHOLDERS = ("name", "date", "place", "time", "address", "company", "email", "phone number")
_TRAILING = {"a", "an", "the", "of", "and", "or", "to", "in", "on", "for", "with", "is", "are", "was"}
_POSTSCRIPTS = ("I hope this helps.", "Thank you for reading.", "Let me know if you have questions.")


def _norm(s: str) -> str:
    return re.sub(r"\W+", " ", s).strip().lower()


def unloop(reply: str, *, ended: bool = True, span: int = 7) -> str:
    """``reply`` cut before the first sentence or line that repeats an earlier one or any run of
    ``span`` words already written (small models loop until their token cap); a reply that did not
    end by itself also loses its unfinished last sentence."""
    seen: set[str] = set()
    grams: set[tuple[str, ...]] = set()
    words: list[str] = []
    out: list[str] = []
    for unit in _UNIT.findall(reply):
        key = _norm(unit)
        new = key.split()
        run = [*words[-(span - 1) :], *new] if words else new
        ngrams = [tuple(run[i : i + span]) for i in range(len(run) - span + 1)]
        looped = len(set(ngrams)) < len(ngrams) or any(g in grams for g in ngrams)
        if (len(key) > 12 and key in seen) or looped:
            break
        seen.add(key)
        grams.update(ngrams)
        words += new
        out.append(unit)
    text = "".join(out).rstrip()
    if not ended or len(text) < len(reply.rstrip()):
        # it was cut: end on the last finished sentence
        end = max(text.rfind(c) for c in ".!?")
        text = text[: end + 1] if end > 0 else text
    return text.strip()


def _flat(text: str) -> list[str]:
    """The reply's sentences, list markers and separators gone (for regrouping)."""
    text = re.sub(r"^\s*(?:[*\-]|\d+[.)])\s+", "", text, flags=re.MULTILINE)
    text = re.sub(r"\*+|#+|<<[^\n]*>>", "", text)
    return [s.strip() for s in sentences(re.sub(r"\s+", " ", text)) if s.strip()]


def _groups(items: list[str], n: int) -> list[list[str]] | None:
    if n < 1 or len(items) < n:
        return None
    size, extra = divmod(len(items), n)
    out, i = [], 0
    for k in range(n):
        j = i + size + (1 if k < extra else 0)
        out.append(items[i:j])
        i = j
    return out


def _regroup(text: str, n: int, sep: str, head: Callable[[int], str] = lambda i: "") -> str | None:
    groups = _groups(_flat(text), n)
    return None if groups is None else sep.join(head(i) + " ".join(g) for i, g in enumerate(groups))


def _first_words(text: str, n: int) -> list[str]:
    return re.findall(r"[A-Za-z][A-Za-z'-]*", text)[:n]


def _pick(options: tuple[str, ...], key: str) -> str:
    return options[zlib.crc32(key.encode()) % len(options)]


# -- the edits, by instruction id (each returns the edited reply, or None where it cannot help) --------


def _shorter_words(r: str, a: Mapping[str, Any], t: dict) -> str | None:
    if a.get("relation") != "less than":
        return r
    keep: list[str] = []
    for s in sentences(r):
        if count_words(" ".join([*keep, s])) >= int(a["num_words"]):
            break
        keep.append(s)
    return " ".join(keep) or None


def _fewer_sentences(r: str, a: Mapping[str, Any], t: dict) -> str | None:
    if a.get("relation") != "less than":
        return r
    return " ".join(sentences(r)[: int(a["num_sentences"]) - 1]) or None


def _forbidden(r: str, a: Mapping[str, Any], t: dict) -> str:
    for w in a.get("forbidden_words") or []:
        r = re.sub(r"\s*\b" + re.escape(w) + r"\b", "", r, flags=re.IGNORECASE)
    return r


def _keywords(r: str, a: Mapping[str, Any], t: dict) -> str:
    missing = [k for k in a.get("keywords") or [] if not re.search(re.escape(k), r, flags=re.IGNORECASE)]
    return r if not missing else f"{r}\n\nThis touches on {' and '.join(missing)}."


def _paragraphs(r: str, a: Mapping[str, Any], t: dict) -> str | None:
    return _regroup(r, int(a["num_paragraphs"]), "\n\n***\n\n")


def _nth_first_word(r: str, a: Mapping[str, Any], t: dict) -> str | None:
    groups = _groups(_flat(r), int(a["num_paragraphs"]))
    nth = int(a["nth_paragraph"]) - 1
    if groups is None or nth >= len(groups):
        return None
    word = str(a["first_word"])
    first = groups[nth][0]
    if not first.lower().startswith(word.lower() + " "):
        groups[nth][0] = f"{word.capitalize()} {first[:1].lower()}{first[1:]}"
    return "\n\n".join(" ".join(g) for g in groups)


def _sections(r: str, a: Mapping[str, Any], t: dict) -> str | None:
    splitter = str(a["section_spliter"]).strip()
    return _regroup(r, int(a["num_sections"]), "\n\n", lambda i: f"{splitter} {i + 1}\n")


def _bullets(r: str, a: Mapping[str, Any], t: dict) -> str | None:
    return _regroup(r, int(a["num_bullets"]), "\n", lambda i: "* ")


def _two(r: str, a: Mapping[str, Any], t: dict) -> str | None:
    return _regroup(r, 2, "\n\n******\n\n")


def _highlights(r: str, a: Mapping[str, Any], t: dict) -> str | None:
    n = int(a["num_highlights"])
    done = 0

    def mark(m: re.Match) -> str:
        nonlocal done
        s = m.group(0)
        if done >= n or "*" in s or not s.strip():
            return s
        done += 1
        return f"*{s.strip()}*" + (" " if s.endswith(" ") else "")

    out = re.sub(r"[^.!?\n*]+[.!?]+ ?", mark, r)
    return out if done >= n else None


def _placeholders(r: str, a: Mapping[str, Any], t: dict) -> str:
    need = int(a["num_placeholders"]) - len(re.findall(r"\[.*?\]", r))
    if need <= 0:
        return r
    names = [_PLACEHOLDERS[i % len(_PLACEHOLDERS)] for i in range(need)]
    return f"{r}\n\nFill in: " + " ".join(f"[{x}]" for x in names)


def _title(r: str, a: Mapping[str, Any], t: dict) -> str | None:
    words = _first_words(re.sub(r"<<[^\n]*>>", "", r), 5)
    while words and words[-1].lower() in _TRAILING:
        words.pop()
    return f"<<{' '.join(words).title()}>>\n\n{r}" if words else None


def _postscript(r: str, a: Mapping[str, Any], t: dict) -> str:
    marker = str(a["postscript_marker"]).strip()
    return f"{r}\n\n{marker} {_pick(_POSTSCRIPTS, t.get('id', ''))}"


def _constrained(r: str, a: Mapping[str, Any], t: dict) -> str:
    return r if any(c in r for c in CONSTRAINED_RESPONSES) else _pick(CONSTRAINED_RESPONSES, t.get("id", ""))


def _end(r: str, a: Mapping[str, Any], t: dict) -> str:
    phrase = str(a["end_phrase"]).strip()
    return r if r.strip().strip('"').lower().endswith(phrase.lower()) else f"{r}\n\n{phrase}"


def _repeat(r: str, a: Mapping[str, Any], t: dict) -> str:
    prompt = str(a["prompt_to_repeat"]).strip()
    return r if r.strip().lower().startswith(prompt.lower()) else f"{prompt}\n\n{r}"


def _capital_words(r: str, a: Mapping[str, Any], t: dict) -> str | None:
    n, relation = int(a["capital_frequency"]), a.get("capital_relation")
    if relation == "less than":
        return re.sub(r"\b[A-Z]{2,}\b", lambda m: m.group(0).capitalize(), r)
    have = sum(1 for w in word_tokens(r) if w.isupper())
    if have >= n:
        return r
    need = n - have
    picks = iter(range(need))

    def up(m: re.Match) -> str:
        return m.group(0).upper() if next(picks, None) is not None else m.group(0)

    return re.sub(r"\b[a-z][a-z]{3,}\b", up, r)


def _json(r: str, a: Mapping[str, Any], t: dict) -> str:
    return "```json\n" + json.dumps({"response": r}, ensure_ascii=False, indent=2) + "\n```"


#: Edits in the order they apply: cuts, then structure, then what is added around the reply, then
#: its case, then what wraps it. An instruction missing here must hold already.
EDITS: dict[str, Edit] = {
    "length_constraints:number_words": _shorter_words,
    "length_constraints:number_sentences": _fewer_sentences,
    "keywords:forbidden_words": _forbidden,
    "keywords:existence": _keywords,
    "length_constraints:number_paragraphs": _paragraphs,
    "length_constraints:nth_paragraph_first_word": _nth_first_word,
    "detectable_format:multiple_sections": _sections,
    "detectable_format:number_bullet_lists": _bullets,
    "combination:two_responses": _two,
    "detectable_format:number_highlighted_sections": _highlights,
    "detectable_format:constrained_response": _constrained,
    "detectable_content:number_placeholders": _placeholders,
    "detectable_format:title": _title,
    "detectable_content:postscript": _postscript,
    "startend:end_checker": _end,
    "combination:repeat_prompt": _repeat,
    "punctuation:no_comma": lambda r, a, t: r.replace(",", ""),
    "change_case:capital_word_frequency": _capital_words,
    "change_case:english_lowercase": lambda r, a, t: r.lower(),
    "change_case:english_capital": lambda r, a, t: r.upper(),
    "startend:quotation": lambda r, a, t: r if r.startswith('"') and r.endswith('"') else f'"{r}"',
    "detectable_format:json_format": _json,
}


def repair(task: dict, reply: str, *, ended: bool = True) -> str | None:
    """``reply`` (the model's answer to the generated prompt ``task``) edited to follow every
    instruction of ``task``, or None where the edits cannot make the checkers pass it (see the
    module docstring). ``ended``: whether the reply ended by itself rather than at its token cap."""
    if task.get("split") == "test" or "key" in task:  # an IFEval prompt: never learned from
        return None
    ids, kwargs = list(task["instruction_id_list"]), list(task["kwargs"])
    text = unloop(reply or "", ended=ended)
    given = {i: {k: v for k, v in (kw or {}).items() if v} for i, kw in zip(ids, kwargs)}
    for iid, edit in EDITS.items():
        if iid not in given or not text:
            continue
        edited = edit(text, given[iid], task)
        if edited is None:
            return None
        text = edited.strip()
    if not text or not all(verdicts(text, ids, kwargs)):
        return None
    return text


__all__ = ["EDITS", "repair", "unloop"]
