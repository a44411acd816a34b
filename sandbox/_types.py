"""The sandbox's data types: limits, results and the unavailability error (the backend protocol is in
:mod:`.base`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VERDICTS = ("ok", "error", "timeout", "memory", "denied", "killed")


class SandboxUnavailable(RuntimeError):
    """A backend cannot run here; the message says which, why, and what would work. (The sandbox
    imports nothing of evolvekit, so that it loads on its own; :mod:`evolve.failures` tells it by name.)"""


@dataclass(frozen=True)
class Limits:
    """Resource limits for one sandboxed run (each call of `call_many` gets `wall_s` of its own).

    `tmp_mb` (an addition to the issue's list) bounds the private tmpfs at /tmp: tmpfs pages are not
    counted by RLIMIT_AS, so without a size a script could fill host RAM through files.
    """

    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 512
    max_procs: int = 32
    file_size_mb: int = 16
    output_bytes: int = 1_000_000
    tmp_mb: int = 64

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s", "memory_mb", "max_procs", "file_size_mb", "output_bytes", "tmp_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive number, got {value!r}")
        if self.memory_mb < 32:
            raise ValueError(f"Limits.memory_mb must be at least 32 (the interpreter needs it), got {self.memory_mb}")
        if self.max_procs < 4:
            raise ValueError(f"Limits.max_procs must be at least 4 (the sandbox's own processes), got {self.max_procs}")


@dataclass(frozen=True)
class SandboxResult:
    """What came back from one run or call. Only `json.loads` ever touched the data."""

    verdict: str
    value: Any
    stdout: str
    stderr: str
    error: str | None
    duration_s: float
    truncated: bool = False  # stdout/stderr were cut at Limits.output_bytes

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"
