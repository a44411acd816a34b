"""The MCP tests' fixture: the server's --root folder (helpers are in tests/mcp/client.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mcp.client import toy_task


def _kill_runs(root: Path) -> None:
    """Runs a test started that are still going (pid and start time from their job.json)."""
    from evolve.mcp.jobs import Jobs

    jobs = Jobs()
    for job_file in root.rglob("mcp/job.json"):
        job = json.loads(job_file.read_text())
        if jobs.alive(job):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(job["pid"]), signal.SIGKILL)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """The server's --root folder, with the toy task file; runs left going are ended afterwards."""
    folder = tmp_path / "root"
    folder.mkdir()
    toy_task(folder)
    yield folder
    _kill_runs(folder)
