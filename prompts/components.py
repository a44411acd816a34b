"""Prompt components: the named parts of a system's context C in ``System.prompts``.

``System.prompts`` stays a plain ``dict[str, str]``; this module gives it a convention and
typed access. A component's name is ``"<step>.<kind>"``, or a bare ``"<kind>"`` for the
default step ``"policy"`` (so ``"instruction"`` and ``"policy.instruction"`` name the same
thing; the bare spelling is what the shipped agents read). The kinds:

* ``instruction`` — the instruction text of the step;
* ``demos`` — few-shot demonstrations, JSON text: ``[{"input": ..., "output": ...}, ...]``
  (objects of other fields, such as a DSPy signature's, are accepted too);
* ``format`` — output-format rules;
* ``template`` — a prompt template the agent fills in;
* ``mutator`` — PromptBreeder mutation prompts, JSON text: ``["...", ...]``. They are kept
  in the system so that they evolve with it, are archived with it and survive a resume;
* ``task`` — a description of the task (read by zero-order prompt generation; not evolved).

Every getter and setter takes a :class:`~evolve.types.System` or a prompts dict; setters
return a new object of the same type (systems are immutable). A bad kind or invalid JSON
raises :class:`ComponentError` naming the component and the fix.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from evolve.errors import UserError
from evolve.types import System

KINDS = ("instruction", "demos", "format", "template", "mutator", "task")
JSON_KINDS = ("demos", "mutator")
DEFAULT_STEP = "policy"

Prompts = System | Mapping[str, str]
P = TypeVar("P", System, dict)


class ComponentError(UserError, ValueError):
    """A prompt component is misnamed or holds a value of the wrong shape."""


@dataclass(frozen=True)
class Component:
    """One prompt component: ``name`` is the key in ``System.prompts``, ``value`` its text."""

    step: str
    kind: str
    name: str
    value: str

    @property
    def data(self) -> Any:
        """The parsed value: a list for ``demos`` / ``mutator``, the text for other kinds."""
        if self.kind == "demos":
            return _parse_demos(self.name, self.value)
        if self.kind == "mutator":
            return _parse_mutators(self.name, self.value)
        return self.value


# ----------------------------------------------------------------------------- names


def parse_name(name: str) -> tuple[str, str]:
    """``"planner.instruction"`` -> ``("planner", "instruction")``; ``"demos"`` -> ``("policy", "demos")``."""
    step, dot, kind = name.rpartition(".")
    if not dot:
        step = DEFAULT_STEP
    if not kind or (dot and not step):
        raise ComponentError(
            f"prompt component {name!r}: a name is '<step>.<kind>' or '<kind>', "
            f"e.g. 'policy.instruction' or 'instruction'"
        )
    if kind not in KINDS:
        close = difflib.get_close_matches(kind, KINDS, n=1)
        hint = f"did you mean {step + '.' if dot else ''}{close[0]}? " if close else ""
        raise ComponentError(
            f"prompt component {name!r}: unknown kind {kind!r}; {hint}kinds are "
            f"{', '.join(KINDS)} (rename the key to '<step>.<kind>', e.g. 'policy.instruction')"
        )
    return step, kind


def component_name(kind: str, step: str = DEFAULT_STEP) -> str:
    """The canonical key: the bare kind for the default step, else ``"<step>.<kind>"``."""
    name = kind if step == DEFAULT_STEP else f"{step}.{kind}"
    parse_name(name)
    return name


def _prompts(x: Prompts) -> dict[str, str]:
    return dict(x.prompts) if isinstance(x, System) else dict(x)


def find(x: Prompts, kind: str, step: str = DEFAULT_STEP) -> str | None:
    """The key under which ``x`` stores (step, kind), in either spelling; ``None`` when absent."""
    prompts = _prompts(x)
    for name in (component_name(kind, step), f"{step}.{kind}"):
        if name in prompts:
            return name
    return None


# ----------------------------------------------------------------------------- whole view


def components(x: Prompts) -> dict[str, Component]:
    """Every component of a system (or prompts dict), validated: kinds known, JSON kinds parse."""
    out: dict[str, Component] = {}
    seen: dict[tuple[str, str], str] = {}
    for name, value in _prompts(x).items():
        step, kind = parse_name(name)
        if (step, kind) in seen:
            raise ComponentError(
                f"prompt components {seen[(step, kind)]!r} and {name!r} name the same "
                f"component ({step}.{kind}); keep one of them"
            )
        seen[(step, kind)] = name
        if not isinstance(value, str):
            raise ComponentError(f"prompt component {name!r} must be text, not {type(value).__name__}")
        comp = Component(step=step, kind=kind, name=name, value=value)
        _validate(comp)
        out[name] = comp
    return out


# ----------------------------------------------------------------------------- JSON kinds


def _validate(comp: Component) -> None:
    """Raise :class:`ComponentError` when a JSON kind's value does not parse to its shape."""
    if comp.kind in JSON_KINDS:
        _ = comp.data


