"""Writing a reflection: the prompt shown to the reflector model, the checks its answer must pass,
and the feedback text that replaces it when it does not (or when the model is not asked)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from evolve.types import LLMCall, Message, ToolCall, Trajectory

from .context import strip_lessons

REFLECT_SYSTEM = (
    "You review a failed attempt at a task. In one to three sentences, say what went wrong and what "
    "to do differently next time. Be specific, and general enough to help on similar tasks. Do not "
    "restate the task or give a full answer. Reply with the lesson only."
)

# task fields that describe it, in the order shown; fields that may hold the answer are never shown
TASK_KEYS = ("context", "schema", "question", "prompt", "instruction", "input", "query", "problem", "q", "text")
HIDDEN = ("gold", "answer", "expected", "solution", "label", "target", "reference")


@dataclass(frozen=True)
class Reflection:
    """One lesson drawn from a failed attempt."""

    attempt: int  # index (0-based) of the attempt it reflects on
    text: str  # the lesson put in context (and written to memory)
    source: str  # "model": the reflector wrote it; "feedback": the evaluator's feedback
    score: float  # the attempt's score
    reason: str | None = None  # why the model's reflection was not used, when it was not
    raw: str | None = None  # the reflector's text, when it was rejected
    call: LLMCall | None = None  # the recorded reflection call, when one was made


def clip(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: max(0, limit - 3)].rstrip() + "..."


def describe_task(
    task: Any, trajectory: Trajectory | None = None, task_text: Callable[[Any], str] | None = None, limit: int = 1200
) -> str:
    """What the reflector (and the memory search) is told the task was: ``task_text(task)`` when
    given; else the first user message the agent sent in ``trajectory`` (lessons removed); else
    the task's descriptive string fields (never fields named like gold / answer / expected)."""
    if task_text is not None:
        return clip(task_text(task), limit)
    if trajectory is not None:
        for step in trajectory.steps:
            if isinstance(step, LLMCall):
                user = [m.content for m in step.messages if m.role == "user"]
                if user and strip_lessons(user[0]).strip():
                    return strip_lessons(user[0]).strip()[:limit]
                break
    if not isinstance(task, dict):
        return clip(str(task), limit)
    shown = {k: v for k, v in task.items() if k != "id" and not any(h in k.lower() for h in HIDDEN)}
    parts = [f"{k}: {shown[k]}" for k in TASK_KEYS if isinstance(shown.get(k), str)]
    if not parts:
        parts = [clip(json.dumps(shown, default=str, ensure_ascii=False), limit)]
    return "\n".join(parts)[:limit]


def output_text(trajectory: Trajectory, limit: int = 800) -> str:
    """The attempt's answer as text: its output, or the last thing the model said."""
    out = trajectory.output
    if out is None:
        said = [s.output for s in trajectory.steps if isinstance(s, LLMCall)]
        return clip(said[-1], limit) if said else "(no answer)"
    text = out if isinstance(out, str) else json.dumps(out, default=str, ensure_ascii=False)
    return clip(text, limit)


def feedback_text(trajectory: Trajectory, threshold: float) -> str:
    """Why the attempt failed, in words: the agent's error, else the evaluator's feedback."""
    if trajectory.error:
        return trajectory.error.splitlines()[0]
    r = trajectory.reward
    if r is not None and r.feedback.strip():
        return " ".join(r.feedback.split())
    return f"the answer scored {trajectory.score:.2f}, below the {threshold:.2f} needed"


def reflection_messages(
    task_desc: str, trajectory: Trajectory, feedback: str, prior: Sequence[str], system_prompt: str = REFLECT_SYSTEM
) -> list[Message]:
    """The reflector's prompt: the task, the attempt's answer and tool errors, the feedback, and the
    lessons already in context."""
    errors = [f"- {s.name}: {clip(s.error, 200)}" for s in trajectory.steps if isinstance(s, ToolCall) and s.error]
    parts = [f"Task:\n{task_desc}", f"Attempt {trajectory.sample + 1} answered:\n{output_text(trajectory)}"]
    if errors:
        parts.append("Tool errors during the attempt:\n" + "\n".join(errors[-3:]))
    parts.append(f"Feedback (score {trajectory.score:.2f}):\n{feedback}")
    if prior:
        parts.append("Lessons already tried:\n" + "\n".join(f"- {p}" for p in prior))
    parts.append("What went wrong, and what should the next attempt do differently?")
    return [Message(role="system", content=system_prompt), Message(role="user", content="\n\n".join(parts))]


_PREFIX = re.compile(r"^\s*(?:#+\s*)?(?:lesson|reflection|answer)\s*[:\-]\s*", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z]{2,}")


def clean_reflection(text: Any, max_chars: int) -> tuple[str | None, str | None]:
    """``(lesson, None)`` for a usable reflection, else ``(None, reason)``: empty, too long, or
    garbage (fewer than three words, or under half of its characters letters)."""
    if not isinstance(text, str):
        return None, f"the reflector returned {type(text).__name__}, not text"
    t = _PREFIX.sub("", " ".join(text.strip().strip("`").split()))
    if not t:
        return None, "empty reflection"
    if len(t) > max_chars:
        return None, f"reflection too long ({len(t)} chars > {max_chars})"
    dense = t.replace(" ", "")
    if len(_WORD.findall(t)) < 3 or sum(c.isalpha() for c in dense) < 0.5 * len(dense):
        return None, "reflection looks like garbage (too few words)"
    return t, None


__all__ = [
    "REFLECT_SYSTEM",
    "Reflection",
    "clean_reflection",
    "clip",
    "describe_task",
    "feedback_text",
    "output_text",
    "reflection_messages",
]
