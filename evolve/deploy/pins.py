"""The evaluation pinned by content: what a gate runs may not change between the run's start and a
promotion without a person re-pinning it (``evolve promote --repin``).

What is pinned (run state ``deploy.pins``):

* the reward's file, each suite's reward and tasks (a split's tasks, or the suite's file), and the
  deploy policy itself (margins, risks, floors, ceilings);
* the **code that runs**: the modules the reward (and each suite's reward) and the agent import, found
  by importing them in a child process and reading which modules it loaded. A module in the task
  file's folder, in no installed distribution, or in one installed in place (``pip install -e``), is
  pinned by the sha256 of its file; one of an installed copy by the distribution's version (``numpy
  2.1.0``); the standard library by the Python version;
* the **files they read**: those opened while importing them (the child's audit hook), those a
  pinned module names by a string literal (``open(HERE / "answers.json")``), those listed in
  ``deploy.data_files``, and those seen opened while a gate scored (:func:`watching`) once a person
  accepted them (:mod:`evolve.deploy.reads`), all by content
  and only inside the project's folders (the task file's folder, the folders of pinned modules).

And what runs is what was pinned: during a gate (:func:`from_source`) the pinned modules are imported
anew from their source files, checked against their pins, never from a ``__pycache__``; and a
bytecode cache of a pinned module that Python would load instead of its source (in a worker
process) but that is not what the source compiles to is refused (:func:`forged_caches`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from evolve.deploy.closure import code_pins, file_sha, under
from evolve.types import canonical_json

SPLITS = ("train", "val", "test", "gate")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _module_name(path: str) -> str:
    return path.partition(":")[0] if ":" in path else path.rpartition(".")[0]


def module_file(path: str, base_dir: Path) -> Path | None:
    """The source file of the module an import path (``pkg.mod:name``) names, without importing it."""
    mod = _module_name(path)
    added = str(base_dir) not in sys.path
    if added:
        sys.path.insert(0, str(base_dir))
    try:
        spec = importlib.util.find_spec(mod)
    except (ImportError, ValueError):
        spec = None
    finally:
        if added:
            sys.path.remove(str(base_dir))
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return None
    return Path(spec.origin).resolve()


def pin_reward(path: str, base_dir: Path) -> dict[str, Any]:
    f = module_file(path, base_dir)
    if f is None or not f.is_file():
        from evolve.deploy.lifecycle import DeployError

        raise DeployError(
            f"the reward {path!r} has no source file to pin (its module cannot be found from "
            f"{base_dir}); a deployment pins its evaluation's code, so name a reward in a Python file"
        )
    return {"path": path, "module": _module_name(path), "file": str(f), "sha256": _sha(f.read_bytes())}


def _declared(task: Any, base_dir: Path) -> dict[str, str | None]:
    from evolve.errors import ConfigError

    out = {}
    for i, rel in enumerate(task.deploy.data_files):
        f = (base_dir / rel).resolve()
        if not f.is_file():
            raise ConfigError(
                f"deploy.data_files names {rel!r}, and {f} is not a file; list the files the reward "
                "or agent reads, relative to the task file",
                path=f"deploy.data_files.{i}",
            )
        out[str(f)] = file_sha(f)
    return out


def make_pins(task: Any, base_dir: Path, splits: dict[str, list[dict]], observed: Sequence[str] = ()) -> dict[str, Any]:
    """The pins of a task's evaluation: its reward, each deploy suite's reward and tasks, the policy,
    and the code and files the reward and agent run (``observed``: files seen read by a gate earlier)."""
    dep = task.deploy
    suites: dict[str, Any] = {}
    rewards = [task.reward]
    for suite in ([dep.regression] if dep.regression else []) + list(dep.guards):
        rewards.append(suite.reward or task.reward)
        entry: dict[str, Any] = {"reward": pin_reward(suite.reward or task.reward, base_dir)}
        if suite.tasks in SPLITS:
            entry["tasks"] = {
                "split": suite.tasks,
                "sha256": _sha(canonical_json(splits.get(suite.tasks, [])).encode()),
            }
        else:
            f = (base_dir / suite.tasks).resolve()
            entry["tasks"] = {"file": str(f), "sha256": _sha(f.read_bytes()) if f.is_file() else None}
        suites[suite.name] = entry
    reward_mods = sorted({_module_name(r) for r in rewards} - {""})
    agent_mods = [m for m in [_module_name(task.agent)] if m]
    reward_code, roots = code_pins(reward_mods, base_dir)
    agent_code, agent_roots = (reward_code, roots) if agent_mods == reward_mods else code_pins(agent_mods, base_dir)
    files = _declared(task, base_dir) | {f: file_sha(f) for f in sorted(set(observed))}
    code = {
        "reward": reward_code,
        "agent": agent_code,
        "files": files,
        "observed": sorted(set(observed)),
        "roots": [str(r) for r in sorted(set(roots) | set(agent_roots))],
        "python": ".".join(map(str, sys.version_info[:3])),
    }
    return {
        "reward": pin_reward(task.reward, base_dir),
        "suites": suites,
        "code": code,
        "policy": dep.model_dump(mode="json"),
    }  # the bar itself: margins, risks, floors, ceilings


def pin_id(pins: dict[str, Any]) -> str:
    return _sha(canonical_json(pins).encode())[:12]


def _file_change(where: list[str], a: Any, b: Any) -> tuple[str, str] | None:
    """A changed file of the pins as (its path, whose it is), or None when ``where`` is not a file's
    content; a module, file or package that came or went is said in full as ("", words)."""
    code = where[1:] if where[:1] == ["code"] else []
    if len(code) == 3 and code[0] in ("reward", "agent") and code[1] in ("modules", "packages", "files"):
        role, kind, name = code
        if kind == "packages":
            return "", f"the {role}'s package {name}: {a or 'not imported'} -> {b or 'not imported'}"
        f = (b or a)["file"] if kind == "modules" else name
        if not a or not b:
            return "", (
                f"the {role} {'now imports' if b else 'no longer imports'} {name} ({f})"
                if kind == "modules"
                else f"{f} {'is new among' if b else 'is gone from'} the files the {role} reads"
            )
        return f, (f"module {name}, run by the {role}" if kind == "modules" else f"read by the {role}")
    if len(code) == 2 and code[0] == "files":
        return (
            (code[1], "read by the evaluation")
            if a and b
            else ("", f"{code[1]} {'is new among' if b else 'is gone from'} the files the evaluation reads")
        )
    return None


def pin_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What changed between two pins, in words: each changed file by its path and whose it is."""
    out: list[str] = []
    files: dict[str, list[str]] = {}
    modules = {
        m["file"]
        for r in ("reward", "agent")
        for m in (((new.get("code") or {}).get(r) or {}).get("modules") or {}).values()
    }

    def walk(a: Any, b: Any, where: list[str]) -> None:
        if a == b or where == ["code", "roots"]:  # the roots follow the modules
            return
        if where == ["code"] and not a:
            out.append("the code the evaluation runs is not pinned yet (pinned by an older evolvekit)")
            return
        if where[-1:] == ["reward"] and isinstance(a, dict) and isinstance(b, dict) and b.get("file") in modules:
            a, b = ({k: v for k, v in x.items() if k != "sha256"} for x in (a, b))  # said by the code's modules
        said = _file_change(where, a, b)
        if said is not None:
            if said[0]:
                files.setdefault(said[0], []).append(said[1])
            else:
                out.append(said[1])
        elif isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), where + [k])
        elif where[-1] == "sha256":
            out.append(f"{'.'.join(where)}: {str(a)[:12]} -> {str(b)[:12]}")
        else:
            out.append(f"{'.'.join(where)}: {a!r} -> {b!r}")

    walk(old, new, [])
    return [f"{f} changed ({'; '.join(dict.fromkeys(w))})" for f, w in files.items()] + out


