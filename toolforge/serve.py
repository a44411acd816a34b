"""A system's admitted tools served outside the engine (by ``evolve gateway``): their schemas for
a model, and their calls run in the sandbox, never in the serving process.

Reached through :data:`evolve.registry.tool_servers`. A tool's file parameters (``Tool.reads``)
must point under ``read_roots``, which are the only host folders mounted (read-only)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evolve.toolforge.tool import Tool, ToolLibrary
from evolve.toolforge.validate import default_sandbox, evolvekit_cache, make_limits, read_paths
from evolve.types import System

MAX_RESULT_CHARS = 20_000


class ToolServer:
    def __init__(
        self, read_roots: Sequence[str | Path] = (), sandbox: str = "process", limits: dict[str, Any] | None = None
    ) -> None:
        self.read_roots = [os.path.realpath(r) for r in read_roots]
        self.backend, self.limits = sandbox, dict(limits or {})
        self._box: Any = None
        import threading

        self._lock = threading.Lock()

    @staticmethod
    def tools(system: System) -> dict[str, Tool]:
        """The system's admitted tools, by name."""
        return dict(ToolLibrary.from_system(system).tools)

    @staticmethod
    def schema(tool: Tool) -> dict[str, Any]:
        """The OpenAI function schema of a tool (its parameters are untyped JSON values; its doc says
        what they are)."""
        return {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": (tool.doc or tool.signature).strip()[:1024],
                "parameters": {
                    "type": "object",
                    "properties": {p: {"description": p} for p in tool.params},
                    "required": list(tool.params),
                },
            },
        }

    def _sandbox(self) -> Any:
        with self._lock:
            if self._box is None:
                opts = {"data_roots": [str(evolvekit_cache()), *self.read_roots]} if self.backend == "process" else {}
                self._box = default_sandbox(self.backend, **opts)
            return self._box

    def _readable(self, path: str) -> bool:
        real = os.path.realpath(path)
        return any(real == root or real.startswith(root + os.sep) for root in self.read_roots)

    def run(self, tool: Tool, arguments: str) -> tuple[bool, str]:
        """Run one call (its JSON arguments) in the sandbox: (True, the result as JSON) or (False,
        what went wrong, in words a model can act on)."""
        try:
            kwargs = json.loads(arguments or "{}")
        except ValueError as e:
            return False, f"the arguments are not JSON ({e})"
        if not isinstance(kwargs, dict) or set(kwargs) != set(tool.params):
            got = sorted(kwargs) if isinstance(kwargs, dict) else type(kwargs).__name__
            return False, f"{tool.signature} takes {list(tool.params)}, got {got}"
        for p in tool.reads:
            v = kwargs.get(p)
            if not isinstance(v, str) or not self._readable(v):
                return False, f"{p}={v!r} is not under a path this server lets tools read ({self.read_roots})"
        try:
            res = self._sandbox().call(
                tool.code, tool.entry, kwargs, limits=make_limits(**self.limits), ro_paths=read_paths(tool, kwargs)
            )
        except Exception as e:  # noqa: BLE001 - e.g. a path the sandbox refuses to mount: the model reads why
            return False, f"the sandbox refused the call: {type(e).__name__}: {e}"[:MAX_RESULT_CHARS]
        if not res.ok:
            last = (res.error or "").strip().splitlines()
            return False, f"{res.verdict}: {last[-1] if last else res.verdict}"[:MAX_RESULT_CHARS]
        return True, json.dumps(res.value, ensure_ascii=False, default=str)[:MAX_RESULT_CHARS]

    def close(self) -> None:
        close = getattr(self._box, "close", None)
        if close is not None:
            close()
        self._box = None


__all__ = ["ToolServer"]
