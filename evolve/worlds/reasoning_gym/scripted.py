"""A scripted solver for plumbing tests and the smoke run (``backend: scripted``,
``params: {reply: "evolve.worlds.reasoning_gym.scripted:reply"}``). Nothing it does is a result.

It knows three generators and has a fixed skill, so that its success depends on the difficulty
the way a model's does: ``basic_arithmetic`` and ``chain_sum`` right up to :data:`MAX_TERMS` terms,
``spell_backward`` right up to :data:`MAX_LETTERS` letters; beyond, and on any other question, a
plausible wrong answer. Sampled (a temperature above 0), one answer in :data:`SLIP` is wrong, by the
seed. It writes its answer in the format the system message asks for (``Answer:``, else ``<answer>``
tags, else the bare answer) and says nothing else, unless the system message says ``explain``:
then it explains and gives no answer line (a reply the reward cannot read), until a second user
turn asks again. The question is the first user message.
"""

from __future__ import annotations

import ast
import random
import re
from fractions import Fraction

from evolve.types import Message

MAX_TERMS = 3
MAX_LETTERS = 6
SLIP = 4

_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def _value(node: ast.AST) -> Fraction:
    """The value of an arithmetic expression tree of integers and + - * / (nothing else is allowed)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError("not arithmetic")


def _arith(expr: str) -> tuple[str, int]:
    """``(the value as the generators write it, the number of terms)``."""
    value = _value(ast.parse(expr.strip(), mode="eval").body)
    text = str(value.numerator) if value.denominator == 1 else str(float(value))
    return text, len(re.findall(r"\d+", expr))


def solve(question: str) -> tuple[str, bool]:
    """``(an answer, whether it is within the solver's skill)`` for the questions it knows."""
    m = re.search(r"Calculate (.+?)\.?\s*$", question) or re.search(r"arithmetic problem: (.+?)=\s*$", question)
    if m:
        try:
            text, terms = _arith(m.group(1))
        except (ValueError, SyntaxError, ZeroDivisionError):
            return "unknown", False
        return text, terms <= MAX_TERMS
    m = re.search(r"backward \(example: sun -> nus\): (\S+)", question)
    if m:
        return m.group(1)[::-1], len(m.group(1)) <= MAX_LETTERS
    return "unknown", False


def _wrong(answer: str) -> str:
    if re.fullmatch(r"-?\d+", answer):
        return str(int(answer) + 1)
    return answer[1:] + answer[:1] if len(answer) > 1 else answer + "x"


def reply(messages: tuple[Message, ...], seed: int | None = None, temperature: float | None = None) -> str:
    """The scripted model (see the module docstring)."""
    system = messages[0].content if messages and messages[0].role == "system" else ""
    users = [m.content for m in messages if m.role == "user"]
    question = users[0] if users else ""
    answer, within = solve(question)
    slipped = bool(temperature) and random.Random(f"{seed}/{question}").randrange(SLIP) == 0
    if not within or slipped:
        answer = _wrong(answer)
    if "explain" in system.lower() and len(users) < 2:  # asked again (a follow-up turn), it answers
        return f"Let me think about this. The question asks something; the result should be {answer}."
    if "Answer:" in system:
        return f"Answer: {answer}"
    return f"<answer>{answer}</answer>" if "<answer>" in system else answer


__all__ = ["MAX_LETTERS", "MAX_TERMS", "SLIP", "reply", "solve"]
