"""Host side of the sandbox protocol, shared by the backends: the request, and turning what came
back (result lines, captured output, how the process ended) into SandboxResults.

Everything from the sandbox is untrusted bytes. It is parsed with json.loads only (NaN/Infinity
refused), each line under a size cap, and never unpickled, evaluated or imported.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from pathlib import Path

from ._types import Limits, SandboxResult

BOOTSTRAP_SOURCE = (Path(__file__).parent / "_bootstrap.py").read_text(encoding="utf-8")
_MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")


def request_bytes(mode: str, code: str, limits: Limits, *, nproc: bool, marker: str = "", **fields) -> bytes:
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    lim = {
        "wall_s": limits.wall_s,
        "cpu_s": limits.cpu_s,
        "memory_mb": limits.memory_mb,
        "file_size_mb": limits.file_size_mb,
        "output_bytes": limits.output_bytes,
        "nproc": limits.max_procs if nproc else None,
    }
    body = {"mode": mode, "code": code, "limits": lim, "marker": marker, **fields}
    try:
        return json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise TypeError(f"inputs/kwargs must be JSON-serialisable: {exc}") from None


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


def parse_line(raw: bytes) -> dict | None:
    """One result line → dict, or None when it is not a well-formed protocol object."""
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


class LineReader:
    """Splits the result channel into lines, refusing any line longer than `cap` bytes."""

    def __init__(self, cap: int):
        self.cap, self.buf, self.overflow = cap, bytearray(), False

    def feed(self, data: bytes) -> list[bytes]:
        self.buf += data
        lines = []
        while True:
            nl = self.buf.find(b"\n")
            if nl < 0:
                break
            lines.append(bytes(self.buf[:nl]))
            del self.buf[: nl + 1]
        if len(self.buf) > self.cap:
            self.overflow = True
            self.buf.clear()
        return [ln for ln in lines if ln.strip()]


@dataclass
class Capped:
    """A byte buffer that keeps the first `cap` bytes and notes whether more arrived."""

    cap: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, chunk: bytes) -> bool:
        """Append; True once the cap is exceeded."""
        self.total += len(chunk)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        return self.total > self.cap

    @property
    def over(self) -> bool:
        return self.total > self.cap

    def text(self) -> str:
        return bytes(self.data).decode("utf-8", "replace")


@dataclass
class Ending:
    """How a sandbox process ended, as the host saw it."""

    kill_reason: str | None = None  # why the host killed it ("wall", "call_wall", "output", "result")
    kill_detail: str = ""
    status: int | None = None  # exit status as reported (128+N = died of signal N)
    cpu_s: float = 0.0
    stderr_tail: str = ""


def death_result(
    ending: Ending, limits: Limits, *, stdout: str, stderr: str, duration: float, truncated: bool, context: str = ""
) -> SandboxResult:
    verdict, reason = death_verdict(ending, limits)
    return SandboxResult(verdict, None, stdout, stderr, context + reason, duration, truncated)


def death_verdict(ending: Ending, limits: Limits) -> tuple[str, str]:
    """(verdict, reason) for a process that ended without sending a result."""
    if ending.kill_reason in ("wall", "call_wall"):
        return (
            "timeout",
            f"wall-clock limit of {limits.wall_s:g}s exceeded ({ending.kill_detail}); the sandbox was killed",
        )
    if ending.kill_reason in ("output", "result"):
        return "killed", ending.kill_detail
    status = ending.status
    sig = status - 128 if status is not None and 128 < status < 128 + 65 else None
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and ending.cpu_s >= limits.cpu_s - 0.05):
        return "timeout", f"CPU-time limit of {limits.cpu_s}s exceeded (RLIMIT_CPU); the process was killed"
    if any(sign in ending.stderr_tail for sign in _MEMORY_SIGNS):
        return "memory", f"the process ran out of memory (Limits.memory_mb={limits.memory_mb}) and died" + (
            f" (exit status {status})" if status is not None else ""
        )
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return "killed", f"the sandboxed process was killed by {name} before returning a result"
    if status is None:
        return "error", "the sandbox ended in an unknown way without returning a result"
    tail = ending.stderr_tail.strip().splitlines()[-1:] or [""]
    return "error", f"the sandboxed process exited with status {status} without returning a result" + (
        f": {tail[0][:500]}" if tail[0] else ""
    )


def result_from_line(obj: dict, *, stdout: str, stderr: str, duration: float, truncated: bool) -> SandboxResult:
    """A SandboxResult from one parsed result line; anything off-protocol becomes an "error"."""
    verdict = obj.get("verdict")
    if verdict not in ("ok", "error", "timeout", "memory"):
        return SandboxResult(
            "error",
            None,
            stdout,
            stderr,
            f"malformed result from the sandbox (verdict {verdict!r})",
            duration,
            truncated,
        )
    error = obj.get("error")
    if verdict != "ok" and not isinstance(error, str):
        error = f"{verdict} (no reason given)"
    return SandboxResult(
        verdict,
        obj.get("value") if verdict == "ok" else None,
        stdout,
        stderr,
        None if verdict == "ok" else error,
        duration,
        truncated,
    )


def cut_note(limits: Limits) -> str:
    return f"\n[... output truncated at {limits.output_bytes} bytes (Limits.output_bytes)]"


def batch_result(obj: dict, limits: Limits, duration: float) -> SandboxResult:
    """One call of a batch: its own stdout/stderr travel inside its result line."""
    out, err = obj.get("stdout"), obj.get("stderr")
    out = out if isinstance(out, str) else ""
    err = err if isinstance(err, str) else ""
    truncated = bool(obj.get("truncated"))
    took = obj.get("t")
    if isinstance(took, (int, float)) and not isinstance(took, bool) and 0 <= took < 1e7:
        duration = float(took)
    if truncated:
        out += cut_note(limits)
    return result_from_line(obj, stdout=out, stderr=err, duration=duration, truncated=truncated)
