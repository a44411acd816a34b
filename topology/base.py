"""What a workflow node type is: the :class:`NodeType` protocol that the types in
:mod:`.nodes` (llm, tool, check, vote, reflect, answer) and a world's own types (the SQL world's
``sql.write``, ``sql.execute``, ``sql.rewrite``) implement, and that
:data:`evolve.registry.node_types` names. :mod:`.runtime` runs them; :mod:`.graph` checks a graph's
params against each type's ``Params``.

A type is instantiated once per process (keep per-execution data in the state, not on ``self``).
``run`` gets the parsed ``Params`` and must not mutate ``state`` (return new lists rather than
appending); a model-calling type takes its temperature from ``rt.temperature(state, default)``,
which is the vote's sampling temperature inside a vote. ``refs`` (node ids the type runs itself,
as a vote runs its chain) and ``calls`` (model calls per run, default 1 when ``calls_model`` else
0) are optional.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel

if TYPE_CHECKING:
    from .runtime import Runtime


@runtime_checkable
class NodeType(Protocol):
    calls_model: ClassVar[bool]  # does a run call a model? (cost estimates, colours in the report)
    Params: ClassVar[type[BaseModel]]  # the node's params, checked by validate()

    def run(self, params: Any, state: dict, rt: Runtime) -> dict:
        """The updates this node makes, merged into the state by the runtime."""
        ...
