"""The answer format: how a reply says its final answer, and how the answer is read back from it.

A task names its format (``answer_format``, from ``dataset.params``; ``answer_line`` by default):

=================  =============================================================  ==================
format             the answer is                                                  a gold demo says
=================  =============================================================  ==================
``answer_line``    the text after the last ``Answer:`` (any case, at a line's     ``Answer: 42``
                   start, ``Final answer:`` and markdown bold allowed), to the
                   end of that line
``answer_tag``     the text inside the last ``<answer>...</answer>`` (reasoning-  ``<answer>42</answer>``
                   gym's own convention: its ``utils.extract_answer``)
``last_line``      the last non-empty line                                        ``42``
``first_line``     the first non-empty line (the probe in issue 52 scored this)   ``42``
=================  =============================================================  ==================

The answer is then stripped of surrounding whitespace, and of one pair of surrounding backticks
or ``**``; nothing else is changed (the package's scorer decides what matches). A reply from which
no answer can be read (empty, or without the marker its format asks for) is the agent's 0, and the
feedback says what was missing.
"""

from __future__ import annotations

import re

FORMATS = ("answer_line", "answer_tag", "last_line", "first_line")

#: The system message a system without an ``instruction`` component is given, per format.
INSTRUCTIONS = {
    "answer_line": "Solve the problem. End your reply with one line that gives the final answer alone, "
    "written as: Answer: <answer>",
    "answer_tag": "Solve the problem. Give the final answer alone between <answer> and </answer> tags.",
    "last_line": "Solve the problem. Give the final answer alone on the last line of your reply.",
    "first_line": "Reply with the final answer alone, on the first line, and nothing else.",
}

_LINE = re.compile(r"^[ \t>*_#-]*(?:final\s+)?answer\**\s*[:：]\s*\**\s*(.*)$", re.IGNORECASE | re.MULTILINE)
_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


class AnswerFormatError(ValueError):
    """No answer could be read from a reply (the message says what its format asks for)."""


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        from evolve.registry import did_you_mean

        raise ValueError(f"answer_format {fmt!r} is not one of {list(FORMATS)}; {did_you_mean(fmt, list(FORMATS))}")
    return fmt


def _clean(text: str) -> str:
    text = text.strip()
    for mark in ("**", "`"):
        if len(text) > 2 * len(mark) and text.startswith(mark) and text.endswith(mark):
            return text[len(mark) : -len(mark)].strip()
    if text.endswith("**") and "**" not in text[:-2]:  # "**Answer: 42**": the bold's closing half
        text = text[:-2].rstrip()
    return text


def extract(reply: str | None, fmt: str = "answer_line") -> str:
    """The answer in ``reply`` under format ``fmt``; :class:`AnswerFormatError` when there is none."""
    check_format(fmt)
    text = reply if isinstance(reply, str) else ""
    if not text.strip():
        raise AnswerFormatError("the reply is empty")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if fmt == "answer_line":
        found = _LINE.findall(text)
        got = _clean(found[-1]) if found else ""
        if not got:
            raise AnswerFormatError("the 'Answer:' line is empty" if found else "no 'Answer: ...' line in the reply")
        return got
    if fmt == "answer_tag":
        found = _TAG.findall(text)
        got = _clean(found[-1]) if found else ""
        if not got:
            raise AnswerFormatError("the <answer> tags are empty" if found else "no <answer>...</answer> in the reply")
        return got
    got = _clean(lines[-1] if fmt == "last_line" else lines[0])
    if not got:
        raise AnswerFormatError("the reply's answer line is empty")
    return got


def written(answer: str, fmt: str = "answer_line") -> str:
    """``answer`` as a reply in format ``fmt`` writes it (the cold start's and the demos' turns)."""
    check_format(fmt)
    if fmt == "answer_line":
        return f"Answer: {answer}"
    if fmt == "answer_tag":
        return f"<answer>{answer}</answer>"
    return str(answer)


def read(reply: str, answer_format: str = "answer_line") -> str:
    """:func:`extract` for a workflow graph's ``tool`` node (``fn: evolve.worlds.reasoning_gym:read_answer``,
    args ``reply`` and ``answer_format``, the task's field; with ``error_key`` a missing answer is data)."""
    return extract(reply, answer_format)


def kind_of(gold: str | None) -> str:
    """What the expected answer is, in words that give none of it away (the feedback's hint)."""
    if gold is None:
        return "any answer the scorer accepts (this generator checks answers rather than compare them)"
    g = gold.strip()
    if re.fullmatch(r"[-+]?\d+", g):
        return "an integer"
    if re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+|\d+/\d+)([eE][-+]?\d+)?", g):
        return "a number"
    if g.startswith("[") and g.endswith("]"):
        return "a list"
    if "\n" in g:
        return "several lines"
    words = g.split()
    if len(words) == 1:
        return "one word" if g.isalpha() else "one token"
    return "a comma-separated list" if "," in g else "several words"


__all__ = ["FORMATS", "INSTRUCTIONS", "AnswerFormatError", "check_format", "extract", "kind_of", "read", "written"]
