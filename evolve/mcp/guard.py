"""What an MCP client's task may import: :class:`RootsGuard`.

A task file reached through ``evolve mcp`` may be written by the client (``init_task``), so every
import path in it is checked before anything is imported. It may name only

* **the task's own code**: a module whose file lies under the server's ``--root`` folders, outside
  any installed-packages folder (``site-packages``, the Python installation); evolvekit's own modules
  never count as the task's own, even in a source checkout under a root. What it names must be
  defined in such a module (``my_agent:os.system``, or a name ``my_agent`` imported from
  ``subprocess``, is refused once the module is imported);
* **evolvekit's own registered parts**: a registered world's agent, reward, dataset and hooks and
  the other names its module exports (``evolve.worlds.toy:reply``, ``evolve.worlds.sql:name_words``),
  the few task-file helpers in :data:`HELPERS`, and in a name field (``operators.0.name``,
  ``runner.name``, ...) the names of that field's registry and what they stand for.

The server's child processes (:mod:`evolve.mcp._worker`, the runs they start and their workers)
carry the roots in ``$EVOLVE_MCP_ROOTS`` and this module's :func:`from_env` in
``$EVOLVE_IMPORT_GUARD`` (:func:`env_for`), so each of them checks every path
:func:`evolve.registry.import_path` imports against this guard, before it imports the path and once
it has resolved it, wherever in a run the path was found (:func:`evolve.registry.import_guard`).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Iterable
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from evolve.errors import ConfigError, UserError
from evolve.registry import GUARD_ENV

ENV = "EVOLVE_MCP_ROOTS"
# evolvekit's task-file building blocks beyond the worlds' own: the workflow agent the topology
# operator evolves, and the gateway's recorded traffic as a dataset, an agent and a memory hook.
HELPERS = (
    "evolve.topology:agent",
    "evolve.gateway.dataset:sessions",
    "evolve.gateway.dataset:replay",
    "evolve.gateway.dataset:experiences",
)
DATASETS = ("evolve.gateway.dataset:sessions",)
# the registries whose names a task file gives (world, operators.N.name, runner.name, engine.*, track.N.name)
NAMED = (
    "worlds",
    "operators",
    "runners",
    "selectors",
    "acceptances",
    "minibatch_samplers",
    "stoppings",
    "trackers",
    "llm_backends",
    "node_types",
)


def split(path: str) -> tuple[str, str]:
    """``(module, attribute)`` as :func:`evolve.registry.import_path` reads ``path``."""
    if ":" in path:
        mod, _, attr = path.partition(":")
    else:
        mod, _, attr = path.rpartition(".")
    return mod, attr


def canonical(path: str) -> str:
    mod, attr = split(path)
    return f"{mod}:{attr}"


def is_evolve(module: str) -> bool:
    return module == "evolve" or module.startswith("evolve.")


def installed_folders() -> list[Path]:
    """Where installed code lives: the Python installation and its package folders."""
    import site
    import sysconfig

    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sysconfig.get_paths().values()}
    try:
        found.update(site.getsitepackages())
        found.add(site.getusersitepackages())
    except AttributeError:  # a virtualenv's old site module
        pass
    return sorted({Path(p).resolve() for p in found if p})


def locate(module: str, search: Path | None) -> list[str] | None:
    """Where importing ``module`` would run code from: each package level's file (or, for a
    namespace package, its folders), ``built-in`` or ``frozen``; found without running any of it,
    the way :func:`evolve.registry.import_path` would find it (``search`` first on ``sys.path``).
    None when it is not found (importing it fails and runs nothing)."""
    parts = module.split(".")
    places: list[str] = []
    below: list[str] | None = None
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        loaded = sys.modules.get(name)
        if loaded is not None:
            origin = getattr(loaded, "__file__", None)
            subs = [str(p) for p in getattr(loaded, "__path__", None) or []]
            origin = origin or (None if subs else "built-in")
        else:
            spec = _top_spec(name, search) if i == 0 else (PathFinder.find_spec(name, below) if below else None)
            if spec is None:
                return None
            origin = spec.origin
            subs = [str(p) for p in spec.submodule_search_locations or []]
        places += [origin] if origin else subs
        below = subs
    return places


def _top_spec(name: str, search: Path | None) -> Any:
    added = search is not None and str(search) not in sys.path
    if added:
        sys.path.insert(0, str(search))
    try:
        return importlib.util.find_spec(name)  # a top-level name: its finders run, no module does
    except (ImportError, ValueError):
        return None
    finally:
        if added:
            sys.path.remove(str(search))


def env_for(roots: Iterable[Path]) -> dict[str, str]:
    """What a child process needs in its environment to apply the guard of ``roots``."""
    return {ENV: json.dumps([str(r) for r in roots]), GUARD_ENV: f"{__name__}:from_env"}


_guards: dict[str, RootsGuard] = {}  # $EVOLVE_MCP_ROOTS -> its guard


def from_env() -> RootsGuard:
    """The guard of this process's ``$EVOLVE_MCP_ROOTS`` (as :func:`env_for` wrote it), built once."""
    roots = os.environ.get(ENV)
    if not roots:
        raise UserError(f"this process runs for evolve mcp, which names its --root folders in ${ENV}; it is unset")
    if roots not in _guards:
        _guards[roots] = RootsGuard.from_env(roots)
    return _guards[roots]


