"""Tools as first-class parts of Π: name, signature, docstring, code, tests, provenance, counts.

A tool is plain data (a frozen pydantic model) so that it lives inside ``System.tools`` and the
archive keeps every version of every library: ``System.tools`` maps a tool's name to
``Tool.model_dump()``. Its code is inlined rather than stored as an artifact — tools are a few
hundred bytes, and inlining keeps ``evolve archive diff`` able to show a code change line by line.

A tool's code is untrusted (a model or a miner wrote it): it only ever runs in a sandbox
(:mod:`evolve.sandbox`), through :class:`ToolBox` or :func:`evolve.toolforge.validate.check`.
"""

from __future__ import annotations

import ast
import json
import keyword
import math
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from evolve.types import JSON, Frozen, System, content_hash

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class ToolCase(Frozen):
    """One known-answer case: ``tool(**kwargs)`` must return ``expect``.

    ``source`` says where the answer comes from: ``"test"`` (the author's own test) or
    ``"recorded:<task id>"`` (an output recorded in a trajectory, which the tool claims to
    reproduce). ``unordered`` compares lists as multisets (rows of a query without ORDER BY)."""

    kwargs: dict[str, JSON] = Field(default_factory=dict)
    expect: JSON = None
    source: str = "test"
    unordered: bool = False


class Tool(Frozen):
    name: str
    params: tuple[str, ...]
    doc: str = ""
    code: str
    function: str = ""  # the function in ``code`` to call; defaults to ``name``
    tests: tuple[ToolCase, ...] = ()
    reads: tuple[str, ...] = ()  # params that name host files the tool may read (mounted read-only)
    origin: Literal["llm", "abstraction", "user"] = "user"
    provenance: dict[str, JSON] = Field(default_factory=dict)  # operator, trajectories, parents, ...
    meta: dict[str, JSON] = Field(default_factory=dict)  # origin-specific data (e.g. an SQL template)
    uses: int = 0  # calls seen in the trajectories the library was judged on
    successes: int = 0  # of those, calls in trajectories that succeeded

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _NAME.match(v) or keyword.iskeyword(v):
            raise ValueError(f"tool name {v!r} is not a Python identifier (letters, digits, _; at most 64)")
        return v

    @field_validator("params")
    @classmethod
    def _params_ok(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for p in v:
            if not _NAME.match(p) or keyword.iskeyword(p):
                raise ValueError(f"parameter {p!r} is not a Python identifier")
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate parameter names in {v}")
        return v

    @property
    def entry(self) -> str:
        return self.function or self.name

    @property
    def signature(self) -> str:
        return f"{self.name}({', '.join(self.params)})"

    @property
    def behaviour_key(self) -> str:
        """Same parameters and same code (its own function name aside): the same tool whatever
        its name or doc."""
        code = re.sub(rf"\bdef {re.escape(self.entry)}\(", "def _(", _normalise_code(self.code))
        return content_hash({"params": list(self.params), "code": code})

    def describe(self) -> str:
        """One line for retrieval and for prompts: signature and the first line of the doc."""
        first = self.doc.strip().splitlines()[0] if self.doc.strip() else ""
        return f"{self.signature}: {first}" if first else self.signature


def _normalise_code(code: str) -> str:
    """The code without comments or formatting (parsed, never run), or the stripped text if it does not parse."""
    try:
        return ast.unparse(ast.parse(code))
    except (SyntaxError, ValueError):
        return code.strip()


# ----------------------------------------------------------------------------- comparison


def _canon(v: Any, places: int = 6) -> Any:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)):
        f = float(v)
        return round(f, places) if math.isfinite(f) else repr(f)
    if isinstance(v, (list, tuple)):
        return [_canon(x, places) for x in v]
    if isinstance(v, dict):
        return {str(k): _canon(x, places) for k, x in v.items()}
    return repr(v)


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v


def same(got: Any, expect: Any, *, unordered: bool = False) -> bool:
    """JSON equality with numbers compared to 6 decimals (1 == 1.0); ``unordered`` compares two
    lists as multisets of their (canonical) elements."""
    a, b = _canon(got), _canon(expect)
    if unordered and isinstance(a, list) and isinstance(b, list):
        return Counter(_hashable(x) for x in a) == Counter(_hashable(x) for x in b)
    return a == b


# ----------------------------------------------------------------------------- library


class ToolLibrary:
    """The tools of one system, by name. A plain mapping; changes return a new library."""

    def __init__(self, tools: Mapping[str, Tool] | None = None) -> None:
        self.tools: dict[str, Tool] = dict(tools or {})

    @classmethod
    def from_system(cls, system: System) -> ToolLibrary:
        out = {}
        for name, data in (system.tools or {}).items():
            if isinstance(data, dict) and "code" in data:
                out[name] = Tool.model_validate(data)
        return cls(out)

    def to_json(self) -> dict[str, JSON]:
        return {name: t.model_dump(mode="json") for name, t in sorted(self.tools.items())}

    def apply_to(self, system: System) -> System:
        """The system with this library as its tools (entries that are not tools are kept)."""
        others = {k: v for k, v in (system.tools or {}).items() if not (isinstance(v, dict) and "code" in v)}
        return system.replace(tools={**others, **self.to_json()})

    def __len__(self) -> int:
        return len(self.tools)

    def __contains__(self, name: str) -> bool:
        return name in self.tools

    def __getitem__(self, name: str) -> Tool:
        return self.tools[name]

    def __iter__(self):
        return iter(self.tools.values())

    def names(self) -> list[str]:
        return sorted(self.tools)

    def unique_name(self, base: str) -> str:
        name, i = base, 2
        while name in self.tools:
            name, i = f"{base}_{i}", i + 1
        return name


def tools_from_file(path: str | Path) -> dict[str, Any]:
    """A tool library file as ``System.tools`` (checked by :func:`load_library`): the task file's ``tools:``."""
    return load_library(path).to_json()


def load_library(path: str | Path) -> ToolLibrary:
    """Read a tool library file (``{name: tool}`` JSON); a clear error names what is wrong."""
    from pydantic import ValidationError

    from evolve.errors import ConfigError

    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"tools: no file {path}; give a JSON file of {{name: tool}} (toolforge writes tools.json)", path="tools"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"tools: {path} is not JSON ({e.msg} at line {e.lineno})", path="tools") from None
    if not isinstance(data, dict):
        raise ConfigError(f"tools: {path} must hold a JSON object mapping tool names to tools", path="tools")
    tools = {}
    for name, spec in data.items():
        try:
            tools[name] = Tool.model_validate(spec)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise ConfigError(f"tools: {path}: tool {name!r}: {where}: {first['msg']}", path="tools") from None
        if tools[name].name != name:
            raise ConfigError(
                f"tools: {path}: the entry {name!r} holds a tool named {tools[name].name!r}", path="tools"
            )
    return ToolLibrary(tools)


def save_library(library: ToolLibrary, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(library.to_json(), indent=1, sort_keys=True))
    return path
