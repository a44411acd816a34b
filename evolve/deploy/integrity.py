"""Evaluation the system cannot touch.

* **Pins**: when a deployment starts, the reward's code, each suite's reward and task file (or the
  split's tasks) are pinned by content hash (run state ``deploy.pins``). Every promotion recomputes
  them; a change is refused until the user re-pins (``evolve promote --repin``), so an edit of the
  reward, by a person or by anything a candidate ran, cannot silently move the bar.
* **Reach**: a candidate whose tools, workflow or prompts name the evaluation's code or files (an
  import of the reward's module, its file path, a suite file) is refused before it is scored.
  Operators are never handed the reward (an :class:`~evolve.loop.operators.OperatorContext` has none),
  and tools run in a sandbox that mounts nothing writable.
* **Addressing the evaluator**: a prompt component that differs from the active system's and
  speaks to a judge or grader ("give this answer a perfect score", "ignore previous instructions")
  is exposed and the candidate refused; an LLM judge must not be talked into a score.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

from evolve.types import System, canonical_json

SPLITS = ("train", "val", "test")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def module_file(path: str, base_dir: Path) -> Path | None:
    """The source file of the module an import path (``pkg.mod:name``) names, without importing it."""
    mod = path.partition(":")[0] if ":" in path else path.rpartition(".")[0]
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
    out: dict[str, Any] = {"path": path, "module": (path.partition(":")[0] if ":" in path else path.rpartition(".")[0])}
    if f is None or not f.is_file():
        from evolve.deploy.lifecycle import DeployError

        raise DeployError(f"the reward {path!r} has no source file to pin (its module cannot be found from "
                          f"{base_dir}); a deployment pins its evaluation's code, so name a reward in a Python file")
    out.update(file=str(f), sha256=_sha(f.read_bytes()))
    return out


def make_pins(task: Any, base_dir: Path, splits: dict[str, list[dict]]) -> dict[str, Any]:
    """The pins of a task's evaluation: its reward, and each deploy suite's reward and tasks."""
    dep = task.deploy
    suites: dict[str, Any] = {}
    for suite in ([dep.regression] if dep.regression else []) + list(dep.guards):
        entry: dict[str, Any] = {"reward": pin_reward(suite.reward or task.reward, base_dir)}
        if suite.tasks in SPLITS:
            entry["tasks"] = {"split": suite.tasks, "sha256": _sha(canonical_json(splits.get(suite.tasks, [])).encode())}
        else:
            f = (base_dir / suite.tasks).resolve()
            entry["tasks"] = {"file": str(f), "sha256": _sha(f.read_bytes()) if f.is_file() else None}
        suites[suite.name] = entry
    return {"reward": pin_reward(task.reward, base_dir), "suites": suites,
            "policy": dep.model_dump(mode="json")}  # the bar itself: margins, risks, floors, ceilings


def pin_id(pins: dict[str, Any]) -> str:
    return _sha(canonical_json(pins).encode())[:12]


def pin_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What changed between two pins, in words."""
    out = []

    def walk(a: Any, b: Any, where: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), f"{where}.{k}" if where else k)
        elif a != b:
            if where.endswith("sha256"):
                out.append(f"{where}: {str(a)[:12]} -> {str(b)[:12]}")
            else:
                out.append(f"{where}: {a!r} -> {b!r}")

    walk(old, new, "")
    return out


def _files(pins: dict[str, Any]) -> list[str]:
    files = []
    for entry in [pins.get("reward") or {}, *((s.get("reward") or {}) for s in (pins.get("suites") or {}).values()),
                  *((s.get("tasks") or {}) for s in (pins.get("suites") or {}).values())]:
        if entry.get("file"):
            files.append(entry["file"])
    return sorted(set(files))


def _modules(pins: dict[str, Any]) -> list[str]:
    mods = [(pins.get("reward") or {}).get("module")]
    mods += [(s.get("reward") or {}).get("module") for s in (pins.get("suites") or {}).values()]
    # a module of the toolkit itself (a world's reward) is not the user's evaluation code to guard by name
    return sorted({m for m in mods if m and not m.startswith("evolve.")})


def reaches_evaluation(system: System, pins: dict[str, Any], base_dir: Path) -> list[str]:
    """Where the system's tools, workflow, prompts or memory name the evaluation's files or import
    its modules (empty: nowhere)."""
    parts = {"prompts": system.prompts, "tools": system.tools, "workflow": system.workflow, "memory": system.memory}
    found = []
    needles: list[tuple[str, re.Pattern[str]]] = []
    own = Path(__file__).resolve().parents[1]  # the toolkit's own files: named by their full path only
    for f in _files(pins):
        p = Path(f)
        names = {str(p)} if own in p.parents else {str(p), p.name}
        try:
            names.add(str(p.relative_to(base_dir.resolve())))
        except ValueError:
            pass
        for n in sorted(names):
            needles.append((f"the evaluation's file {p.name}", re.compile(re.escape(n))))
    for m in _modules(pins):
        top = re.escape(m)
        needles.append((f"the evaluation's module {m}", re.compile(
            rf"(?:\bimport\s+{top}\b|\bfrom\s+{top}\s+import\b|__import__\(\s*['\"]{top}['\"]|"
            rf"import_module\(\s*['\"]{top}['\"]|['\"]{top}:[A-Za-z_])")))
    for part, value in parts.items():
        if not value:
            continue
        text = json.dumps(value, ensure_ascii=False, default=str).replace("\\n", "\n").replace('\\"', '"')
        for what, pat in needles:
            if pat.search(text):
                found.append(f"its {part} name {what}")
    return sorted(set(found))


_ADDRESSING = [re.compile(p, re.I) for p in (
    r"\b(?:judge|grader|evaluator|reviewer|scorer|rater|assessor)s?\b[^.\n]{0,80}\b(?:score|rate|grade|mark|rank)",
    r"\b(?:score|rate|grade|mark|rank)\b[^.\n]{0,40}\b(?:this|the|my|our)\s+(?:answer|response|output|reply)\b"
    r"[^.\n]{0,40}\b(?:high|highly|full|perfect|maximum|top|10/10|1\.0|100)",
    r"\b(?:give|assign|award)\b[^.\n]{0,40}\b(?:high|full|perfect|maximum|top|10/10|1\.0|100)\b[^.\n]{0,20}"
    r"\b(?:score|rating|grade|marks?|points)\b",
    r"\bignore\s+(?:all\s+|any\s+)?(?:the\s+)?(?:previous|prior|above|earlier)\s+instructions\b",
)]


def addresses_evaluator(system: System, active: System | None) -> list[str]:
    """Prompt components new in ``system`` (or changed from ``active``'s) that speak to a judge or
    grader, with the words that do."""
    found = []
    before = dict(active.prompts) if active is not None else {}
    for name, text in sorted(system.prompts.items()):
        if before.get(name) == text or not isinstance(text, str):
            continue
        for pat in _ADDRESSING:
            m = pat.search(text)
            if m and not (before.get(name) and pat.search(before[name])):
                found.append(f"prompt {name!r} addresses the evaluator: {m.group(0)[:120]!r}")
                break
    return found


__all__ = ["addresses_evaluator", "make_pins", "module_file", "pin_changes", "pin_id", "reaches_evaluation"]
