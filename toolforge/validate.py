"""Admission: a tool runs in the sandbox against its own tests and against the recorded outputs it
claims to reproduce; only a tool that passes every case is admitted. And the runtime that lets
an agent call admitted tools, always in the sandbox, recorded in its trajectory."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve.toolforge.tool import Tool, ToolCase, ToolLibrary, same

DEFAULT_LIMITS = {
    "wall_s": 5.0,
    "cpu_s": 5,
    "memory_mb": 256,
    "max_procs": 16,
    "file_size_mb": 4,
    "output_bytes": 200_000,
}


def make_limits(**overrides: Any):
    from evolve.sandbox import Limits

    return Limits(**{**DEFAULT_LIMITS, **overrides})


def evolvekit_cache() -> Path:
    """evolvekit's own cache (generated databases, SFT weights): ``$EVOLVE_CACHE_DIR`` or ``~/.cache/evolvekit``."""
    root = os.environ.get("EVOLVE_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "evolvekit"


def default_sandbox(backend: str = "process", **options: Any) -> Any:
    """The sandbox tools run in. The process backend may mount files from evolvekit's own cache
    (the SQL world's databases live there, inside the home directory it otherwise refuses)."""
    from evolve.sandbox import get_sandbox

    if backend == "process":
        options.setdefault("data_roots", [str(evolvekit_cache())])
    return get_sandbox(backend, **options)


def read_paths(tool: Tool, kwargs: dict) -> list[str]:
    out = []
    for p in tool.reads:
        v = kwargs.get(p)
        if isinstance(v, str) and v and os.path.exists(v):
            out.append(str(Path(v).resolve()))
    return sorted(set(out))


@dataclass
class Verdict:
    """What admission found: ``admitted`` only if every case passed (and there was at least
    ``min_cases`` of them); ``failures`` says which and why, in words a reviewer can act on."""

    tool: str
    admitted: bool
    passed: int = 0
    total: int = 0
    failures: list[str] = field(default_factory=list)
    sandbox_verdicts: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        head = f"{self.tool}: {'admitted' if self.admitted else 'rejected'} ({self.passed}/{self.total} cases)"
        return head + ("; " + "; ".join(self.failures[:3]) if self.failures else "")


def run_cases(tool: Tool, cases: Sequence[ToolCase], sandbox: Any, limits: Any = None) -> list[Any]:
    """Run ``tool`` on each case in one sandbox process; the sandbox results, in order."""
    calls = [dict(c.kwargs) for c in cases]
    ro: set[str] = set()
    for kw in calls:
        ro.update(read_paths(tool, kw))
    return sandbox.call_many(tool.code, tool.entry, calls, limits=limits or make_limits(), ro_paths=sorted(ro))


def check(
    tool: Tool,
    sandbox: Any,
    extra_cases: Sequence[ToolCase] = (),
    *,
    min_cases: int = 1,
    min_recorded: int = 0,
    limits: Any = None,
) -> Verdict:
    """Admit ``tool`` if it passes its own tests and ``extra_cases`` (typically the recorded
    outputs it claims to reproduce), in the sandbox. ``min_recorded`` cases must come from
    trajectories (``source`` starting with ``recorded:``): a tool that only passes the tests its
    author wrote has shown nothing about the world."""
    cases = list(tool.tests) + list(extra_cases)
    v = Verdict(tool=tool.name, admitted=False, total=len(cases))
    if len(cases) < min_cases:
        v.failures.append(f"only {len(cases)} test cases, {min_cases} needed")
        return v
    recorded = sum(1 for c in cases if c.source.startswith("recorded:"))
    if recorded < min_recorded:
        v.failures.append(f"reproduces {recorded} recorded outputs, {min_recorded} needed")
        return v
    bad_kwargs = [c for c in cases if set(c.kwargs) != set(tool.params)]
    if bad_kwargs:
        v.failures.append(f"a case passes {sorted(bad_kwargs[0].kwargs)}, the signature is {tool.signature}")
        return v
    results = run_cases(tool, cases, sandbox, limits)
    for case, res in zip(cases, results):
        v.sandbox_verdicts[res.verdict] = v.sandbox_verdicts.get(res.verdict, 0) + 1
        if not res.ok:
            err = (res.error or "").strip().splitlines()
            v.failures.append(f"{case.source} {case.kwargs}: {res.verdict}: {err[-1] if err else ''}"[:300])
        elif not same(res.value, case.expect, unordered=case.unordered):
            v.failures.append(
                f"{case.source} {case.kwargs}: returned {str(res.value)[:80]}, expected {str(case.expect)[:80]}"[:300]
            )
        else:
            v.passed += 1
    v.admitted = v.passed == len(cases)
    return v


class ToolError(RuntimeError):
    """A tool call that did not return a value: the sandbox verdict and its reason."""

    def __init__(self, name: str, verdict: str, error: str | None) -> None:
        last = (error or "").strip().splitlines()
        super().__init__(f"tool {name} failed ({verdict}): {last[-1] if last else verdict}")
        self.verdict = verdict


class ToolBox:
    """The admitted tools of a system, callable by an agent during a rollout.

    ``box.call(ctx, name, **kwargs)`` runs the tool in the sandbox and records it as a tool
    step of the trajectory (``ctx.tool``); a failure raises :class:`ToolError` after it is
    recorded. The sandbox backend is built once per ToolBox."""

    def __init__(self, library: ToolLibrary, sandbox: Any = None, limits: Any = None) -> None:
        self.library = library
        self._sandbox = sandbox
        self.limits = limits

    @property
    def sandbox(self) -> Any:
        if self._sandbox is None:
            self._sandbox = default_sandbox()
        return self._sandbox

    def run(self, name: str, **kwargs: Any) -> Any:
        tool = self.library[name]
        res = self.sandbox.call(
            tool.code, tool.entry, kwargs, limits=self.limits or make_limits(), ro_paths=read_paths(tool, kwargs)
        )
        if not res.ok:
            raise ToolError(name, res.verdict, res.error)
        return res.value

    def relevant(self, query: str, k: int = 5, **kwargs: Any) -> list:
        """The ``k`` tools whose descriptions are closest to ``query`` (e.g. the task text), for an
        agent that shows a model only the tools that matter; ``[(tool, similarity)]``."""
        from evolve.toolforge.retrieve import retrieve

        return retrieve(self.library, query, k, **kwargs)

    def call(self, ctx: Any, name: str, **kwargs: Any) -> Any:
        if name not in self.library:
            raise KeyError(f"no tool {name!r}; the library has {self.library.names()}")
        return ctx.tool(name, lambda **kw: self.run(name, **kw), **kwargs)
