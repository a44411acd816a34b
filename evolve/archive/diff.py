"""Component-by-component differences between two systems."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from evolve.types import System, canonical_json


def _dump(value: Any) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


def diff(a: System | dict[str, Any], b: System | dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Component-by-component differences between two systems.

    Returns ``(path, value in a, value in b)`` for every leaf that differs, recursing into
    dicts; paths are dotted (``"prompts.instruction"``, ``"models.policy.adapter.sha256"``).
    A key present on one side only shows ``None`` on the other. Lists and other values are
    compared whole; ``1`` and ``1.0`` or ``True`` differ (JSON types are kept apart).
    Top-level components come in System field order, nested keys in ``a``'s order and then
    the keys only ``b`` has.
    """
    out: list[tuple[str, Any, Any]] = []

    def same(x: Any, y: Any) -> bool:
        return type(x) is type(y) and (
            x == y if not isinstance(x, (dict, list)) else canonical_json(x) == canonical_json(y)
        )

    def walk(x: Any, y: Any, path: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            keys = list(x) + [k for k in y if k not in x]
            for k in keys:
                walk(x.get(k), y.get(k), f"{path}.{k}" if path else str(k))
        elif not same(x, y):
            out.append((path, x, y))

    walk(_dump(a), _dump(b), "")
    return out
