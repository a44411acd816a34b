"""Tools as parts of Π: the agent's tool library, grown from its own trajectories and run only in
the sandbox.

* :mod:`~evolve.toolforge.tool` — :class:`Tool` (name, signature, doc, code, tests, provenance,
  usage counts) and :class:`ToolLibrary` (the ``System.tools`` of a system);
* :mod:`~evolve.toolforge.synth` — synthesis by an LLM from recorded tool calls;
* abstraction (no LLM) is a world's ``tools.mine`` hook: the SQL world's is :mod:`evolve.worlds.sql.abstract`;
* :mod:`~evolve.toolforge.validate` — admission in the sandbox (:func:`check`) and
  :class:`ToolBox`, how an agent calls admitted tools;
* :mod:`~evolve.toolforge.curate` — dedup, usage and retirement; :mod:`~evolve.toolforge.retrieve` — retrieval by description;
* :mod:`~evolve.toolforge.operator` — the ``toolforge`` operator for the engine;
* :mod:`~evolve.toolforge.serve` — :class:`~evolve.toolforge.serve.ToolServer`, a system's tools
  served outside the engine (the gateway runs them in the sandbox for an agent it fronts).
"""

from evolve.toolforge.tool import Tool, ToolCase, ToolLibrary, same
from evolve.toolforge.validate import ToolBox, ToolError, Verdict, check

__all__ = ["Tool", "ToolBox", "ToolCase", "ToolError", "ToolLibrary", "Verdict", "check", "same"]
