"""Generic workflow node types: ``llm``, ``tool``, ``check``, ``vote``, ``reflect``, ``answer``.

They follow the protocol in :mod:`evolve.topology.runtime` and are registered in
:data:`evolve.registry.node_types`. Multi-agent shapes are graphs of several ``llm`` nodes with
different roles and prompts: solver → judge, planner → executor, two debaters and a judge.

Prompt templates use ``{name}`` placeholders filled from the state first, then from the task's
fields, then from the system's prompt components (``System.prompts``), so an evolved
instruction can be pulled into a step with ``{instruction}``. ``{task[question]}`` indexes too;
write ``{{`` and ``}}`` for literal braces. A placeholder found nowhere is an error naming it.
"""

from __future__ import annotations

import string
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evolve.topology.graph import compile_condition, condition_holds
from evolve.types import Message, canonical_json


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _condition(v: str | None) -> str | None:
    if v is not None:
        compile_condition(v)
    return v


class _Fields(Mapping):
    """Template lookup: state, then task fields, then prompt components, then ``extra``."""

    def __init__(self, state: dict, rt: Any, extra: Mapping[str, Any] | None = None) -> None:
        task = state.get("task")
        self._layers = [
            extra or {},
            state,
            task if isinstance(task, Mapping) else {},
            dict(getattr(rt.ctx.system, "prompts", None) or {}),
        ]

    def __getitem__(self, key: str) -> Any:
        for layer in self._layers:
            if key in layer:
                return layer[key]
        raise KeyError(key)

    def __iter__(self):
        seen: set = set()
        for layer in self._layers:
            for k in layer:
                if k not in seen:
                    seen.add(k)
                    yield k

    def __len__(self) -> int:
        return sum(1 for _ in self)


def fill(template: str, state: dict, rt: Any, extra: Mapping[str, Any] | None = None) -> str:
    """Fill ``{name}`` placeholders (see the module docstring); a missing name raises KeyError."""
    fields = _Fields(state, rt, extra)
    for _, name, _, _ in string.Formatter().parse(template):
        if name:
            root = name.split("[", 1)[0].split(".", 1)[0]
            if root and root not in fields:
                known = sorted(k for k in fields if not str(k).startswith("_"))
                raise KeyError(
                    f"prompt placeholder {{{root}}} is not a state key, a task field or a prompt "
                    f"component; known: {known}"
                )
    return template.format_map(fields)


def _system_message(rt: Any, name: str | None) -> list[Message]:
    if name is None:
        return []
    prompts = getattr(rt.ctx.system, "prompts", None) or {}
    if name not in prompts:
        raise KeyError(f"system prompt component {name!r} is not in the system's prompts {sorted(prompts)}")
    return [Message(role="system", content=prompts[name])]


def _lookup(state: dict, key: str) -> Any:
    if key in state:
        return state[key]
    task = state.get("task")
    if isinstance(task, Mapping) and key in task:
        return task[key]
    raise KeyError(f"{key!r} is neither a state key nor a task field")


def _resolve(path: str, what: str) -> Callable:
    from evolve.registry import import_path

    fn = import_path(path, what=what)
    if not callable(fn):
        raise TypeError(f"{what} {path!r} is not callable")
    return fn


# ----------------------------------------------------------------------------- llm


class LLMStep:
    """``llm``: one model call. The prompt template becomes the user message (after the system
    message, when ``system`` names a prompt component, and after the conversation so far when
    ``history`` is set); the reply goes to ``state[out]``."""

    calls_model = True

    class Params(_Params):
        role: str = Field("policy", description="the system's model role")
        prompt: str = Field(..., description="user message template, e.g. 'Solve: {question}'")
        system: str | None = Field(None, description="a prompt component used as the system message")
        history: bool = Field(False, description="send state['messages'] and extend it with this turn")
        out: str = "text"
        max_tokens: int | None = Field(None, ge=1)
        temperature: float | None = Field(None, ge=0.0, le=5.0)
        stop: list[str] | None = None

    def run(self, p: LLMStep.Params, state: dict, rt: Any) -> dict:
        user = Message(role="user", content=fill(p.prompt, state, rt))
        past = list(state.get("messages") or []) if p.history else []
        messages = _system_message(rt, p.system) + past + [user]
        out = rt.llm(p.role).complete(
            messages, temperature=rt.temperature(state, p.temperature), max_tokens=p.max_tokens, stop=p.stop
        )
        updates: dict[str, Any] = {p.out: out.text}
        if p.history:
            updates["messages"] = past + [user, Message(role="assistant", content=out.text)]
        return updates


