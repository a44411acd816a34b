"""The LLM protocol: messages in, text out, plus token ids and log-probs when the backend has them.

Lifecycle: a backend is built once per :class:`~evolve.types.ModelSpec` by its factory
(``factory(spec, artifacts) -> LLM``), then ``complete`` is called from many rollout threads
at once; backends must be thread-safe (the local backend batches concurrent calls).
``close()`` releases what the backend holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from evolve.types import Message


@dataclass(frozen=True)
class Completion:
    text: str
    model: str
    token_ids: tuple[int, ...] | None = None  # exactly what the sampler drew
    prompt_token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None  # log p(token) under the sampling temperature
    finish_reason: str | None = None  # "stop" | "length" | ...
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None  # money, when the backend knows it
    extra: dict = field(default_factory=dict)
    # asked for (top_logprobs=k, where the backend takes it): each token's k likeliest (id, log p), likeliest first
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None


@runtime_checkable
class LLM(Protocol):
    name: str

    def complete(
        self,
        messages: Sequence[Message],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
    ) -> Completion: ...

    def close(self) -> None: ...


def takes(llm: object, name: str) -> bool:
    """Whether ``llm.complete`` takes the keyword ``name`` (``logprobs``, ``top_logprobs``: the local
    backend's; the protocol does not ask them, so a third-party backend is never sent them)."""
    import inspect

    try:
        return name in inspect.signature(llm.complete).parameters  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return False


def as_messages(messages: Sequence[Message | dict]) -> tuple[Message, ...]:
    """Accept Message objects or OpenAI-style dicts."""
    out = []
    for m in messages:
        out.append(m if isinstance(m, Message) else Message(role=m["role"], content=m["content"]))
    return tuple(out)
