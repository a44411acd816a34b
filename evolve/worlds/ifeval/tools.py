"""What an agent can measure on its own draft: the counts IFEval's instructions are about (words,
sentences, paragraphs, bullets, highlights, placeholders, commas, capital words, the case, the
first and last words). These are facts about the draft, never a verdict: the tool is not told the
instructions, so it cannot say which one the draft breaks; the model has to read the request and
compare. It is what a writer checks with a word counter, and what the draft-measure-revise agent
(:func:`evolve.worlds.ifeval.agent.revise_agent`) and workflow show the model.
"""

from __future__ import annotations

import re

from evolve.worlds.ifeval.checks import count_words, sentences, word_tokens


def measure(reply: str) -> str:
    """The draft's counts as short lines, for the model to read."""
    text = reply or ""
    stripped = text.strip()
    words = re.findall(r"\w+", stripped)
    letters = [c for c in stripped if c.isalpha()]
    case = (
        "all lowercase"
        if letters and stripped.islower()
        else "all capitals"
        if letters and stripped.isupper()
        else "mixed case"
    )
    blank = sum(1 for p in re.split(r"\n\s*\n", text) if p.strip())
    divided = sum(1 for p in re.split(r"\s?\*\*\*\s?", text) if p.strip())
    bullets = len(re.findall(r"^\s*(?:\*[^\*]|-).*$", text, flags=re.MULTILINE))
    highlights = len([h for h in re.findall(r"\*[^\n\*]*\*", text) if h.strip("*").strip()])
    placeholders = len(re.findall(r"\[.*?\]", text))
    quoted = len(stripped) > 1 and stripped[0] == stripped[-1] == '"'
    facts = [
        f"words: {count_words(text)}",
        f"sentences: {len(sentences(text)) if stripped else 0}",
        f"paragraphs separated by blank lines: {blank}",
        f"paragraphs separated by ***: {divided}",
        f"bullet lines (starting with * or -): {bullets}",
        f"highlighted *sections*: {highlights}",
        f"[placeholders]: {placeholders}",
        f"commas: {text.count(',')}",
        f"words in all capitals: {sum(1 for w in word_tokens(text) if w.isupper()) if stripped else 0}",
        f"case: {case}",
        f"starts with: {' '.join(words[:6])!r}",
        f"ends with: {' '.join(words[-6:])!r}",
        f"wrapped in double quotes: {'yes' if quoted else 'no'}",
    ]
    return "\n".join(facts)


__all__ = ["measure"]