# ----------------------------------------------------------------------------- tool


class ToolStep:
    """``tool``: call trusted code named by import path (task-file code, e.g.
    ``my_task:lookup``), recorded through ``ctx.tool``. Model-written tools do not run here:
    they go through the toolforge library and the sandbox. ``args`` maps each argument to a state
    key (or task field), or to ``{"const": value}``. With ``error_key`` an exception is stored
    there as text (and ``out`` set to None) instead of failing the run."""

    calls_model = False

    class Params(_Params):
        fn: str = Field(..., description="import path 'package.module:function'")
        args: dict[str, str | dict[str, Any]] = Field(default_factory=dict)
        out: str = "result"
        name: str | None = Field(None, description="the tool name in the trajectory (default: the function's)")
        error_key: str | None = None

        @field_validator("args")
        @classmethod
        def _args(cls, v: dict) -> dict:
            for k, spec in v.items():
                if isinstance(spec, dict) and set(spec) != {"const"}:
                    raise ValueError(f"arg {k!r}: give a state key or {{'const': value}}, not {sorted(spec)}")
            return v

    def run(self, p: ToolStep.Params, state: dict, rt: Any) -> dict:
        fn = _resolve(p.fn, "tool function")
        args = {k: (spec["const"] if isinstance(spec, dict) else _lookup(state, spec)) for k, spec in p.args.items()}
        name = p.name or getattr(fn, "__name__", p.fn)
        if p.error_key is None:
            return {p.out: rt.ctx.tool(name, fn, **args)}
        try:
            return {p.out: rt.ctx.tool(name, fn, **args), p.error_key: None}
        except Exception as e:  # noqa: BLE001 - asked to keep the error as data
            return {p.out: None, p.error_key: f"{type(e).__name__}: {e}"}


# ----------------------------------------------------------------------------- check


class CheckStep:
    """``check``: a condition (``expr``, see :func:`~evolve.topology.graph.condition_holds`) or
    trusted code ``fn(state) -> bool | str | (bool, str)``. Sets ``state[out]`` to the verdict.
    A string from ``fn`` is feedback: empty means the check passed, text means it failed and is
    written to ``state[feedback]`` (cleared to None when the check passes)."""

    calls_model = False

    class Params(_Params):
        expr: str | None = None
        fn: str | None = None
        out: str = "ok"
        feedback: str = "feedback"

        @field_validator("expr")
        @classmethod
        def _expr(cls, v: str | None) -> str | None:
            return _condition(v)

        @model_validator(mode="after")
        def _one(self) -> CheckStep.Params:
            if (self.expr is None) == (self.fn is None):
                raise ValueError("give exactly one of expr (a condition) or fn (an import path)")
            return self

    def run(self, p: CheckStep.Params, state: dict, rt: Any) -> dict:
        if p.expr is not None:
            return {p.out: condition_holds(p.expr, state)}
        assert p.fn is not None  # the params give exactly one of expr and fn
        got = _resolve(p.fn, "check function")(state)
        note: str | None = None
        if isinstance(got, tuple) and len(got) == 2:
            verdict, note = bool(got[0]), (str(got[1]) if got[1] else None)
        elif isinstance(got, str):
            verdict, note = not got.strip(), got or None
        else:
            verdict = bool(got)
        return {p.out: verdict, p.feedback: None if verdict and not note else note}


# ----------------------------------------------------------------------------- vote


def _vote_key(value: Any) -> str:
    from evolve.rollout import jsonable

    return canonical_json(jsonable(value))


