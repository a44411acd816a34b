"""Keeping the library useful: dedup, retrieval by description, usage counts and retirement."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evolve.toolforge.tool import Tool, ToolCase, ToolLibrary, same
from evolve.types import ToolCall, Trajectory

# ----------------------------------------------------------------------------- dedup


def duplicate_of(
    tool: Tool, library: ToolLibrary, sandbox: Any = None, *, limits: Any = None
) -> tuple[str, str] | None:
    """The library tool ``tool`` duplicates and why, or None.

    Same code and parameters is a duplicate; so is the same SQL template; so is a tool with the
    same parameters that returns the same values as a library tool on the union of both tools'
    test inputs, run in the sandbox (behavioural equivalence on shared inputs). Two tools that
    each carry an SQL template are compared by template only: their recorded inputs often cannot
    tell them apart (``min`` and ``max`` agree whenever the filter keeps one row — seen on the
    SQL world), while different templates are different queries by construction."""
    for other in library:
        if other.behaviour_key == tool.behaviour_key:
            return other.name, "same code"
        if tool.meta.get("template") and tool.meta.get("template") == other.meta.get("template"):
            return other.name, "same SQL template"
    if sandbox is None:
        return None
    from evolve.toolforge.validate import run_cases

    for other in library:
        if set(other.params) != set(tool.params) or (tool.meta.get("template") and other.meta.get("template")):
            continue
        inputs = [c.kwargs for c in tool.tests + other.tests]
        uniq = list({repr(sorted(k.items())): k for k in inputs}.values())[:12]
        if not uniq:
            continue
        cases = [ToolCase(kwargs=k) for k in uniq]
        a, b = run_cases(tool, cases, sandbox, limits), run_cases(other, cases, sandbox, limits)
        if all(x.ok and y.ok and same(x.value, y.value) for x, y in zip(a, b)):
            return other.name, f"same results as {other.name} on {len(uniq)} shared inputs"
    return None


# ----------------------------------------------------------------------------- usage


def usage(
    trajectories: Sequence[Trajectory], names: Sequence[str], *, threshold: float = 1.0
) -> dict[str, tuple[int, int]]:
    """name -> (calls, calls in successful trajectories) over ``trajectories``."""
    wanted, out = set(names), {n: [0, 0] for n in names}
    for t in trajectories:
        ok = t.error is None and t.score >= threshold
        for s in t.steps:
            if isinstance(s, ToolCall) and s.name in wanted:
                out[s.name][0] += 1
                out[s.name][1] += int(ok)
    return {n: (u, w) for n, (u, w) in out.items()}


def with_usage(library: ToolLibrary, trajectories: Sequence[Trajectory], *, threshold: float = 1.0) -> ToolLibrary:
    """The library with each tool's ``uses`` and ``successes`` increased by what ``trajectories`` show."""
    counts = usage(trajectories, library.names(), threshold=threshold)
    return ToolLibrary(
        {
            n: t.model_copy(update={"uses": t.uses + counts[n][0], "successes": t.successes + counts[n][1]})
            for n, t in library.tools.items()
        }
    )


@dataclass
class Retirement:
    name: str
    reason: str


def retirements(
    library: ToolLibrary,
    trajectories: Sequence[Trajectory],
    *,
    generation: int,
    patience: int = 2,
    min_uses: int = 10,
    margin: float = 0.1,
    threshold: float = 1.0,
) -> list[Retirement]:
    """Tools to retire: never used ``patience`` generations after admission, or used at least
    ``min_uses`` times with a success rate more than ``margin`` below the success rate of the
    trajectories that did not use it (the tool lowers success)."""
    out = []
    runs = [
        (t, {s.name for s in t.steps if isinstance(s, ToolCall)}, t.error is None and t.score >= threshold)
        for t in trajectories
    ]
    for tool in library:
        born = int(tool.provenance.get("generation", 0) or 0)
        if tool.uses == 0 and generation - born >= patience:
            out.append(Retirement(tool.name, f"unused for {generation - born} generations since admission"))
            continue
        if tool.uses >= min_uses:
            with_t = [ok for _, used, ok in runs if tool.name in used]
            without = [ok for _, used, ok in runs if tool.name not in used]
            rate_used = tool.successes / tool.uses
            if with_t and without:
                rate_without = sum(without) / len(without)
                if rate_used < rate_without - margin:
                    out.append(
                        Retirement(
                            tool.name,
                            f"success {rate_used:.2f} when used vs {rate_without:.2f} "
                            f"without it, over {tool.uses} uses",
                        )
                    )
    return out


def retire_names(library: ToolLibrary, trajectories: Sequence[Trajectory], **kwargs: Any) -> set[str]:
    return {r.name for r in retirements(library, trajectories, **kwargs)}


# retrieval lives in evolve.toolforge.retrieve (validation uses it too); importable from here as before
from evolve.toolforge.retrieve import default_embedder, hash_word, lexical_embed, minilm_embed, retrieve  # noqa: E402,F401
