"""Tools the gateway serves: the admitted tools of the evolved system (``System.tools``, grown by
the ``toolforge`` operator, e.g. mined from the tool calls recorded in sessions), offered to the
model beside the agent's own tools and run by the gateway in the sandbox, so the agent gains them
without a change to its code.

In a route's ``evolve`` block::

    evolve:
      run: runs/sql-agent
      tools:
        serve: all                  # or a list of tool names
        max_rounds: 4               # model calls per request at most (the last offers none of these tools)
        read_roots: [/data/dbs]     # where a tool's file parameters may point (nothing else is mounted)

Per request: the system's tools are added to the request's ``tools`` (a name the agent already
offers is the agent's); when the model calls only served tools, the gateway runs them in the
sandbox (never in its own process), appends the calls and their results to the messages and asks
the model again; the agent sees the final answer, or the calls of its own tools (a served call
beside one of the agent's is dropped from what the agent sees and recorded as dropped). Each model
call is recorded as a call of the session, so the tool calls and their results are in the trace
store like any other. A streamed request is answered after its tool rounds, as one stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve.gateway.wire import TOOL_ERROR


@dataclass
class ServedTools:
    names: list[str] | None = None  # None: all of the system's tools
    max_rounds: int = 4
    read_roots: list[Path] = field(default_factory=list)
    sandbox: str = "process"
    limits: dict[str, Any] = field(default_factory=dict)
    _server: Any = field(default=None, init=False, repr=False)

    @property
    def server(self) -> Any:
        """The tool layer's server (:data:`evolve.registry.tool_servers`), built on first use."""
        if self._server is None:
            from evolve.registry import tool_servers

            self._server = tool_servers.get("toolforge")(self.read_roots, self.sandbox, self.limits)
        return self._server

    def offered(self, system: Any, agent_tools: list[dict] | None) -> dict[str, Any]:
        """The tools of ``system`` served to this request: by name, not clashing with the agent's."""
        if system is None:
            return {}
        theirs = {((t.get("function") or {}).get("name")) for t in agent_tools or [] if isinstance(t, dict)}
        return {
            n: t
            for n, t in self.server.tools(system).items()
            if n not in theirs and (self.names is None or n in self.names)
        }

    def schema(self, tool: Any) -> dict[str, Any]:
        return self.server.schema(tool)

    def run(self, tool: Any, call: dict) -> str:
        """One tool call run in the sandbox; the ``tool`` message's content: the result as JSON, or
        what went wrong (marked with :data:`~evolve.gateway.wire.TOOL_ERROR`) for the model to read."""
        ok, text = self.server.run(tool, (call.get("function") or {}).get("arguments") or "{}")
        return text if ok else TOOL_ERROR + text

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


def served_calls(tool_calls: list[dict] | None, served: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """(served, the agent's): the model's tool calls split by whose tool they call."""
    ours: list[dict] = []
    theirs: list[dict] = []
    for c in tool_calls or []:
        (ours if (c.get("function") or {}).get("name") in served else theirs).append(c)
    return ours, theirs


__all__ = ["ServedTools", "served_calls"]