class VoteStep:
    """``vote``: self-consistency. Runs ``chain`` (once per node, in order) ``n`` times, each on
    a copy of the state with ``_temperature`` set, and keeps the sample whose ``state[key]``
    (compared as canonical JSON) is most common. Samples where ``exclude_when`` holds do not vote,
    unless all do. Ties go to the earliest sample. Copies ``keep`` (default: every key the chain
    changed) from the winner and writes ``votes`` (the winner's count) and ``samples`` (n).
    ``parallel`` > 1 runs that many samples at once (a hosted model's latency, or one batch for
    the local model), each in a fork of the rollout: see :meth:`Runtime.run_chains`."""

    calls_model = False

    class Params(_Params):
        chain: list[str] = Field(..., min_length=1, description="node ids run in order per sample")
        n: int = Field(5, ge=2, le=32)
        temperature: float = Field(0.8, ge=0.0, le=5.0)
        key: str = Field(..., description="the state key voted on")
        exclude_when: str | None = None
        keep: list[str] | None = None
        parallel: int = Field(
            1,
            ge=1,
            le=32,
            description="samples run at once; above 1 each sample runs in a "
            "fork of the rollout with its own seed (deterministic, but not the samples a "
            "sequential vote draws)",
        )

        @field_validator("exclude_when")
        @classmethod
        def _cond(cls, v: str | None) -> str | None:
            return _condition(v)

    @staticmethod
    def refs(params: dict) -> list[str]:
        chain = params.get("chain") if isinstance(params, Mapping) else getattr(params, "chain", None)
        return [str(x) for x in chain or []]

    @staticmethod
    def ref_runs(params: dict) -> int:
        return int((params or {}).get("n", 5))

    def run(self, p: VoteStep.Params, state: dict, rt: Any) -> dict:
        starts = [{**state, "_temperature": p.temperature} for _ in range(p.n)]
        samples = rt.run_chains(p.chain, starts, p.parallel)
        voters = [i for i, s in enumerate(samples) if not (p.exclude_when and condition_holds(p.exclude_when, s))]
        if not voters:
            voters = list(range(len(samples)))
        keys = {i: _vote_key(samples[i].get(p.key)) for i in voters}
        counts = Counter(keys[i] for i in voters)
        best = max(counts.values())
        winner = next(i for i in voters if counts[keys[i]] == best)  # earliest sample among the tied
        chosen = samples[winner]
        if p.keep is not None:
            keep = list(p.keep)
        else:
            keep = [
                k for k, v in chosen.items() if not str(k).startswith("_") and (k not in state or state[k] is not v)
            ]
        updates = {k: chosen.get(k) for k in keep}
        updates.update({"votes": best, "samples": p.n})
        return updates


# ----------------------------------------------------------------------------- reflect

REFLECT_PROMPT = (
    "Task:\n{task_text}\n\nYour last answer:\n{last}\n\nWhat went wrong:\n{feedback}\n\n"
    "In two or three sentences, say what the mistake was and what to do differently next time."
)


class ReflectStep:
    """``reflect``: one model call that writes a lesson to ``state[out]`` (``reflection``). The
    default template shows the task (``{task_text}``: its question, else its JSON), the last
    output (``{last}``: ``state[last]``) and the feedback (``{feedback}``: ``state["feedback"]``,
    else ``state["error"]``)."""

    calls_model = True

    class Params(_Params):
        role: str = "policy"
        prompt: str = REFLECT_PROMPT
        system: str | None = None
        last: str = Field("text", description="the state key holding the last output")
        out: str = "reflection"
        max_tokens: int | None = Field(None, ge=1)
        temperature: float | None = Field(None, ge=0.0, le=5.0)

    def run(self, p: ReflectStep.Params, state: dict, rt: Any) -> dict:
        task = state.get("task") or {}
        task_text = (
            task.get("question") or task.get("q") or canonical_json({k: v for k, v in task.items() if k != "id"})
            if isinstance(task, Mapping)
            else str(task)
        )
        last = state.get(p.last)
        feedback = state.get("feedback") or state.get("error") or "(no feedback was given)"
        extra = {"task_text": task_text, "last": "(nothing)" if last is None else last, "feedback": feedback}
        messages = _system_message(rt, p.system) + [Message(role="user", content=fill(p.prompt, state, rt, extra))]
        out = rt.llm(p.role).complete(
            messages, temperature=rt.temperature(state, p.temperature), max_tokens=p.max_tokens, stop=None
        )
        return {p.out: out.text}


# ----------------------------------------------------------------------------- answer


class AnswerStep:
    """``answer``: ``state[out] = state[key]``, or a dict of ``fields``."""

    calls_model = False

    class Params(_Params):
        key: str | None = None
        fields: list[str] | None = None
        out: str = "answer"

        @model_validator(mode="after")
        def _one(self) -> AnswerStep.Params:
            if (self.key is None) == (self.fields is None):
                raise ValueError("give exactly one of key (a state key) or fields (a list of state keys)")
            return self

    def run(self, p: AnswerStep.Params, state: dict, rt: Any) -> dict:
        if p.key is not None:
            return {p.out: state.get(p.key)}
        return {p.out: {k: state.get(k) for k in p.fields or []}}


__all__ = ["AnswerStep", "CheckStep", "LLMStep", "REFLECT_PROMPT", "ReflectStep", "ToolStep", "VoteStep", "fill"]
