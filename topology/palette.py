"""The topology search's palette: what a world lets the search add to its workflow graphs.

A palette is a list of items (the ``palette`` param of the ``topology`` operator); each names a
node type and how it is added (``kind``: step, loop or wrap; see :mod:`evolve.topology.edits`)::

    - {name: repair, type: sql.rewrite, kind: loop, at: sql.execute, when: ["error", "error or empty"],
       max_visits: [1, 2, 3]}
    - {name: vote, kind: wrap, chain_types: [sql.write, sql.execute], params: {key: rows, exclude_when: error},
       grid: {n: [3, 5, 8], temperature: [0.5, 0.8, 1.0]}}
    - {name: check, type: check, kind: step, params: {expr: "rows"}}
    - {name: reflect, type: reflect, kind: step}

A new node gets ``params`` plus the first value of each ``grid`` list (``set`` edits move along
the grid), a loop node the first ``max_visits`` and its edge the first ``when`` (``set`` and
``rewire`` move along those lists). :meth:`Palette.parse` reports every malformed item at once;
:meth:`Palette.check` checks the items against the node type registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from evolve.errors import UserError
from evolve.topology.graph import compile_condition
from evolve.types import JSON, canonical_json


class PaletteError(UserError):
    """The topology palette is malformed; the message names each item and field."""


def _where(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) + ": " if loc else ""


class PaletteItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,40}$", description="the item's name; stem of new node ids")
    kind: Literal["step", "loop", "wrap"]
    type: str | None = Field(None, description="node type added (wrap: default 'vote')")
    at: list[str] = Field(default_factory=list, description="loop: types to loop at; step: allowed predecessor types")
    when: list[str] = Field(
        default_factory=list, description="loop: edge conditions; the first is used, rewire moves among them"
    )
    max_visits: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=list, description="loop: bounds of the new node; the first is used"
    )
    chain_types: list[str] = Field(default_factory=list, description="wrap: the segment's node types, in order")
    chain_param: str = Field("chain", description="wrap: the param of the vote node that lists the chain")
    params: dict[str, JSON] = Field(default_factory=dict, description="fixed params of the new node")
    grid: dict[str, list[JSON]] = Field(
        default_factory=dict, description="param -> values (the first is used; set moves among them)"
    )
    max_count: int | None = Field(None, ge=0, description="no additions once the graph has this many of the type")

    @field_validator("at", "when", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _shape(self) -> PaletteItem:
        for text in self.when:
            compile_condition(text)
        need = {"step": ["type"], "loop": ["type", "at"], "wrap": ["chain_types"]}[self.kind]
        missing = [f for f in need if not getattr(self, f)]
        if missing:
            raise ValueError(f"a {self.kind} item needs {' and '.join(missing)}")
        if self.kind == "wrap" and self.type is None:
            object.__setattr__(self, "type", "vote")
        if self.kind == "loop":
            if not self.when:
                object.__setattr__(self, "when", ["error"])
            if not self.max_visits:
                object.__setattr__(self, "max_visits", [1])
        elif self.when or self.max_visits:
            raise ValueError(f"when and max_visits belong to loop items, not {self.kind}")
        if self.chain_types and self.kind != "wrap":
            raise ValueError("chain_types belongs to wrap items")
        both = sorted(set(self.params) & set(self.grid))
        if both:
            raise ValueError(f"{both} are in both params and grid; put each in one place")
        empty = sorted(k for k, v in self.grid.items() if not v)
        if empty:
            raise ValueError(f"grid {empty} has no values")
        return self

    def node_params(self) -> dict[str, JSON]:
        return {**self.params, **{k: v[0] for k, v in self.grid.items()}}


class Palette(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    items: tuple[PaletteItem, ...]

    @classmethod
    def parse(cls, data: Any) -> Palette:
        """A palette from a list of items (or ``{items: [...]}``, or a Palette); PaletteError on a bad one."""
        if isinstance(data, Palette):
            return data
        raw = data.get("items") if isinstance(data, Mapping) else data
        if not isinstance(raw, (list, tuple)) or not raw:
            raise PaletteError(
                "the palette must be a non-empty list of items like {name: check, kind: step, "
                f"type: check}}; got {type(raw).__name__}"
            )
        problems, items = [], []
        for i, item in enumerate(raw):
            label = f"palette[{i}]" + (
                f" ({item.get('name')})" if isinstance(item, Mapping) and item.get("name") else ""
            )
            try:
                items.append(PaletteItem.model_validate(item))
            except ValidationError as e:
                problems += [f"{label}: {_where(x['loc'])}{x['msg'].removeprefix('Value error, ')}" for x in e.errors()]
        names = [it.name for it in items]
        problems += [
            f"two palette items are named {n!r}; names must be unique" for n in sorted(set(names)) if names.count(n) > 1
        ]
        if problems:
            raise PaletteError("invalid topology palette:\n  - " + "\n  - ".join(problems))
        return cls(items=tuple(items))

    def item(self, name: str) -> PaletteItem:
        for it in self.items:
            if it.name == name:
                return it
        raise KeyError(name)

    def types(self) -> set[str]:
        return {it.type for it in self.items if it.type}

    def check(self, types: Any) -> Palette:
        """Raise PaletteError unless every item's types exist in ``types`` and its params (with
        each grid value) pass the type's ``Params``."""
        problems = []
        for it in self.items:
            for t in [it.type, *it.at, *it.chain_types]:
                if t and t not in types:
                    problems.append(f"{it.name}: node type {t!r} does not exist; known: {', '.join(types.names())}")
            if not it.type or it.type not in types:
                continue
            model = getattr(types.get(it.type), "Params", None)
            if model is None:
                continue
            base = {**it.node_params(), **({it.chain_param: ["a", "b"]} if it.kind == "wrap" else {})}
            trials = [base] + [{**base, k: v} for k, vs in it.grid.items() for v in vs[1:]]
            for params in trials:
                try:
                    model.model_validate(params)
                except ValidationError as e:
                    problems += [
                        f"{it.name}: params {canonical_json(params)}: {'.'.join(map(str, x['loc']))}: {x['msg']}"
                        for x in e.errors()
                    ]
        if problems:
            raise PaletteError("the topology palette does not fit the node types:\n  - " + "\n  - ".join(problems))
        return self


__all__ = ["Palette", "PaletteError", "PaletteItem"]