def pinned_files(pins: dict[str, Any], role: str | None = None) -> list[str]:
    """The files the pins hold by content (``role``: the reward's or the agent's code only, with the
    files the evaluation reads)."""
    code = pins.get("code") or {}
    files = set(code.get("files") or {})
    for r in [role] if role else ["reward", "agent"]:
        part = code.get(r) or {}
        files |= {m["file"] for m in (part.get("modules") or {}).values()} | set(part.get("files") or {})
    return sorted(files)


# ----------------------------------------------------------------------------- running what was pinned

_watchers: list[list[str]] = []  # the lists of the watches under way
_hooked = False


def _audit(event: str, args: tuple) -> None:
    if _watchers and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        mode = args[1] if len(args) > 1 else None
        flags = args[2] if len(args) > 2 else 0
        if (isinstance(mode, str) and not set(mode) & set("wax+")) or (
            mode is None and isinstance(flags, int) and flags & 3 == 0
        ):  # os.open(path, O_RDONLY)
            with contextlib.suppress(Exception):
                path = os.fsdecode(args[0])
                for seen in list(_watchers):
                    seen.append(path)


@contextlib.contextmanager
def watching() -> Iterator[list[str]]:
    """The files this process opens for reading meanwhile (a gate's rollouts on the thread runner)."""
    global _hooked
    if not _hooked:
        sys.addaudithook(_audit)  # for the process's life; it does nothing while no watch is under way
        _hooked = True
    seen: list[str] = []
    _watchers.append(seen)
    try:
        yield seen
    finally:
        _watchers.remove(seen)


