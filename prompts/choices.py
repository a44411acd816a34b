"""The ``prompt_choice`` operator: a search over alternatives the user declares for prompt
components — a prompt template, a schema rendering, an output format, a set of instructions to
A/B — judged by the engine like every other child (minibatch, then validation, Pareto pool).

Where DSPy's optimisers search the two things a DSPy program exposes (instructions and demos),
a system here carries typed components (:mod:`evolve.prompts.components`), and which layout of
the prompt a model reads best is often the choice that matters most to a small model. The
alternatives are listed in the task file::

    operators:
      - name: prompt_choice
        params:
          choices:
            template: ["{schema}\\nq: {question}", "{schema_linked}\\nq: {question}"]
          children: 2

Each proposal, for one parent: every (component, alternative) whose value differs from the
parent's (an empty alternative stands for the component left out, the agent's default), in
``ctx.rng`` order, skipping a child the archive already holds (it was judged: the
engine would drop it) when ``ctx.extra["known"]`` says so; the first ``children`` become
children, each differing from the parent in that one component. Combined with other operators
under one engine, a lineage can change its template in one generation and its demos in the
next. It makes no LLM calls and no rollouts of its own. (The ``scripted`` operator in
:mod:`evolve.loop.operators` is the test fixture this generalises: one text component, no logging.) Everything is logged to
``prompt_choice.json`` in the work directory.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evolve.loop.operators import OperatorContext
from evolve.prompts._common import OperatorLog, clip
from evolve.prompts.components import (
    JSON_KINDS,
    components,
    dump_json,
    get_text,
    parse_name,
    remove,
    set_text,
)
from evolve.types import Candidate, System


def _text(name: str, value: Any) -> str:
    """An alternative as the component's text: JSON kinds in canonical form (given as text or as
    YAML structure), an empty JSON list or object as ``""`` (the component left out)."""
    kind = parse_name(name)[1]
    if kind in JSON_KINDS:
        if isinstance(value, str) and value.strip():
            components({name: value})  # the kind's own checks (JSON shape of demos and mutators)
            value = json.loads(value)
        if value in ("", [], {}):
            return ""
        value = dump_json(value)
    if not isinstance(value, str):
        raise ValueError(f"choices[{name!r}]: an alternative must be text, not {type(value).__name__} ({value!r})")
    components({name: value})
    return value


class PromptChoice:
    name = "prompt_choice"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        choices: dict[str, list[Any]] = Field(description="prompt component name -> its alternative values")
        children: int = Field(2, ge=1, description="children per proposal")
        checks: dict[str, str] = Field(
            default_factory=dict,
            description="component name -> import path of a "
            "function that raises on an alternative the agent cannot use, run at load "
            "(e.g. evolve.worlds.sql.render:check_template)",
        )

        @field_validator("choices")
        @classmethod
        def _choices(cls, v: dict[str, list[Any]]) -> dict[str, list[str]]:
            if not v or not any(v.values()):
                raise ValueError(
                    "give at least one component with alternatives, e.g. "
                    "{template: ['{schema}\\nq: {question}', '{schema_linked}\\nq: {question}']}"
                )
            out: dict[str, list[str]] = {}
            seen: dict[tuple[str, str], str] = {}
            for name, values in v.items():
                key = parse_name(name)
                if key in seen:
                    raise ValueError(
                        f"choices names one component twice: {seen[key]!r} and {name!r}; "
                        f"list all its alternatives under one of them"
                    )
                seen[key] = name
                texts = [_text(name, x) for x in values]
                if len(set(texts)) < len(texts):
                    raise ValueError(f"choices[{name!r}] lists the same alternative twice")
                out[name] = texts
            return out

        @model_validator(mode="after")
        def _checked(self) -> PromptChoice.Params:
            from evolve.registry import import_path

            for name, path in self.checks.items():
                if name not in self.choices:
                    raise ValueError(
                        f"checks names {name!r}, which has no choices "
                        f"(components with choices: {', '.join(self.choices)})"
                    )
                check = import_path(path, what=f"prompt_choice checks[{name!r}]")
                for value in self.choices[name]:
                    if not value:
                        continue  # the component left out: the agent's default
                    try:
                        check(value)
                    except Exception as e:  # noqa: BLE001 - reported with the alternative it refused
                        raise ValueError(f"{path} refuses the alternative {value!r} of {name!r}: {e}") from None
            return self

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)

    def estimate(self, plan: Any) -> dict[str, int]:
        """Per proposal: no rollouts and no calls of its own; at most ``children`` children (every
        alternative, when the parent's value is none of them)."""
        alternatives = sum(len(v) for v in self.p.choices.values())
        return {"rollouts": 0, "llm_calls": 0, "children": min(self.p.children, alternatives)}

    def propose(self, parent: System, ctx: OperatorContext) -> list[Candidate]:
        log = OperatorLog(self.name, parent, ctx)
        known = (getattr(ctx, "extra", None) or {}).get("known")
        try:
            options = []
            for name, values in self.p.choices.items():
                step, kind = parse_name(name)
                current = get_text(parent, kind, step, default="")
                if kind in JSON_KINDS and current:
                    try:
                        current = _text(name, current)
                    except ValueError:
                        pass  # a parent with a malformed value: every alternative differs from it
                options += [(name, i, v) for i, v in enumerate(values) if v != current]
            ctx.rng.shuffle(options)
            out: list[Candidate] = []
            for name, i, value in options:
                if len(out) >= self.p.children:
                    break
                step, kind = parse_name(name)
                # "" is the component left out: the agent's default, the same system as one without it
                system = set_text(parent, kind, value, step) if value else remove(parent, kind, step)
                if known is not None and known(system.id):
                    log.reject(f"{name} alternative {i}: already in the archive (judged before)")
                    continue
                n = len(self.p.choices[name])
                rationale = f"{name}: alternative {i + 1} of {n}: {clip(value, 80)!r}"
                info = {"component": name, "alternative": i}
                log.child(system, rationale, **info)
                out.append(
                    Candidate(system=system, parents=(parent.id,), operator=self.name, rationale=rationale, info=info)
                )
            if not out:
                log.note("every alternative is the parent's value or was judged before")
            return out
        finally:
            log.write()
