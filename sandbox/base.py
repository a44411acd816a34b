"""What every sandbox backend is: the :class:`Sandbox` protocol, and :class:`SandboxBase`, the part
the backends share.

A backend differs only in how it starts an isolated interpreter and reads its channels back. The
rest is the same everywhere and lives here: ``run`` and ``call`` are one request each, ``call_many``
one request for a batch; ro_paths are vetted first (a refused path is a ``denied`` result, nothing
starts); what came back is read by the one protocol in :mod:`._protocol`. A backend implements

* ``_binds(ro_paths)`` → ``[(host, inside), ...]`` (raise :class:`PathDenied` to refuse);
* ``_once(mode, code, limits, binds, **fields)`` → :class:`Outcome` for one run or call;
* ``_many(code, function, calls, limits, binds)`` → one :class:`SandboxResult` per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from ._paths import PathDenied
from ._protocol import Capped, Ending, cut_note, death_result, result_from_line
from ._types import Limits, SandboxResult


@runtime_checkable
class Sandbox(Protocol):
    name: str

    def run(
        self,
        code: str,
        *,
        inputs: dict | None = None,
        limits: Limits | None = None,
        ro_paths: Sequence[str | Path] = (),
    ) -> SandboxResult: ...

    def call(
        self,
        code: str,
        function: str,
        kwargs: dict | None = None,
        *,
        limits: Limits | None = None,
        ro_paths: Sequence[str | Path] = (),
    ) -> SandboxResult: ...

    def call_many(
        self,
        code: str,
        function: str,
        calls: list[dict],
        *,
        limits: Limits | None = None,
        ro_paths: Sequence[str | Path] = (),
    ) -> list[SandboxResult]: ...


@dataclass
class Outcome:
    """What one sandboxed interpreter left behind: the protocol lines it wrote, its capped stdout and
    stderr, how it ended, and how long it took."""

    lines: list[dict]
    stdout: Capped
    stderr: Capped
    ending: Ending
    duration: float
    bad_lines: int = 0


def denied(exc: PathDenied) -> SandboxResult:
    return SandboxResult("denied", None, "", "", str(exc), 0.0)


def single_result(got: Outcome, limits: Limits) -> SandboxResult:
    """The result of a run or call: its line on the result channel, or why there is none."""
    stdout, stderr = got.stdout.text(), got.stderr.text()
    truncated = got.stdout.over or got.stderr.over
    if got.stdout.over:
        stdout += cut_note(limits)
    if got.stderr.over:
        stderr += cut_note(limits)
    for obj in got.lines:
        if obj.get("i") == 0 and "verdict" in obj:
            return result_from_line(obj, stdout=stdout, stderr=stderr, duration=got.duration, truncated=truncated)
    context = "malformed output on the result channel; " if got.bad_lines else ""
    return death_result(
        got.ending, limits, stdout=stdout, stderr=stderr, duration=got.duration, truncated=truncated, context=context
    )


def fill_after_death(results: list[SandboxResult | None], got: Outcome, limits: Limits, first: int) -> None:
    """The batch's interpreter died during call ``first``: that call gets the cause, every later
    call not yet answered says it was not run and why."""
    dead = death_result(
        got.ending,
        limits,
        stdout=got.stdout.text(),
        stderr=got.stderr.text(),
        duration=got.duration,
        truncated=got.stdout.over or got.stderr.over,
    )
    results[first] = dead
    for j in range(first + 1, len(results)):
        if results[j] is None:
            results[j] = SandboxResult(
                dead.verdict, None, "", "", f"not run: the sandbox died during call #{first} ({dead.error})", 0.0
            )


class SandboxBase:
    """The shared front of a backend (see the module docstring for what a backend adds)."""

    name: str = ""

    def run(
        self,
        code: str,
        *,
        inputs: dict | None = None,
        limits: Limits | None = None,
        ro_paths: Sequence[str | Path] = (),
    ) -> SandboxResult:
        return self._single("run", code, limits, ro_paths, inputs=inputs or {})

    def call(
        self,
        code: str,
        function: str,
        kwargs: dict | None = None,
        *,
        limits: Limits | None = None,
        ro_paths: Sequence[str | Path] = (),
    ) -> SandboxResult:
        return self._single("call", code, limits, ro_paths, function=function, kwargs=kwargs or {})

    def call_many(
        self,
        code: str,
        function: str,
        calls: list[dict],
        *,
        limits: Limits | None = None,
        ro_paths: Sequence[str | Path] = (),
    ) -> list[SandboxResult]:
        limits, calls = limits or Limits(), list(calls)
        if not calls:
            return []
        try:
            binds = self._binds(ro_paths)
        except PathDenied as exc:
            return [denied(exc)] * len(calls)
        return self._many(code, function, calls, limits, binds)

    def _single(self, mode: str, code: str, limits: Limits | None, ro_paths, **fields) -> SandboxResult:
        limits = limits or Limits()
        try:
            binds = self._binds(ro_paths)
        except PathDenied as exc:
            return denied(exc)
        return single_result(self._once(mode, code, limits, binds, **fields), limits)

    # -- what a backend implements ----------------------------------------------------------------

    def _binds(self, ro_paths) -> list[tuple[str, str]]:
        raise NotImplementedError

    def _once(self, mode: str, code: str, limits: Limits, binds, **fields) -> Outcome:
        raise NotImplementedError

    def _many(self, code: str, function: str, calls: list[dict], limits: Limits, binds) -> list[SandboxResult]:
        raise NotImplementedError