def _parse_json(name: str, text: str, shape: str) -> Any:
    if not text.strip():
        return []
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        setter = "set_demos" if name.rpartition(".")[2] == "demos" else "set_mutators"
        raise ComponentError(
            f"prompt component {name!r} is not valid JSON ({e.msg} at line {e.lineno} column "
            f"{e.colno}); it must be a JSON list of {shape}: write it with {setter}() "
            f"or json.dumps"
        ) from None


def _parse_demos(name: str, text: str) -> list[dict[str, Any]]:
    data = _parse_json(name, text, '{"input": ..., "output": ...} objects')
    return check_demos(data, name)


def check_demos(data: Any, name: str = "demos") -> list[dict[str, Any]]:
    """Validate demos: a list of JSON objects. The operators write ``{"input", "output"}`` objects
    (strings); other fields are kept, and objects of other fields (e.g. a DSPy signature's,
    ``{"question", "answer"}``, see :mod:`evolve.prompts.dspy_interop`) are accepted too."""
    fix = 'it must be a JSON list of objects, e.g. [{"input": "...", "output": "..."}]'
    if not isinstance(data, list):
        raise ComponentError(f"prompt component {name!r} holds a {type(data).__name__}; {fix}")
    for i, d in enumerate(data):
        if not isinstance(d, dict) or not d:
            raise ComponentError(f"prompt component {name!r}: demo {i} is {json.dumps(d)[:80]}; {fix}")
    return [dict(d) for d in data]


def is_io_demo(demo: Any) -> bool:
    """A demo in the operators' shape: ``input`` and ``output`` strings."""
    return isinstance(demo, dict) and isinstance(demo.get("input"), str) and isinstance(demo.get("output"), str)


def _parse_mutators(name: str, text: str) -> list[str]:
    data = _parse_json(name, text, "strings (mutation prompts)")
    return check_mutators(data, name)


def check_mutators(data: Any, name: str = "mutator") -> list[str]:
    """Validate mutation prompts: a list of non-empty strings."""
    if not isinstance(data, list) or not all(isinstance(s, str) and s.strip() for s in data):
        raise ComponentError(
            f"prompt component {name!r} must be a JSON list of non-empty strings "
            f'(mutation prompts), e.g. ["Rewrite the instruction more clearly:"]'
        )
    return list(data)


# ----------------------------------------------------------------------------- getters / setters


def get_text(x: Prompts, kind: str, step: str = DEFAULT_STEP, default: str = "") -> str:
    key = find(x, kind, step)
    return _prompts(x)[key] if key is not None else default


def set_text(x: P, kind: str, value: str, step: str = DEFAULT_STEP) -> P:
    """Set (step, kind) to ``value`` (kept under its existing key, else the canonical one)."""
    if not isinstance(value, str):
        raise ComponentError(
            f"prompt component {component_name(kind, step)!r} must be text, not {type(value).__name__}"
        )
    key = find(x, kind, step) or component_name(kind, step)
    if kind in JSON_KINDS:
        _validate(Component(step, kind, key, value))
    prompts = {**_prompts(x), key: value}
    return x.replace(prompts=prompts) if isinstance(x, System) else prompts


def remove(x: P, kind: str, step: str = DEFAULT_STEP) -> P:
    key = find(x, kind, step)
    prompts = {k: v for k, v in _prompts(x).items() if k != key}
    return x.replace(prompts=prompts) if isinstance(x, System) else prompts


def get_instruction(x: Prompts, step: str = DEFAULT_STEP) -> str:
    return get_text(x, "instruction", step)


def set_instruction(x: P, value: str, step: str = DEFAULT_STEP) -> P:
    return set_text(x, "instruction", value, step)


def get_format(x: Prompts, step: str = DEFAULT_STEP) -> str:
    return get_text(x, "format", step)


def set_format(x: P, value: str, step: str = DEFAULT_STEP) -> P:
    return set_text(x, "format", value, step)


