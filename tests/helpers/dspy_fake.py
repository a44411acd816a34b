"""A scripted reply for DSPy programs, to run them against :class:`~evolve.llm.fake.ScriptedLM`.

DSPy's ChatAdapter asks for output fields as ``[[ ## name ## ]]`` blocks; :func:`chat_reply` reads
the field names from the system message (``Your output fields are: 1. `answer` ...``) and the
inputs from the last user message, and answers every field with ``fill(field, inputs, messages)``.
A request with no output fields (GEPA's free-form reflection prompt) gets ``fill("", {}, messages)``
inside a fenced block, the form GEPA reads a proposed instruction from. Plumbing only: nothing it
answers is a result.

    lm = ScriptedLM("fake", chat_reply(lambda field, inputs, msgs: "4" if field == "answer" else "..."))
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

Fill = Callable[[str, dict[str, str], Sequence[Any]], str]

_OUTPUTS = re.compile(r"Your output fields are:\n(.*?)(?:\nAll interactions|\Z)", re.S)
_FIELD = re.compile(r"^\d+\. `([^`]+)`", re.M)
_BLOCK = re.compile(r"\[\[ ## (\w+) ## \]\]\n")
_RESPOND = re.compile(r"\n\nRespond with the corresponding output fields")


def output_fields(system: str) -> list[str]:
    """The output field names a ChatAdapter system message asks for (in order)."""
    m = _OUTPUTS.search(system)
    return _FIELD.findall(m.group(1)) if m else []


def input_values(user: str) -> dict[str, str]:
    """The ``[[ ## field ## ]]`` blocks of a ChatAdapter user message."""
    parts = _BLOCK.split(_RESPOND.split(user)[0])
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


def _default_fill(field: str, inputs: dict[str, str], messages: Sequence[Any]) -> str:
    return "Answer with the value only." if not field else "ok"


def chat_reply(fill: Fill | None = None) -> Callable[[Sequence[Any]], str]:
    """A ScriptedLM reply function answering DSPy ChatAdapter requests (see the module docstring)."""
    fill = fill or _default_fill

    def reply(messages: Sequence[Any]) -> str:
        system = messages[0].content if messages and messages[0].role == "system" else ""
        fields = output_fields(system)
        if not fields:
            return "```\n" + fill("", {}, messages) + "\n```"
        user = next((m.content for m in reversed(messages) if m.role == "user"), "")
        inputs = input_values(user)
        body = "\n\n".join(f"[[ ## {f} ## ]]\n{fill(f, inputs, messages)}" for f in fields)
        return body + "\n\n[[ ## completed ## ]]"

    return reply


__all__ = ["chat_reply", "input_values", "output_fields"]
