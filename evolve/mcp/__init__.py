"""``evolve mcp``: a Model Context Protocol server, so that a coding agent (Claude Code, Codex,
Cursor, VS Code) can drive evolvekit: write and check a task file, estimate a run, start, follow
and stop runs, read reports honestly, compare systems, and (when allowed) promote and roll back.

* :mod:`~evolve.mcp.server` — the ``MCPServer`` (official ``mcp`` SDK), its resources, stdio and
  streamable HTTP (loopback by default; a bearer token beyond it);
* :mod:`~evolve.mcp.tools` — the tools, each with the docstring a model reads;
* :mod:`~evolve.mcp.roots` — the folders the server may touch (``--root``), and path checks;
* :mod:`~evolve.mcp.guard` — what a client's task may import (its own code, evolvekit's registered parts);
* :mod:`~evolve.mcp.taskcheck` — a client's task file checked field by field before anything is imported;
* :mod:`~evolve.mcp.jobs` — background runs that outlive the server;
* :mod:`~evolve.mcp.views` — what the tools answer about runs, read-only;
* :mod:`~evolve.mcp.draft` — a task file from a description (``init_task``);
* :mod:`~evolve.mcp._worker` — what runs in a child process (anything importing the task's code);
* :mod:`~evolve.mcp.cli` — the command.

docs/mcp.md has the client configuration for each coding agent.
"""
