"""Tool synthesis by an LLM from trajectories (LATM / Voyager style, validated like CRAFT).

The model is shown numbered tool calls recorded in successful and failed trajectories (what was
called, with which arguments, what came back or what error) and asked for one reusable Python
function plus tests, and for the examples it claims to reproduce: ``{"example": 3, "kwargs":
{...}}`` means "calling my tool with these arguments returns what example 3 returned". The
expected value of such a claim is taken from the trajectory, never from the model, so a tool
that passes only the tests its author wrote is caught when it disagrees with the world.

Parsing is done on the host with :mod:`ast` and :mod:`json` only (nothing the model wrote is
executed here); running happens in the sandbox (:func:`evolve.toolforge.validate.check`).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from evolve.errors import BudgetExhausted
from evolve.toolforge.tool import Tool, ToolCase, ToolLibrary
from evolve.types import Message, ToolCall, Trajectory

MAX_CODE_CHARS = 20_000

SYSTEM = (
    "You write small, reusable, deterministic Python tools for an agent. Standard library only. "
    "A tool is one top-level function with a docstring; it returns JSON values (numbers, strings, "
    "lists, dicts, None)."
)

INSTRUCTION = """Here are tool calls the agent made while solving tasks, with what came back.
{examples}

Tools it already has: {existing}

