"""Driving one sandbox process from the host: feed the request on stdin, read stdout, stderr and the
result pipe with caps, enforce wall-clock deadlines, kill the whole tree, reap, and report.

One selector loop, no threads. Host memory is bounded: stdout/stderr keep at most
Limits.output_bytes each (exceeding it kills the process: verdict "killed"), and one result line at
most `line_cap` bytes.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass, field

from ._protocol import Capped, Ending, LineReader, parse_line
from ._types import Limits

GRACE_S = 0.5  # host-side slack over the in-sandbox alarm before the host kills
DRAIN_S = 1.0  # after the process exits, how long to wait for pipes to close


@dataclass
class Collected:
    lines: list[dict] = field(default_factory=list)  # parsed protocol objects, in order
    bad_lines: int = 0
    done: bool = False
    stdout: Capped | None = None
    stderr: Capped | None = None
    ending: Ending = field(default_factory=Ending)
    current: int | None = None  # batch: the call that had started and not finished
    duration: float = 0.0


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process group. bwrap is its leader; --die-with-parent plus the pid namespace take
    everything inside with it (when a pid namespace's init dies, the kernel kills the rest)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def collect(
    proc: subprocess.Popen,
    request: bytes,
    result_fd: int,
    limits: Limits,
    *,
    batch: bool,
    deadline: float,
    first_call_deadline: float | None = None,
    t0: float | None = None,
) -> Collected:
    """Run the conversation with a started process until it ends, is killed, or the deadline passes.

    deadline: absolute monotonic time for the whole process. For batches, each call that starts gets
    its own deadline of wall_s + GRACE_S; the load phase must finish by first_call_deadline.
    """
    t0 = time.monotonic() if t0 is None else t0
    stdout, stderr = Capped(limits.output_bytes), Capped(limits.output_bytes)
    out = Collected(stdout=stdout, stderr=stderr)
    line_cap = 14 * limits.output_bytes + 65536
    reader = LineReader(line_cap)
    sel = selectors.DefaultSelector()
    assert proc.stdin and proc.stdout and proc.stderr  # started with three pipes
    stdin_fd, stdout_fd, stderr_fd = proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
    for fd in (stdin_fd, stdout_fd, stderr_fd, result_fd):
        os.set_blocking(fd, False)
    pending = memoryview(request)
    sel.register(stdin_fd, selectors.EVENT_WRITE, "stdin")
    sel.register(stdout_fd, selectors.EVENT_READ, "stdout")
    sel.register(stderr_fd, selectors.EVENT_READ, "stderr")
    sel.register(result_fd, selectors.EVENT_READ, "result")
    pidfd = None
    try:
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ, "exit")
    except (AttributeError, OSError):  # old kernel or Python: poll for exit instead
        pidfd = None
    call_deadline = first_call_deadline
    exited_at: float | None = None
    open_reads = 3

    def kill(reason: str, detail: str) -> None:
        if out.ending.kill_reason is None:
            out.ending.kill_reason, out.ending.kill_detail = reason, detail
        _kill_tree(proc)

    try:
        while True:
            now = time.monotonic()
            if exited_at is None and pidfd is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and (open_reads == 0 or now - exited_at > DRAIN_S):
                break
            limit = deadline if exited_at is None else exited_at + DRAIN_S
            if exited_at is None and call_deadline is not None:
                limit = min(limit, call_deadline)
            if now >= limit:
                if exited_at is not None:
                    break
                if call_deadline is not None and call_deadline <= deadline and now >= call_deadline:
                    what = "loading the code" if out.current is None else f"call #{out.current}"
                    kill("call_wall", f"{what} did not return")
                else:
                    kill("wall", "the whole sandbox run")
                exited_at = exited_at or time.monotonic()
                continue
            wait = limit - now if pidfd is not None else min(limit - now, 0.05)
            for key, _ in sel.select(wait):
                tag = key.data
                if tag == "stdin":
                    try:
                        pending = pending[os.write(stdin_fd, pending[: 1 << 16]) :]
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError):
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(stdin_fd)
                        proc.stdin.close()
                    continue
                if tag == "exit":
                    sel.unregister(key.fd)  # the pidfd
                    exited_at = time.monotonic()
                    continue
                try:
                    chunk = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(key.fd)
                    open_reads -= 1
                    continue
                if tag in ("stdout", "stderr"):
                    buf = stdout if tag == "stdout" else stderr
                    if buf.add(chunk) and out.ending.kill_reason is None:
                        kill(
                            "output",
                            f"{tag} exceeded the output cap of {limits.output_bytes} bytes "
                            "(Limits.output_bytes); the sandbox was killed",
                        )
                    continue
                for raw in reader.feed(chunk):
                    obj = parse_line(raw)
                    if obj is None:
                        out.bad_lines += 1
                        continue
                    out.lines.append(obj)
                    if obj.get("done") is True:
                        out.done = True
                    elif batch and obj.get("start") is True and isinstance(obj.get("i"), int):
                        out.current = obj["i"]
                        call_deadline = time.monotonic() + limits.wall_s + GRACE_S
                    elif batch and "verdict" in obj:
                        out.current, call_deadline = None, None
                if reader.overflow:
                    kill("result", f"a result line exceeded {line_cap} bytes; the sandbox was killed")
    finally:
        sel.close()
        _kill_tree(proc)  # nothing may outlive the call; the group is still ours until it is reaped
        out.ending.status, out.ending.cpu_s = _reap(proc)
        out.ending.stderr_tail = bytes(stderr.data[-4096:]).decode("utf-8", "replace")
        for f in (proc.stdin, proc.stdout, proc.stderr):
            try:
                f.close()
            except OSError:
                pass
        for end_fd in (pidfd, result_fd):
            if end_fd is not None:
                try:
                    os.close(end_fd)
                except OSError:
                    pass
        out.duration = time.monotonic() - t0
    return out


def _reap(proc: subprocess.Popen) -> tuple[int | None, float]:
    """Wait for bwrap; (status in bwrap's convention: 128+N for death by signal N, cpu seconds)."""
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except ChildProcessError:
        proc.wait()
        return proc.returncode, 0.0
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    return (128 - code if code < 0 else code), usage.ru_utime + usage.ru_stime