def unpinned_reads(pins: dict[str, Any], seen: list[str], run_dir: Path) -> list[str]:
    """Files inside the project's folders that a gate read and the pins do not hold."""
    roots = [Path(r) for r in (pins.get("code") or {}).get("roots", [])]
    known = set(pinned_files(pins))
    known |= {s["tasks"]["file"] for s in (pins.get("suites") or {}).values() if s["tasks"].get("file")}
    run = run_dir.resolve()
    out = set()
    for p in seen:
        with contextlib.suppress(OSError, ValueError):
            f = Path(p).resolve()
            if f.suffix == ".pyc":  # a module loaded from its cache: its source is what was read
                f = Path(importlib.util.source_from_cache(str(f)))
            if str(f) not in known and f.is_file() and any(under(f, r) for r in roots) and not under(f, run):
                out.add(str(f))
    return sorted(out)


def _pinned_sources(pins: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    code = pins.get("code") or {}
    return {
        n: (m["file"], m["sha256"])
        for r in ("reward", "agent")
        for n, m in ((code.get(r) or {}).get("modules") or {}).items()
        if m["file"].endswith(".py")
    }


class _PinnedSource(importlib.machinery.SourceFileLoader):
    """Loads a pinned module from its source, never from a bytecode cache, and only as pinned."""

    def __init__(self, name: str, path: str, sha256: str | None) -> None:
        super().__init__(name, path)
        self.sha256 = sha256

    def get_code(self, fullname: str) -> Any:
        data = self.get_data(self.path)
        if self.sha256 is not None and _sha(data) != self.sha256:
            raise ImportError(
                f"{self.path} changed since the evaluation was pinned; review the change, then re-pin "
                "it with evolve promote TASK RUN --repin"
            )
        return self.source_to_code(data, self.path)


class _PinnedFinder(importlib.abc.MetaPathFinder):
    def __init__(self, sources: dict[str, tuple[str, str | None]]) -> None:
        self.sources = sources

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.sources:
            return None
        file, sha = self.sources[name]
        return importlib.util.spec_from_file_location(name, file, loader=_PinnedSource(name, file, sha))


@contextlib.contextmanager
def from_source(pins: dict[str, Any]) -> Iterator[None]:
    """Meanwhile, this process imports each pinned module anew, from its source file as pinned
    (its bytecode cache unread; a source changed since is an ImportError)."""
    sources = _pinned_sources(pins)
    for n, (file, _) in sources.items():
        if file.endswith("__init__.py") and any(k.startswith(n + ".") and k not in sources for k in list(sys.modules)):
            continue  # a package other loaded modules belong to stays (its cache is checked: forged_caches)
        sys.modules.pop(n, None)
    finder = _PinnedFinder(sources)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


def forged_caches(pins: dict[str, Any]) -> list[str]:
    """Bytecode caches of pinned modules that Python would load instead of the source and that are
    not what the source compiles to (stale or forged): a worker process could run them."""
    import _imp
    import marshal

    out = []
    for name, (file, _) in sorted(_pinned_sources(pins).items()):
        caches = {importlib.util.cache_from_source(file)}
        if sys.pycache_prefix:
            with contextlib.suppress(ValueError):
                caches.add(str(Path(file).parent / "__pycache__" / Path(importlib.util.cache_from_source(file)).name))
        for cache in sorted(caches):
            try:
                data, src, st = Path(cache).read_bytes(), Path(file).read_bytes(), Path(file).stat()
            except OSError:
                continue
            if len(data) < 16 or data[:4] != importlib.util.MAGIC_NUMBER:
                continue  # Python reads the source instead
            flags = int.from_bytes(data[4:8], "little")
            if flags == 0 and (
                int.from_bytes(data[8:12], "little") != int(st.st_mtime) & 0xFFFFFFFF
                or int.from_bytes(data[12:16], "little") != len(src) & 0xFFFFFFFF
            ):
                continue  # out of date: Python recompiles
            if flags & 0b10 and data[8:16] != _imp.source_hash(
                int.from_bytes(importlib.util.MAGIC_NUMBER, "little"), src
            ):
                continue  # a checked hash that does not match: Python recompiles
            try:
                same = marshal.loads(data[16:]) == _PinnedSource(name, file, None).source_to_code(src, file)
            except Exception:  # noqa: BLE001 - unreadable: not what the source compiles to
                same = False
            if not same:
                out.append(f"{cache} (module {name}) is not what {file} compiles to")
    return out


PINS_KEY = "deploy.pins"  # the archive state holding the pins in force: {pins, id, by}


def save_pins(archive: Any, pins: dict[str, Any], by: str, saved: Any) -> tuple[dict[str, Any], str]:
    """Record ``pins`` as the ones in force (replacing ``saved``), with the event that says who pinned them."""
    pid = pin_id(pins)
    with archive.transaction():
        archive.put_state(PINS_KEY, {"pins": pins, "id": pid, "by": by})
        archive.log_event("deploy_pin", {"id": pid, "by": by, "pins": pins, "replaced": (saved or {}).get("id")})
    return pins, pid


__all__ = [
    "PINS_KEY",
    "forged_caches",
    "from_source",
    "make_pins",
    "module_file",
    "pin_changes",
    "pin_id",
    "pinned_files",
    "save_pins",
    "unpinned_reads",
    "watching",
]
