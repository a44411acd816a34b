"""What importing a module runs: the modules it loads, found by importing it in a child process
(project modules and distributions installed in place by content, installed copies by version),
and the project files it reads (opened meanwhile, or named by a string literal of its code). See :mod:`evolve.deploy.pins`."""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any


def file_sha(path: str | Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


# Run in a child process: import the modules, then say which modules were loaded (name -> file) and
# which files were opened for reading meanwhile. Its result goes to a file: a module may print.
_PROBE = r"""
import importlib, importlib.machinery as im, json, os, sys
req = json.load(open(sys.argv[1]))
sys.path[:] = req["path"]
before = set(sys.modules)
installed = tuple(req["installed"])

class Source(im.SourceFileLoader):  # a module outside the installed ones: from its source, never its cache
    def get_code(self, fullname):
        return self.source_to_code(self.get_data(self.path), self.path)

class FromSource:
    @staticmethod
    def find_spec(name, path=None, target=None):
        for finder in sys.meta_path:
            if finder is not FromSource and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    if type(spec.loader) is im.SourceFileLoader and not os.path.realpath(spec.origin).startswith(installed):
                        spec.loader = Source(name, spec.origin)
                    return spec
        return None

sys.meta_path.insert(0, FromSource)
opened = []

def hook(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        mode = args[1] if len(args) > 1 else None
        flags = args[2] if len(args) > 2 else 0
        if (isinstance(mode, str) and not set(mode) & set("wax+")) or (
                mode is None and isinstance(flags, int) and flags & 3 == 0):
            opened.append(os.fsdecode(args[0]))

sys.addaudithook(hook)
errors = []
for m in req["modules"]:
    try:
        importlib.import_module(m)
    except BaseException as e:
        errors.append(f"importing {m} raised {type(e).__name__}: {e}")
mods = {n: getattr(sys.modules[n], "__file__", None) for n in set(sys.modules) - before if sys.modules.get(n) is not None}
with open(req["out"], "w") as f:
    json.dump({"modules": mods, "opened": opened, "errors": errors}, f)
os._exit(0)  # a thread or exit hook a module left behind does not hold the child
"""


def _probe(modules: list[str], base_dir: Path) -> dict[str, Any]:
    from evolve.deploy.lifecycle import DeployError

    with tempfile.TemporaryDirectory(prefix="evolve-pins-") as tmp:
        req, out = Path(tmp) / "req.json", Path(tmp) / "out.json"
        req.write_text(
            json.dumps(
                {
                    "path": [str(base_dir)] + [p for p in sys.path if p != str(base_dir)],
                    "modules": modules,
                    "out": str(out),
                    "installed": [str(r) + os.sep for r in _installed_roots()],
                }
            )
        )
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _PROBE, str(req)], env=env, capture_output=True, text=True, timeout=300
            )
        except subprocess.TimeoutExpired:
            raise DeployError(f"pinning the evaluation: importing {', '.join(modules)} took over 300 s") from None
        if proc.returncode != 0 or not out.is_file():
            raise DeployError(
                f"pinning the evaluation: importing {', '.join(modules)} in a child process failed: "
                f"{(proc.stderr or '').strip()[-500:]}"
            )
        res = json.loads(out.read_text())
    if res["errors"]:
        raise DeployError("pinning the evaluation: " + "; ".join(res["errors"]))
    return res


