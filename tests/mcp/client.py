"""The MCP tests' client side: a server over stdio or streamable HTTP (a subprocess, the way a coding
agent starts it), the official SDK's client on it, and a call that returns what a model reads."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import yaml
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.helpers import DATA, ROOT

SERVER = [sys.executable, "-m", "evolve", "mcp"]


def toy_task(folder: Path, name: str = "toy.yaml", **changes: Any) -> Path:
    """The toy world's task file (seconds to run) in ``folder``, with ``changes``."""
    data = yaml.safe_load((DATA / "toy.yaml").read_text())
    data.update(changes)
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@contextlib.asynccontextmanager
async def stdio_session(root: Path, *flags: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=SERVER[0], args=[*SERVER[1:], "--root", str(root), *flags], cwd=str(ROOT))
    with open(root.parent / f"stdio-{time.monotonic_ns()}.log", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


@contextlib.contextmanager
def http_server(root: Path, *flags: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """``evolve mcp --http --port 0`` as a process of its own; yields it and its URL."""
    log = root.parent / f"http-{time.monotonic_ns()}.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [*SERVER, "--root", str(root), "--http", "--port", "0", *flags],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            m = re.search(r"(http://\S+/mcp)", log.read_text())
            if m:
                break
            assert proc.poll() is None, f"the server ended: {log.read_text()}"
            assert time.monotonic() < deadline, "the server did not announce its URL"
            time.sleep(0.05)
        yield proc, m.group(1)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.asynccontextmanager
async def http_session(url: str, token: str | None = None) -> AsyncIterator[ClientSession]:
    from mcp.shared._httpx_utils import create_mcp_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with create_mcp_http_client(headers=headers) as client:
        async with streamable_http_client(url, http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


async def call(session: ClientSession, tool: str, args: dict[str, Any] | None = None, **kw: Any) -> tuple[bool, Any]:
    """(is_error, answer): the structured answer, or the error's text."""
    res = await session.call_tool(tool, args or {}, **kw)
    text = "\n".join(c.text for c in res.content if getattr(c, "type", "") == "text")
    if res.is_error:
        return True, text
    return False, res.structured_content if res.structured_content is not None else json.loads(text)


async def ok(session: ClientSession, tool: str, args: dict[str, Any] | None = None, **kw: Any) -> Any:
    err, answer = await call(session, tool, args, **kw)
    assert not err, f"{tool}({args}) failed: {answer}"
    return answer


async def until_done(session: ClientSession, run_id: str, timeout: float = 90) -> dict[str, Any]:
    """Poll run_status until the run is no longer starting or running."""
    import anyio

    deadline = time.monotonic() + timeout
    while True:
        st = await ok(session, "run_status", {"run_id": run_id})
        if st["state"] not in ("starting", "running"):
            return st
        assert time.monotonic() < deadline, f"the run did not end: {st}"
        await anyio.sleep(0.3)


__all__ = ["SERVER", "call", "http_server", "http_session", "ok", "stdio_session", "toy_task", "until_done"]
