"""What the prompt operators share: the LLM they ask, the JSON log they write, answer parsing.

* :class:`LLMSource` builds the operator's LLM once per model spec: from the operator's
  ``model`` param (a :class:`~evolve.types.ModelSpec`: ``{backend, name, params}``) or, when
  that is absent, from the parent system's model ``role``. It keeps the last two built and
  closes older ones (a role's spec changes when the policy layer trains a new adapter).
* :class:`OperatorLog` records every question asked (messages, seed), every answer, every
  rejection with its reason and the raw text, and every child; it is written as
  ``<operator>.json`` in the operator call's work directory.
* :func:`fenced` extracts the text of a ``` fenced block, the way GEPA reads its reflection
  answers (between the first and the last fence, the language tag dropped).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evolve.errors import BudgetExhausted, ConfigError
from evolve.llm.cache import LLMCache
from evolve.loop.operators import ChargedLLM, OperatorContext
from evolve.types import Message, ModelSpec, System

RAW_KEPT = 4000  # characters of a raw answer kept in the log


def clip(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters, with a marker saying how much was cut."""
    text = str(text)
    return text if len(text) <= n else text[:n] + f" …[{len(text) - n} more characters]"


class LLMSource:
    """The operator's model: ``model`` param first, else the parent's ``role``."""

    def __init__(self, op_name: str, model: dict[str, Any] | None, role: str) -> None:
        self.op_name, self.role = op_name, role
        self.spec = ModelSpec.model_validate(model) if model is not None else None
        self._cache: LLMCache | None = None  # at most two models: the mutator's and a parent's

    def get(self, parent: System, ctx: OperatorContext) -> tuple[Any, ModelSpec]:
        spec = self.spec
        if spec is None:
            spec = parent.models.get(self.role)
            if spec is None:
                raise ConfigError(
                    f"operator {self.op_name!r}: the parent system has no model role {self.role!r} "
                    f"(it has {sorted(parent.models)}); set the operator's 'role' to one of them, or "
                    f"give it a 'model': {{backend, name, params}}"
                )
        if self._cache is None:
            self._cache = LLMCache(ctx.artifacts, max_size=2)
        return self._cache.get(spec), spec


class OperatorLog:
    """What one ``propose`` call asked, got, rejected and proposed; written to ``<name>.json``."""

    def __init__(self, op_name: str, parent: System, ctx: OperatorContext) -> None:
        self.path = Path(ctx.workdir) / f"{op_name}.json"
        self.data: dict[str, Any] = {
            "operator": op_name,
            "generation": ctx.generation,
            "parent": parent.id,
            "notes": [],
            "calls": [],
            "rejected": [],
            "children": [],
        }
        self.tokens = 0
        self._say = ctx.log
        self._ctx = ctx
        self.op_name = op_name

    def note(self, text: str, **extra: Any) -> None:
        self.data["notes"].append({"note": text, **extra})
        self._say(f"{self.op_name}: {text}")

    def reject(self, reason: str, raw: str | None = None, **extra: Any) -> None:
        entry: dict[str, Any] = {"reason": reason, **extra}
        if raw is not None:
            entry["raw"] = clip(raw, RAW_KEPT)
        self.data["rejected"].append(entry)

    def child(self, system: System, rationale: str, **extra: Any) -> None:
        self.data["children"].append({"system": system.id, "rationale": rationale, **extra})

    def ask(
        self,
        llm: Any,
        purpose: str,
        messages: Sequence[Message],
        *,
        seed: int,
        temperature: float | None,
        max_tokens: int | None,
    ) -> str | None:
        """Ask ``llm``; return its text, or ``None`` (recorded as a rejection) when the call fails."""
        entry: dict[str, Any] = {
            "purpose": purpose,
            "seed": seed,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
        }
        self.data["calls"].append(entry)
        try:  # counted against the run's budget; a spent one stops the run here, before the call
            out = ChargedLLM(llm, self._ctx).complete(
                list(messages), temperature=temperature, max_tokens=max_tokens, seed=seed
            )
        except BudgetExhausted:
            raise
        except Exception as e:  # noqa: BLE001 - a failing model is recorded, never fatal
            entry["error"] = f"{type(e).__name__}: {e}"
            self.reject(f"{purpose}: the model call failed: {entry['error']}")
            return None
        entry["answer"] = out.text
        self.tokens += int(out.prompt_tokens or 0) + int(out.completion_tokens or 0)
        return out.text

    def write(self) -> None:
        self.data["llm_tokens"] = self.tokens
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1, ensure_ascii=False, default=str))

    def summary(self) -> str:
        return (
            f"{len(self.data['calls'])} model calls, {len(self.data['rejected'])} rejected, "
            f"{len(self.data['children'])} children"
        )


_TAG = re.compile(r"[A-Za-z0-9_+-]*")


def fenced(text: str) -> tuple[str | None, str]:
    """The body of the ``` fenced block in ``text`` and ``""``, or ``None`` and why not.

    The body runs from the first fence to the last one (so a block may itself contain fenced
    code); a language tag alone on the opening line is dropped; the result is stripped."""
    start = text.find("```")
    if start < 0:
        return None, "no ``` fenced block in the answer"
    end = text.rfind("```")
    if end == start:
        return None, "the ``` fenced block is never closed"
    body = text[start + 3 : end]
    first, nl, rest = body.partition("\n")
    if nl and _TAG.fullmatch(first.strip()):
        body = rest
    body = body.strip()
    if not body:
        return None, "the fenced block is empty"
    return body, ""


def loose_answer(text: str) -> tuple[str | None, str]:
    """A fenced block when there is one, else the whole answer stripped (PromptBreeder's mutants
    are free text); ``None`` and why when nothing is left."""
    if "```" in text:
        return fenced(text)
    body = text.strip()
    return (body, "") if body else (None, "the answer is empty")


def check_new_text(new: str, current: str, max_chars: int) -> str:
    """Why ``new`` cannot replace ``current`` (``""`` when it can)."""
    if not new.strip():
        return "the new text is empty"
    if new.strip() == current.strip():
        return "the new text is identical to the current one"
    if len(new) > max_chars:
        return f"the new text has {len(new)} characters, over max_chars={max_chars}"
    return ""


def first_llm_call(traj: Any, role: str | None = None) -> Any:
    """The first LLM call of ``traj`` (of ``role`` when given), or ``None``."""
    for s in traj.steps:
        if getattr(s, "kind", None) == "llm" and (role is None or s.role == role):
            return s
    return None


def first_user(call: Any) -> str | None:
    for m in call.messages:
        if m.role == "user":
            return m.content
    return None


def show(value: Any) -> str:
    """An output as text: strings as they are, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