def _installed_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = {Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return sorted(roots | {Path(sys.base_prefix).resolve() / "lib"})


_DISTS: tuple[Any, dict[str, dict[str, str]]] | None = None


def _distributions() -> dict[str, dict[str, str]]:
    """Top-level import name -> {distribution: version} of what is installed (cached while no folder
    on ``sys.path`` changes: an install or upgrade changes its folder)."""
    import importlib.metadata as md

    global _DISTS
    key = []
    for p in sys.path:
        with contextlib.suppress(OSError):
            key.append((p, os.stat(p or ".").st_mtime_ns))
    if _DISTS is None or _DISTS[0] != key:
        versions: dict[str, str] = {}
        out: dict[str, dict[str, str]] = {}
        for top, names in md.packages_distributions().items():
            for d in names:
                if d not in versions:
                    with contextlib.suppress(md.PackageNotFoundError):
                        versions[d] = md.version(d)
                if d in versions:
                    out.setdefault(top, {})[d] = versions[d]
        _DISTS = (key, out)
    return _DISTS[1]


def _installed_copy(top: str, file: Path, installed: list[Path]) -> bool:
    """Whether ``file`` is the installed copy of a distribution of the top-level package ``top``
    (pinned by the distribution's version), not its source used in place: ``pip install -e``
    (``direct_url.json`` says editable, or the module lies outside the folder of its metadata),
    or ``setup.py develop`` (an ``.egg-info`` outside the installed folders)."""
    import importlib.metadata as md

    for name in _distributions().get(top, {}):
        with contextlib.suppress(md.PackageNotFoundError, OSError, ValueError):
            dist = md.distribution(name)
            meta = Path(getattr(dist, "_path", "")).resolve()
            with contextlib.suppress(ValueError, TypeError):
                url = json.loads(dist.read_text("direct_url.json") or "{}")
                if (url.get("dir_info") or {}).get("editable"):
                    return False
            if meta.suffix == ".egg-info" and not any(under(meta, r) for r in installed):
                return False
            if under(file, meta.parent):
                return True
    return False


def _root_of(name: str, file: Path) -> Path:
    """The folder of a module's top-level package (of a top-level module: its folder)."""
    depth = name.count(".") + (1 if file.name == "__init__.py" else 0)
    return file.parents[depth - 1] if depth else file.parent


def _literal_files(source: Path, roots: list[Path], base_dir: Path) -> set[Path]:
    """Existing files inside ``roots`` that a string literal of ``source`` names (relative to the
    module's folder or the task file's folder, or absolute)."""
    try:
        tree = ast.parse(source.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return set()
    out = set()
    for node in ast.walk(tree):
        s = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
        if not s or len(s) > 255 or "\n" in s or "\x00" in s or not ("." in s or "/" in s):
            continue
        for cand in (source.parent / s, base_dir / s):
            with contextlib.suppress(OSError, ValueError):
                p = cand.resolve()
                if p.is_file() and any(under(p, r) for r in roots):
                    out.add(p)
    return out


def code_pins(modules: list[str], base_dir: Path) -> tuple[dict[str, Any], list[Path]]:
    """What importing ``modules`` runs: ``{"modules": {name: {file, sha256}}, "packages": {dist: version},
    "files": {path: sha256}}``, and the project folders it comes from."""
    res = _probe(modules, base_dir)
    base = base_dir.resolve()
    installed = _installed_roots()
    dists = _distributions()
    mods: dict[str, Any] = {}
    packages: dict[str, str] = {}

    def version(name: str) -> None:
        packages.update(dists.get(name.partition(".")[0], {}))

    for name, file in sorted(res["modules"].items()):
        if not file or name == "__main__":
            continue
        f = Path(file).resolve()
        top = name.partition(".")[0]
        if any(under(f, r) for r in installed) or "evolvekit" in dists.get(top, {}):
            version(name)  # the standard library, an installed package, or the toolkit running this (its version)
        elif under(f, base) or not dists.get(top) or not _installed_copy(top, f, installed):
            # the project's own code, or a distribution used in place (pip install -e): by content, as an
            # edit to it is a change of the evaluation that its version does not show
            mods[name] = {"file": str(f), "sha256": file_sha(f)}
        else:  # an installed copy outside the standard folders (pip install --target)
            version(name)
    roots = sorted({base} | {_root_of(n, Path(m["file"])) for n, m in mods.items()})
    files: set[Path] = set()
    for m in mods.values():
        if m["file"].endswith(".py"):
            files |= _literal_files(Path(m["file"]), roots, base)
    for p in res["opened"]:
        with contextlib.suppress(OSError, ValueError):
            f = Path(p).resolve()
            if f.is_file() and any(under(f, r) for r in roots) and "__pycache__" not in f.parts:
                files.add(f)
    module_files = {m["file"] for m in mods.values()}
    return {
        "modules": mods,
        "packages": packages,
        "files": {str(f): file_sha(f) for f in sorted(files) if str(f) not in module_files},
    }, roots


__all__ = ["code_pins", "file_sha", "under"]
