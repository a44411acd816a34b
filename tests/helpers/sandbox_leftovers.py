"""Test helpers for code that uses the sandbox: find processes a sandbox left behind (by scanning
/proc, no psutil). Used by tests/test_sandbox*.py; usable by any suite that runs sandboxed code."""

from __future__ import annotations

import os
import time
from pathlib import Path

from evolve.sandbox.process import SANDBOX_UIDS as SANDBOX_UID_RANGE


def _procs():
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
                status = (entry / "status").read_text()
            except OSError:
                continue
            uid = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:")), -1)
            state = next((line.split()[1] for line in status.splitlines() if line.startswith("State:")), "?")
            yield int(entry.name), uid, state, cmd


def leftovers(marker: str | None = None) -> list[tuple[int, int, str]]:
    """Live processes that carry `marker` in their command line, or run as a sandbox uid, or are a
    bwrap we started (our child). Zombies are ignored (they hold nothing)."""
    me = str(os.getpid())
    found = []
    for pid, uid, state, cmd in _procs():
        if state == "Z" or pid == os.getpid():
            continue
        if marker and marker in cmd and "pytest" not in cmd or uid in SANDBOX_UID_RANGE:
            found.append((pid, uid, cmd[:120]))
        elif "bwrap" in cmd.split(" ")[0]:
            try:
                ppid = next(
                    ln.split()[1]
                    for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if ln.startswith("PPid:")
                )
            except (OSError, StopIteration):
                continue
            if ppid == me:
                found.append((pid, uid, cmd[:120]))
    return found


def assert_no_leftovers(marker: str | None = None, within: float = 3.0) -> None:
    deadline = time.monotonic() + within
    while True:
        left = leftovers(marker)
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"processes left behind by the sandbox: {left}")
        time.sleep(0.05)
