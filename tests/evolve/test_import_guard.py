"""The registry's import guard (evolve.registry.set_import_guard, $EVOLVE_IMPORT_GUARD): every path
import_path imports is checked before the import and once resolved; the registry knows no guard of its
own (evolve mcp hands its children one)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from evolve import registry
from evolve.errors import UserError

SEEN: list[tuple[str, str]] = []


class Refuses:
    """Refuses every path naming ``json``; records what it was asked."""

    def check(self, path: str, *, what: str, search: Path | None = None) -> None:
        SEEN.append(("check", path))
        if path.startswith("json"):
            raise UserError(f"{what} {path!r}: refused")

    def check_object(self, obj: Any, path: str, *, what: str) -> None:
        SEEN.append(("object", path))


def build() -> Refuses:  # what $EVOLVE_IMPORT_GUARD names
    return Refuses()


@pytest.fixture(autouse=True)
def _no_guard(monkeypatch):
    monkeypatch.delenv(registry.GUARD_ENV, raising=False)
    SEEN.clear()
    yield
    registry.set_import_guard(None)


def test_without_a_guard_import_path_imports_anything():
    assert registry.import_guard() is None
    assert registry.import_path("json:dumps") is __import__("json").dumps


def test_a_guard_handed_in_checks_each_path_before_and_after_the_import(monkeypatch):
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    registry.set_import_guard(Refuses())
    with pytest.raises(UserError, match="refused"):
        registry.import_path("json:dumps", what="agent")
    assert registry.import_path("colorsys:rgb_to_hsv") is __import__("colorsys").rgb_to_hsv
    assert SEEN == [("check", "json:dumps"), ("check", "colorsys:rgb_to_hsv"), ("object", "colorsys:rgb_to_hsv")]
    assert registry.resolve_trusted("json:dumps")  # a registry's own entries are not a task's paths


def test_a_refused_path_is_never_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "json.tool", raising=False)
    registry.set_import_guard(Refuses())
    with pytest.raises(UserError):
        registry.import_path("json.tool:main")
    assert "json.tool" not in sys.modules


def test_a_process_started_by_a_guarded_one_builds_its_guard_from_the_environment(monkeypatch):
    monkeypatch.setenv(registry.GUARD_ENV, f"{__name__}:build")
    assert isinstance(registry.import_guard(), Refuses)
    with pytest.raises(UserError, match="refused"):
        registry.import_path("json:loads")


def test_a_guard_the_environment_names_but_cannot_build_refuses_everything(monkeypatch):
    monkeypatch.setenv(registry.GUARD_ENV, "no_such_guard_module:build")
    with pytest.raises(UserError, match="EVOLVE_IMPORT_GUARD"):
        registry.import_path("colorsys:rgb_to_hsv")
