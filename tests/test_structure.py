"""The import structure of the library, scanned from the source (imports at any depth: lazy ones
inside functions, those under ``if TYPE_CHECKING:`` and those by a string, ``import_module("evolve.x")``,
included): no circle between modules, the core reaches a layer or a world only through registries
(names resolved at run time), the core's floors import only downward, and no module imports another
module's private names."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
LAYERS = (
    "evolve.policy",
    "evolve.memory",
    "evolve.prompts",
    "evolve.toolforge",
    "evolve.topology",
    "evolve.sandbox",
    "evolve.worlds",
)


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg, folder in PACKAGE_DIRS.items():
        for f in (ROOT / folder).rglob("*.py"):
            parts = list(f.relative_to(ROOT / folder).with_suffix("").parts)
            if pkg == "evolve" and parts and f"evolve.{parts[0]}" in PACKAGE_DIRS:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([pkg, *parts])] = f
    return mods


MODULES = _modules()


IMPORT_CALLS = ("import_module", "__import__")  # importlib.import_module("m"), import_module("m"), __import__("m")


def _imports(path: Path):
    """Every import of the module, at any depth: at the top, inside functions, under ``if
    TYPE_CHECKING:`` (an import only a type checker reads is still a dependency of the design), and
    by a string naming the module (``importlib.import_module("evolve.x")``, ``__import__("evolve.x")``),
    each given as an ``ast.Import``."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.Call) and _called(node.func) in IMPORT_CALLS and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value:
                yield ast.Import(names=[ast.alias(name=arg.value)])


def _called(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _resolve(name: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _owner(target: str) -> str | None:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for name, path in MODULES.items():
        is_pkg = path.name == "__init__.py"
        for node in _imports(path):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                mod = _resolve(name, node, is_pkg)
                subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES]
                targets = subs if len(subs) == len(node.names) else [mod, *subs]
            for t in targets:
                owner = _owner(t)
                # a module's own packages are imported before it: never a circle
                if owner and owner != name and not name.startswith(owner + "."):
                    g.add_edge(name, owner)
    return g


def _layer(module: str) -> str | None:
    return next((lay for lay in LAYERS if module == lay or module.startswith(lay + ".")), None)


def test_the_scan_sees_the_whole_library():
    assert len(MODULES) > 140 and "evolve.scoring.session" in MODULES and "evolve.policy.grpo" in MODULES
    assert _graph().number_of_edges() > 300


def test_no_module_imports_itself_back_through_a_circle():
    g = _graph()
    circles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert not circles, [list(nx.simple_cycles(g.subgraph(c)))[:2] for c in circles]


def test_the_core_reaches_layers_and_worlds_only_through_registries():
    leaks = sorted((a, b) for a, b in _graph().edges if _layer(a) is None and _layer(b))
    assert not leaks, leaks


def test_no_module_imports_another_modules_private_names():
    found = []
    for name, path in MODULES.items():
        is_pkg = path.name == "__init__.py"
        for node in _imports(path):
            if isinstance(node, ast.ImportFrom):
                mod = _resolve(name, node, is_pkg)
                for a in node.names:
                    private_module = f"{mod}.{a.name}" in MODULES  # `from . import _seccomp`: a submodule
                    same_package = mod == name.rpartition(".")[0] or mod == name
                    if a.name.startswith("_") and not a.name.startswith("__") and not (private_module and same_package):
                        found.append(f"{name}: from {mod} import {a.name}")
                parts = mod.split(".")
                outside = [p for p in parts if p.startswith("_") and not p.startswith("__")]
                owner = ".".join(parts[: parts.index(outside[0])]) if outside else ""  # its package
                if outside and name != owner and not name.startswith(owner + "."):
                    found.append(f"{name}: imports the private module {mod}")
    assert not found, found


# The core's floors, lowest first (evolve/__init__.py draws the same): a module imports only modules on
# its own floor or below (on one floor, no circle). Each entry is a package or module; a module belongs to
# the entry that names it most closely. Every module of the core has a floor.
FLOORS = (  # (name, how evolve/__init__.py's drawing marks it, its packages and modules)
    (
        "foundations",
        "* foundations",
        (
            "evolve.errors",
            "evolve.types",
            "evolve._env",
            "evolve.failures",
            "evolve.registry",
            "evolve.artifacts",
            "evolve.otel",
            "evolve.world",
            "evolve.archive",
            "evolve.llm",
        ),
    ),
    ("the task file", "* ``task/``", ("evolve.task",)),
    ("the HTTP engine", "* ``gateway/``", ("evolve.gateway",)),
    ("rollouts", "* rollouts", ("evolve.rollout", "evolve.runners", "evolve.cluster")),
    ("scoring", "* ``scoring/``", ("evolve.scoring",)),
    ("results", "* ``results/``", ("evolve.results", "evolve.reflexion")),
    ("deploy", "* ``deploy/``", ("evolve.deploy",)),
    ("trackers", "* ``trackers/``", ("evolve.trackers",)),
    ("the loop", "* ``loop/``", ("evolve.loop",)),
    (
        "surfaces",
        "* surfaces",
        ("evolve.api", "evolve.ui", "evolve.mcp", "evolve.serve"),
    ),
    ("the command line", "* ``cli/``", ("evolve.cli", "evolve.__main__")),
)
UNFLOORED = {"evolve"}  # the package itself: lazy names of every floor (evolve/__init__.py's _LAZY)


def _floor(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (length of the entry, floor)
    for i, (_, _, entries) in enumerate(FLOORS):
        for e in entries:
            if (module == e or module.startswith(e + ".")) and (best is None or len(e) > best[0]):
                best = (len(e), i)
    return None if best is None else best[1]


def test_every_module_of_the_core_has_a_floor():
    core = [m for m in MODULES if _layer(m) is None and m not in UNFLOORED]
    assert len(core) > 100
    assert not [m for m in core if _floor(m) is None]


def test_the_cores_floors_import_only_downward():
    up = sorted(
        f"{a} ({FLOORS[_floor(a)][0]}) -> {b} ({FLOORS[_floor(b)][0]})"
        for a, b in _graph().edges
        if _floor(a) is not None and _floor(b) is not None and _floor(b) > _floor(a)
    )
    assert not up, up


def test_evolve_init_draws_the_same_floors_in_the_same_order():
    doc = (ROOT / "evolve" / "__init__.py").read_text()
    places = [doc.find("\n" + mark) for _, mark, _ in FLOORS]
    assert -1 not in places, [mark for (_, mark, _), at in zip(FLOORS, places) if at == -1]
    assert places == sorted(places)
    for _, mark, entries in FLOORS:  # each floor's packages are named on its line(s)
        start = doc.find("\n" + mark)
        text = doc[start : doc.find("\n* ", start + 1)]
        short = [e.removeprefix("evolve.") for e in entries if e.count(".") == 1 and not e.startswith("evolve._")]
        assert all(f"``{n}``" in text or f"``{n}/``" in text for n in short), (mark, short)