Write ONE new function that would let the agent solve tasks like the successful ones in fewer or
safer steps. Reply with exactly two fenced blocks:
```python
def name(param, ...):
    \"\"\"What it does, in one line.\"\"\"
    ...
```
```json
{{"tests": [{{"kwargs": {{...}}, "expect": ...}}],
 "reproduces": [{{"example": <number>, "kwargs": {{...}}}}],
 "reads": ["<params that are paths of files the tool reads>"]}}
```
"reproduces" lists examples above whose recorded result your function returns when called with
those kwargs."""


@dataclass
class Example:
    index: int
    task_id: str
    call: ToolCall
    success: bool

    def render(self) -> str:
        out = self.call.error if self.call.error else json.dumps(self.call.result)[:300]
        status = "task solved" if self.success else "task failed"
        args = json.dumps(self.call.args, ensure_ascii=False)[:400]
        return f"[{self.index}] ({status}) {self.call.name}({args}) -> {'ERROR ' if self.call.error else ''}{out}"


@dataclass
class Proposal:
    """One parsed answer: a tool and the recorded cases it claims, or why it was rejected."""

    raw: str
    tool: Tool | None = None
    claims: list[ToolCase] = field(default_factory=list)
    error: str | None = None


def collect_examples(
    trajectories: Sequence[Trajectory],
    *,
    threshold: float = 1.0,
    limit: int = 8,
    rng: Any = None,
    failed_share: float = 0.25,
) -> list[Example]:
    """Numbered tool calls from ``trajectories``: mostly from successes, some from failures."""
    good: list[tuple[str, ToolCall, bool]] = []
    bad: list[tuple[str, ToolCall, bool]] = []
    for t in trajectories:
        ok = t.error is None and t.score >= threshold
        for s in t.steps:
            if isinstance(s, ToolCall):
                (good if ok and s.error is None else bad).append((t.task_id, s, ok))
    if rng is not None:
        rng.shuffle(good)
        rng.shuffle(bad)
    n_bad = min(len(bad), int(round(limit * failed_share)))
    picked = good[: limit - n_bad] + bad[:n_bad]
    return [Example(i + 1, tid, call, ok) for i, (tid, call, ok) in enumerate(picked)]


def prompt(examples: Sequence[Example], library: ToolLibrary) -> list[Message]:
    existing = ", ".join(t.signature for t in library) or "none"
    text = INSTRUCTION.format(examples="\n".join(e.render() for e in examples), existing=existing)
    return [Message(role="system", content=SYSTEM), Message(role="user", content=text)]


def _block(text: str, lang: str) -> str | None:
    m = re.search(rf"```{lang}\s*\n(.*?)```", text, flags=re.S | re.I)
    return m.group(1) if m else None


def parse(raw: str, examples: Sequence[Example], *, provenance: dict | None = None) -> Proposal:
    """Turn the model's answer into a :class:`Tool` and its claimed recorded cases, or say why not."""
    p = Proposal(raw=raw)
    if not isinstance(raw, str) or not raw.strip():
        p.error = "empty answer"
        return p
    code = _block(raw, "python")
    spec_text = _block(raw, "json")
    if code is None or spec_text is None:
        p.error = "the answer needs a ```python block and a ```json block"
        return p
    if len(code) > MAX_CODE_CHARS:
        p.error = f"code is {len(code)} characters, over {MAX_CODE_CHARS}"
        return p
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        p.error = f"the code does not parse: {e.msg} (line {e.lineno})"
        return p
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    if not fns:
        p.error = "the code defines no top-level function"
        return p
    fn = fns[-1] if len(fns) > 1 and fns[-1].name != "_" else fns[0]
    a = fn.args
    if a.vararg or a.kwarg or a.posonlyargs:
        p.error = f"{fn.name}: use plain named parameters (no *args, **kwargs or positional-only)"
        return p
    params = tuple(x.arg for x in a.args + a.kwonlyargs)
    try:
        spec = json.loads(spec_text)
    except json.JSONDecodeError as e:
        p.error = f"the json block is not JSON: {e.msg}"
        return p
    if not isinstance(spec, dict):
        p.error = "the json block must be an object with tests and reproduces"
        return p
    by_index = {e.index: e for e in examples}
    try:
        tests = [
            ToolCase(kwargs=dict(c["kwargs"]), expect=c.get("expect"), source="test") for c in spec.get("tests", [])
        ]
        claims = []
        for c in spec.get("reproduces", []):
            ex = by_index.get(int(c["example"]))
            if ex is None:
                raise ValueError(f"claims example {c['example']}, which was not shown")
            if ex.call.error is not None:
                raise ValueError(f"claims example {ex.index}, which returned an error, not a value")
            claims.append(ToolCase(kwargs=dict(c["kwargs"]), expect=ex.call.result, source=f"recorded:{ex.task_id}"))
        reads = tuple(str(r) for r in spec.get("reads", []) if str(r) in params)
        tool = Tool(
            name=fn.name,
            params=params,
            doc=ast.get_docstring(fn) or "",
            code=code,
            function=fn.name,
            tests=tuple(tests),
            reads=reads,
            origin="llm",
            provenance=dict(provenance or {}),
        )
    except (KeyError, TypeError, ValueError) as e:
        p.error = f"malformed tool spec: {e}"[:300]
        return p
    p.tool, p.claims = tool, claims
    return p


def synthesize(
    llm: Any,
    trajectories: Sequence[Trajectory],
    library: ToolLibrary,
    *,
    n: int = 1,
    examples: int = 8,
    threshold: float = 1.0,
    rng: Any = None,
    temperature: float | None = None,
    max_tokens: int | None = 1024,
    provenance: dict | None = None,
) -> list[Proposal]:
    """Ask ``llm`` ``n`` times for a tool; the parsed proposals (rejected ones carry ``error``)."""
    exs = collect_examples(trajectories, threshold=threshold, limit=examples, rng=rng)
    if not exs:
        return []
    msgs = prompt(exs, library)
    prov = {**(provenance or {}), "examples": sorted({e.task_id for e in exs})}
    out = []
    for _ in range(n):
        try:
            raw = llm.complete(msgs, temperature=temperature, max_tokens=max_tokens).text
        except BudgetExhausted:  # the run's budget has no room for the call: the run stops, as it should
            raise
        except Exception as e:  # noqa: BLE001 - a failing model is a rejected proposal, not a crash
            out.append(Proposal(raw="", error=f"the model call failed: {type(e).__name__}: {e}"))
            continue
        out.append(parse(raw, exs, provenance=prov))
    return out
