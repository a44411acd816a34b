"""The SQL world with tools: the agent may answer with a call to an admitted tool instead of SQL.

A tool made by abstraction (:mod:`evolve.worlds.sql.abstract`) is a parametrised query: the model
writes ``count_where_gt(pet, age, 3)`` and the tool runs ``select count(*) from "pet" where "age"
> ?`` in the sandbox, with the names checked and the value bound. The answer the reward sees is
the SQL the call stands for, so execution match scores a tool call exactly like the same SQL.
A tiny model does not read docstrings; it learns the tool names (vocabulary words of its
tokenizer) from demos that use them: :func:`tool_demos` rewrites each gold SQL that a tool
covers into the call.
"""

from __future__ import annotations

import threading
from typing import Any

from evolve.toolforge.tool import Tool, ToolLibrary
from evolve.toolforge.validate import ToolBox
from evolve.worlds.sql.abstract import parse_call

_BOXES: dict[str, ToolBox] = {}
_LOCK = threading.Lock()


def toolbox(system: Any) -> ToolBox | None:
    """The system's tools, callable in the sandbox (one box per tool library); None without tools."""
    if not getattr(system, "tools", None):
        return None
    lib = ToolLibrary.from_system(system)
    if not len(lib):
        return None
    key = "|".join(t.behaviour_key + t.name for t in lib)
    with _LOCK:
        box = _BOXES.get(key)
        if box is None:
            box = _BOXES[key] = ToolBox(lib)
        return box


def expand_sql(tool: Tool, kwargs: dict) -> str:
    """The SQL an abstraction tool call stands for (names bare, values as SQL literals)."""

    def lit(v: Any) -> str:
        return "'" + v.replace("'", "''") + "'" if isinstance(v, str) else str(v)

    fill = {p: (kwargs[p] if p in tool.meta.get("idents", []) else lit(kwargs[p])) for p in tool.params if p != "db"}
    return (
        tool.meta["template"]
        .format(**fill)
        .replace(" ( ", "(")
        .replace(" )", ")")
        .replace(" , ", ", ")
        .replace(" . ", ".")
    )


class NotACall(Exception):
    pass


def run_call(ctx: Any, box: ToolBox, text: str, db: str) -> tuple[str, Any]:
    """If ``text`` is a call to one of the box's query tools, run it; ``(sql, rows)``.
    Raises :class:`NotACall` when it is not a tool call, ``ValueError`` for a malformed call and
    :class:`~evolve.toolforge.validate.ToolError` when the tool fails."""
    call = parse_call(text)
    if call is None or call[0] not in box.library:
        raise NotACall(text)
    name, args = call
    tool = box.library[name]
    if "template" not in tool.meta:
        raise ValueError(f"{name} is not a query tool")
    params = [p for p in tool.params if p != "db"]
    if len(args) != len(params):
        raise ValueError(f"{name} takes {len(params)} arguments ({', '.join(params)}), got {len(args)}")
    kwargs = dict(zip(params, args))
    rows = box.call(ctx, name, db=db, **kwargs)
    return expand_sql(tool, kwargs), rows