def get_template(x: Prompts, step: str = DEFAULT_STEP) -> str:
    return get_text(x, "template", step)


def set_template(x: P, value: str, step: str = DEFAULT_STEP) -> P:
    return set_text(x, "template", value, step)


def get_task(x: Prompts, step: str = DEFAULT_STEP) -> str:
    return get_text(x, "task", step)


def get_demos(x: Prompts, step: str = DEFAULT_STEP) -> list[dict[str, Any]]:
    key = find(x, "demos", step)
    return _parse_demos(key, _prompts(x)[key]) if key is not None else []


def set_demos(x: P, demos: list[dict[str, Any]], step: str = DEFAULT_STEP) -> P:
    name = component_name("demos", step)
    return set_text(x, "demos", dump_json(check_demos(list(demos), name)), step)


def get_mutators(x: Prompts, step: str = DEFAULT_STEP) -> list[str] | None:
    """The step's mutation prompts, or ``None`` when the system carries none yet."""
    key = find(x, "mutator", step)
    return _parse_mutators(key, _prompts(x)[key]) if key is not None else None


def set_mutators(x: P, mutators: list[str], step: str = DEFAULT_STEP) -> P:
    name = component_name("mutator", step)
    return set_text(x, "mutator", dump_json(check_mutators(list(mutators), name)), step)


def dump_json(value: Any) -> str:
    """The JSON text stored for JSON kinds: stable (one item per line, UTF-8 kept), so diffs read well."""
    if isinstance(value, list) and value:
        return "[\n" + ",\n".join(json.dumps(v, ensure_ascii=False, sort_keys=True) for v in value) + "\n]"
    return json.dumps(value, ensure_ascii=False)


# ----------------------------------------------------------------------------- rendering and diffs


def render_demos(demos: list[dict[str, Any]], *, input_label: str = "Input", output_label: str = "Output") -> str:
    """Demos as few-shot text: numbered blocks of ``Input:`` / ``Output:`` lines separated by blank
    lines (a demo of other fields shows each field, capitalised, in its order)."""
    blocks = []
    for i, d in enumerate(check_demos(list(demos))):
        if is_io_demo(d):
            fields = [(input_label, d["input"]), (output_label, d["output"])]
        else:
            fields = [(str(k).replace("_", " ").capitalize(), v) for k, v in d.items()]
        lines = [f"{label}: {v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}" for label, v in fields]
        blocks.append(f"Example {i + 1}\n" + "\n".join(lines))
    return "\n\n".join(blocks)


def _lines(name: str, text: str | None) -> list[str]:
    if text is None:
        return []
    try:
        kind = parse_name(name)[1]
    except ComponentError:
        kind = ""
    if kind in JSON_KINDS and text.strip():
        try:  # compare JSON kinds item by item, whatever their spacing
            text = dump_json(json.loads(text))
        except json.JSONDecodeError:
            pass
    return text.splitlines(keepends=False)


def diff_prompts(a: Prompts, b: Prompts, *, context: int = 3) -> list[str]:
    """One unified diff (``difflib``) per component that differs between ``a`` and ``b``, by name.

    A component present on one side only diffs against nothing (``/dev/null``)."""
    pa, pb = _prompts(a), _prompts(b)
    out = []
    for name in sorted(set(pa) | set(pb)):
        va, vb = pa.get(name), pb.get(name)
        if va == vb:
            continue
        la, lb = _lines(name, va), _lines(name, vb)
        if la == lb:  # JSON that differs in spacing only: show the raw text
            la, lb = (va or "").splitlines(), (vb or "").splitlines()
        diff = difflib.unified_diff(
            la,
            lb,
            fromfile=f"a/{name}" if va is not None else "/dev/null",
            tofile=f"b/{name}" if vb is not None else "/dev/null",
            n=context,
            lineterm="",
        )
        out.append("\n".join(diff))
    return out


__all__ = [
    "DEFAULT_STEP",
    "JSON_KINDS",
    "KINDS",
    "Component",
    "ComponentError",
    "check_demos",
    "check_mutators",
    "component_name",
    "components",
    "diff_prompts",
    "dump_json",
    "find",
    "get_demos",
    "get_format",
    "get_instruction",
    "get_mutators",
    "get_task",
    "get_template",
    "get_text",
    "is_io_demo",
    "parse_name",
    "remove",
    "render_demos",
    "set_demos",
    "set_format",
    "set_instruction",
    "set_mutators",
    "set_template",
    "set_text",
]
