"""How lessons reach an unmodified agent: a rollout context whose models see them.

:class:`LessonContext` is a :class:`~evolve.rollout.RolloutContext` that shares its parent's steps,
lock and deadline; its ``llm(role)`` returns a :class:`LessonLLM`, a recording LLM handle that puts
the lessons into every message list *before* recording it. So the trajectory's LLM calls show
exactly the messages the model saw, lessons included. (Wrapping the LLM provider instead would
hide them: the rollout records the agent's messages, then calls the provider's LLM.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from evolve.llm.base import Completion, as_messages
from evolve.rollout import RecordedLLM, RolloutContext
from evolve.types import Message

HEADER = "Lessons from earlier attempts:"
MODES = ("system", "user", "turns")


class Lesson(str):
    """A lesson (a plain string) that remembers the answer it was drawn from, for ``inject="turns"``."""

    answer: str | None = None

    def __new__(cls, text: str, answer: str | None = None) -> Lesson:
        obj = super().__new__(cls, text)
        obj.answer = answer
        return obj


def format_lessons(lessons: Sequence[str], header: str = HEADER) -> str:
    """``"Lessons from earlier attempts:\\n- first\\n- second"``."""
    return header + "\n" + "\n".join(f"- {lesson}" for lesson in lessons)


def inject(messages: Sequence[Message | dict], lessons: Sequence[str], mode: str = "system") -> tuple[Message, ...]:
    """The messages with the lessons put in.

    ``mode="system"``: appended to a leading system message, or prepended as one.
    ``mode="user"``: appended to the first user message (for models trained without system
    messages); with no user message it falls back to ``"system"``.
    ``mode="turns"``: after the first user message, each lesson as a turn pair — the earlier
    answer it was drawn from (an assistant message, when known: :class:`Lesson`) and the lesson
    as a tool message — the shape of a repair turn, for small models trained on such turns.
    No lessons: unchanged. A message list that already holds the lessons is left as it is."""
    msgs = list(as_messages(messages))
    if not lessons:
        return tuple(msgs)
    if mode == "turns":
        first = next((i for i, m in enumerate(msgs) if m.role == "user"), None)
        if first is not None:
            if any(m.role == "tool" and m.content == lessons[-1] for m in msgs):
                return tuple(msgs)
            turns = []
            for lesson in lessons:
                answer = getattr(lesson, "answer", None)
                if answer:
                    turns.append(Message(role="assistant", content=answer))
                turns.append(Message(role="tool", content=str(lesson)))
            return tuple(msgs[: first + 1] + turns + msgs[first + 1 :])
        mode = "system"
    block = format_lessons(lessons)
    if any(block in m.content for m in msgs):
        return tuple(msgs)
    if mode == "user":
        for i, m in enumerate(msgs):
            if m.role == "user":
                msgs[i] = Message(role="user", content=f"{m.content}\n\n{block}" if m.content else block)
                return tuple(msgs)
    if msgs and msgs[0].role == "system":
        head = msgs[0].content
        msgs[0] = Message(role="system", content=f"{head}\n\n{block}" if head.strip() else block)
    else:
        msgs.insert(0, Message(role="system", content=block))
    return tuple(msgs)


def strip_lessons(text: str) -> str:
    """``text`` without a lesson block appended to it (how a user message looked before :func:`inject`)."""
    if text.startswith(HEADER):
        return ""
    return text.split("\n\n" + HEADER, 1)[0]


class LessonLLM(RecordedLLM):
    """A rollout's recording LLM handle that injects its context's lessons first."""

    _ctx: LessonContext

    def complete(
        self,
        messages: Sequence[Message | dict],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        logprobs: bool | None = None,
        top_logprobs: int = 0,
    ) -> Completion:
        ctx = self._ctx
        if ctx.inject_roles is None or self.role in ctx.inject_roles:
            messages = inject(messages, ctx.lessons, ctx.inject_mode)
        return super().complete(
            messages,
            temperature=temperature,
            max_tokens=max_tokens,
            stop=stop,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
        )


class LessonContext(RolloutContext):
    """A child of a rollout context for one attempt: same system, task, steps, lock and deadline;
    its models see ``lessons``. ``seed`` and ``temperature`` default to the parent's. Nested
    contexts add their lessons to the parent's. Call :meth:`close` when the attempt ends (it drops
    the attempt's OpenAI gateway URLs, if the agent asked for any)."""

    def __init__(
        self,
        parent: RolloutContext,
        lessons: Iterable[str],
        mode: str = "system",
        *,
        roles: Iterable[str] | None = None,
        seed: int | None = None,
        temperature: float | None | Any = ...,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"inject must be one of {MODES}, got {mode!r}")
        super().__init__(
            system=parent.system,
            task=parent.task,
            llm_provider=parent.llm_provider,
            seed=parent.seed if seed is None else int(seed),
            temperature=parent.temperature if temperature is ... else temperature,
            deadline=parent.deadline,
            steps=parent.steps,
            _lock=parent._lock,
        )
        outer = list(parent.lessons) if isinstance(parent, LessonContext) else []
        mine = [x if isinstance(x, str) else str(x) for x in lessons]  # a Lesson keeps its answer
        self.lessons: tuple[str, ...] = tuple(dict.fromkeys(outer + mine))
        self.inject_mode = mode
        self.inject_roles = None if roles is None else frozenset(roles)
        self.parent = parent

    def llm(self, role: str = "policy") -> LessonLLM:
        if role not in self.system.models:
            raise KeyError(f"the system has no model role {role!r}; it has {sorted(self.system.models)}")
        return LessonLLM(self, role, self.llm_provider(self.system, role))

    def close(self) -> None:
        if self._gateway:
            from evolve.gateway.rollout_route import unregister

            unregister(self)
            self._gateway.clear()


__all__ = ["HEADER", "Lesson", "LessonContext", "LessonLLM", "format_lessons", "inject", "strip_lessons"]