class RootsGuard:
    """The import paths a task may name when its server's roots are ``roots`` (see the module docstring)."""

    def __init__(self, roots: Iterable[str | Path]) -> None:
        self.roots = [Path(r).resolve() for r in roots]
        # installed code is never the task's own; a folder holding a root (a root inside the Python
        # installation) is left out, its library folders below are not
        self.installed = [p for p in installed_folders() if not any(r.is_relative_to(p) for r in self.roots)]
        self._evolve: dict[str, str] | None = None
        self._targets: set[str] | None = None
        self._objects: set[int] | None = None

    @classmethod
    def from_env(cls, value: str) -> RootsGuard:
        """The guard of ``$EVOLVE_MCP_ROOTS`` (as :func:`env_for` wrote it)."""
        return cls(json.loads(value))

    def describe(self) -> str:
        return ", ".join(str(r) for r in self.roots)

    # ------------------------------------------------------------------ what is whose

    def holds(self, place: str | Path) -> bool:
        """Whether ``place`` (a file or folder) is the task's own: under a root, not installed code."""
        p = Path(place).resolve()
        if not any(p == r or p.is_relative_to(r) for r in self.roots):
            return False
        if {"site-packages", "dist-packages"} & set(p.parts):
            return False
        return not any(p == i or p.is_relative_to(i) for i in self.installed)

    def own_module(self, name: str) -> bool:
        """Whether the imported module ``name`` is the task's own code."""
        mod = sys.modules.get(name)
        file = getattr(mod, "__file__", None)
        return isinstance(file, str) and bool(file) and not is_evolve(name) and self.holds(file)

    def targets(self) -> set[str]:
        """What the names of the registries a task file names things from stand for."""
        if self._targets is None:
            from evolve import registry

            self._targets = {canonical(p) for kind in NAMED for p in getattr(registry, kind).entries().values()}
        return self._targets

    def parts(self) -> dict[str, str]:
        """evolvekit's own import paths a task's agent, reward, dataset or hook may name, each with what it is."""
        if self._evolve is None:
            from evolve import registry
            from evolve.world import World

            found: dict[str, str] = {}
            for name in registry.worlds.names():
                try:
                    world = registry.worlds.get(name)
                except Exception:  # noqa: BLE001 - a plugin world that does not import here is nothing a task can name
                    continue
                if not isinstance(world, World):
                    continue
                for what, path in (
                    ("agent", world.agent),
                    ("reward", world.reward),
                    ("dataset", world.dataset),
                    *world.hooks.items(),
                ):
                    found[canonical(path)] = f"the {name} world's {what}"
                module = split(registry.worlds.entries().get(name, ""))[0]
                for attr in _exports(sys.modules.get(module)):
                    found.setdefault(f"{module}:{attr}", f"part of the {name} world")
            for path in HELPERS:
                found.setdefault(path, "an evolvekit task-file helper")
            self._evolve = found
        return self._evolve

    def datasets(self) -> list[str]:
        """The evolvekit import paths ``dataset.source`` may name: the registered worlds' datasets."""
        return [p for p, what in self.parts().items() if what.endswith("world's dataset")] + list(DATASETS)

    def _evolve_objects(self) -> set[int]:
        if self._objects is None:
            from evolve.registry import resolve_trusted

            ids = set()
            for path in [*self.parts(), *self.targets()]:
                try:
                    ids.add(id(resolve_trusted(path)))
                except Exception:  # noqa: BLE001 - a part whose extra is not installed
                    continue
            self._objects = ids
        return self._objects

    # ------------------------------------------------------------------ the checks

    def check(
        self,
        path: str,
        *,
        what: str,
        search: Path | None = None,
        evolve: Iterable[str] | None = None,
        source: str | None = None,
    ) -> None:
        """Refuse ``path`` before anything is imported, unless it names the task's own code or one of
        evolvekit's parts a task may name (``evolve``: those allowed in this field; by default every
        registered part, for a path found where the field is not known)."""
        mod, attr = split(path)
        if not mod or not attr:
            return  # not an import path: import_path says so
        allowed = list({*self.parts(), *self.targets()} if evolve is None else evolve)
        if canonical(path) in allowed:
            return  # (a plugin world's parts too, installed where they are)
        if is_evolve(mod):
            shown = ", ".join(sorted(allowed)[:6]) + (", ..." if len(allowed) > 6 else "")
            raise ConfigError(
                f"{path!r} is evolvekit code that a client's task may not name; name one of evolvekit's "
                f"registered parts ({shown}; docs/mcp.md says which) or a function of the task's own "
                f"under the server's --root folders ({self.describe()})",
                path=what,
                source=source,
            )
        places = locate(mod, search)
        if places is None:
            return  # nothing to import: import_path says it cannot be found
        foreign = [p for p in places if p in ("built-in", "frozen") or not self.holds(p)]
        if foreign:
            where = foreign[0] if foreign[0] in ("built-in", "frozen") else f"in {foreign[0]}"
            raise ConfigError(
                f"{path!r} names the module {mod!r} ({where}), which is not the task's own code; "
                f"through evolve mcp an import path may name only modules under the server's --root "
                f"folders ({self.describe()}), outside installed packages, or evolvekit's "
                "registered parts (docs/mcp.md lists them)",
                path=what,
                source=source,
            )

    def check_object(self, obj: Any, path: str, *, what: str) -> None:
        """Refuse what ``path`` resolved to unless it is defined in the task's own code, is one of
        evolvekit's parts a task may name, or is data (not callable) such as a World or a palette."""
        if inspect.ismodule(obj):
            raise ConfigError(f"{path!r} names a module, not a function, class or object in one", path=what)
        module, attr = split(path)
        if is_evolve(module):
            return  # checked by name before it was imported
        node = sys.modules.get(module)
        for part in attr.split(".")[:-1]:  # my_agent:os.environ reaches through another module
            node = getattr(node, part, None)
            if inspect.ismodule(node) and not self.own_module(node.__name__):
                raise ConfigError(
                    f"{path!r} reaches into the module {node.__name__!r}, which is not the task's own "
                    f"code under the server's --root folders ({self.describe()})",
                    path=what,
                )
        if not callable(obj):
            return  # data the layers read (a World, a palette)
        home = getattr(obj, "__module__", None) or type(obj).__module__
        if isinstance(home, str) and self.own_module(home):
            return
        if id(obj) in self._evolve_objects():
            return
        name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
        raise ConfigError(
            f"{path!r} is {name} from {home!r}, which is not defined in the task's own code under the "
            f"server's --root folders ({self.describe()}); name a function or class defined there",
            path=what,
        )


def _exports(module: Any) -> list[str]:
    """The names a world's module offers: its ``__all__``, else the functions defined in it."""
    if module is None:
        return []
    names = getattr(module, "__all__", None)
    if names is not None:
        return [str(n) for n in names]
    return [
        n
        for n, v in vars(module).items()
        if not n.startswith("_") and inspect.isfunction(v) and v.__module__ == module.__name__
    ]


__all__ = ["ENV", "HELPERS", "RootsGuard", "canonical", "env_for", "from_env", "locate", "split"]
