"""Evaluation the system cannot touch.

* **Pins** (:mod:`~evolve.deploy.pins`): the reward's and agent's code, the files they read, each
  suite's reward and tasks and the policy, pinned when the deployment starts; every promotion
  recomputes them, and a change is refused until the user re-pins (``evolve promote --repin``), so
  an edit of the evaluation, by a person or by anything a candidate ran, cannot silently move the bar.
* **Reach**: a candidate whose tools, workflow or prompts name the evaluation's code or files (an
  import of the reward's module or of a module only the reward imports, its file path, a file it
  reads, a suite file) is refused before it is scored. Operators are never handed the reward (an
  :class:`~evolve.loop.operators.OperatorContext` has none), and tools run in a sandbox that mounts
  nothing writable.
* **Addressing the evaluator**: a prompt component that differs from the active system's and
  speaks to a judge or grader ("give this answer a perfect score", "ignore previous instructions")
  is exposed and the candidate refused; an LLM judge must not be talked into a score.
* **Told the answers**: a candidate whose text components hold the expected answer of a task a
  gate scores on (:func:`carries_answers`) is refused before it is scored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evolve.deploy.pins import make_pins, module_file, pin_changes, pin_id, pinned_files  # noqa: F401 (re-exported)
from evolve.types import System


def _agent_only(pins: dict[str, Any]) -> dict[str, Any]:
    """The modules only the agent imports (its own code: the system's, not the evaluation's)."""
    code = pins.get("code") or {}
    reward = (code.get("reward") or {}).get("modules") or {}
    return {n: m for n, m in ((code.get("agent") or {}).get("modules") or {}).items() if n not in reward}


def _files(pins: dict[str, Any]) -> list[str]:
    """The evaluation's files: the rewards', the suites' task files, the reward's code (a module the
    agent imports too included: writing it changes the reward) and what it reads."""
    agents = {m["file"] for m in _agent_only(pins).values()}
    files = set(pinned_files(pins, "reward")) - agents
    for entry in [
        pins.get("reward") or {},
        *((s.get("reward") or {}) for s in (pins.get("suites") or {}).values()),
        *((s.get("tasks") or {}) for s in (pins.get("suites") or {}).values()),
    ]:
        if entry.get("file"):
            files.add(entry["file"])
    return sorted(files)


def _modules(pins: dict[str, Any]) -> list[str]:
    mods = [(pins.get("reward") or {}).get("module")]
    mods += [(s.get("reward") or {}).get("module") for s in (pins.get("suites") or {}).values()]
    code = pins.get("code") or {}
    mods += sorted(set((code.get("reward") or {}).get("modules") or {}) - set(_agent_only(pins)))
    # a module of the toolkit itself (a world's reward) is not the user's evaluation code to guard by name
    return sorted({m for m in mods if m and not m.startswith("evolve.")})


def memory_items(system: System) -> tuple[dict[str, Any], str | None]:
    """What the system's memory holds for it: each item it reads (active at its version) by id, with
    its text and metadata; and why they cannot be read (None: they were, or it has no memory). The
    store is opened read-only and left as it was (:func:`evolve.memory.view.memory_view`)."""
    spec = dict(system.memory or {})
    if not spec.get("store") or spec.get("version") is None:
        return {}, None
    from evolve.registry import views

    try:
        got = views.get("memory")(spec, None, limit=10**9)
    except Exception as e:  # noqa: BLE001 - a store that cannot be read cannot be checked
        return {}, f"its memory store {spec['store']} cannot be read ({type(e).__name__}: {e})"
    if got.get("missing"):
        return {}, f"{got['missing']}, so its memory cannot be checked"
    return {
        i["id"]: {"text": i.get("text"), "metadata": i.get("metadata")}
        for i in got["items"]
        if i.get("status") == "active"
    }, None


def reaches_evaluation(
    system: System, pins: dict[str, Any], base_dir: Path, split_files: Sequence[str] = ()
) -> list[str]:
    """Where the system's tools, workflow, prompts or memory name the evaluation's files or import
    its modules (empty: nowhere). ``split_files``: the dataset files a suite on a split scores
    (:func:`evolve.deploy.gates.split_files`)."""
    items, unread = memory_items(system)
    parts = {
        "prompts": system.prompts,
        "tools": system.tools,
        "workflow": system.workflow,
        "memory": {"spec": system.memory, "items": items} if items else system.memory,
    }
    found = [unread] if unread else []
    needles: list[tuple[str, re.Pattern[str]]] = []
    own = Path(__file__).resolve().parents[1]  # the toolkit's own files: named by their full path only
    for f in sorted(set(_files(pins)) | set(split_files)):
        p = Path(f)
        names = {str(p)} if own in p.parents or p.name == "__init__.py" else {str(p), p.name}
        try:
            names.add(str(p.relative_to(base_dir.resolve())))
        except ValueError:
            pass
        for n in sorted(names):
            needles.append((f"the evaluation's file {p.name}", re.compile(re.escape(n))))
    for m in _modules(pins):
        top = re.escape(m)
        needles.append(
            (
                f"the evaluation's module {m}",
                re.compile(
                    rf"(?:\bimport\s+{top}\b|\bfrom\s+{top}\s+import\b|__import__\(\s*['\"]{top}['\"]|"
                    rf"import_module\(\s*['\"]{top}['\"]|['\"]{top}:[A-Za-z_])"
                ),
            )
        )
    for part, value in parts.items():
        if not value:
            continue
        text = json.dumps(value, ensure_ascii=False, default=str).replace("\\n", "\n").replace('\\"', '"')
        for what, pat in needles:
            if pat.search(text):
                found.append(f"its {part} name {what}")
    return sorted(set(found))


_ADDRESSING = [
    re.compile(p, re.I)
    for p in (
        r"\b(?:judge|grader|evaluator|reviewer|scorer|rater|assessor)s?\b[^.\n]{0,80}\b(?:score|rate|grade|mark|rank)",
        r"\b(?:score|rate|grade|mark|rank)\b[^.\n]{0,40}\b(?:this|the|my|our)\s+(?:answer|response|output|reply)\b"
        r"[^.\n]{0,40}\b(?:high|highly|full|perfect|maximum|top|10/10|1\.0|100)",
        r"\b(?:give|assign|award)\b[^.\n]{0,40}\b(?:high|full|perfect|maximum|top|10/10|1\.0|100)\b[^.\n]{0,20}"
        r"\b(?:score|rating|grade|marks?|points)\b",
        r"\bignore\s+(?:all\s+|any\s+)?(?:the\s+)?(?:previous|prior|above|earlier)\s+instructions\b",
    )
]


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


# ----------------------------------------------------------------------------- a gate's answers

MIN_ANSWER_CHARS = 8  # shorter answers ("4", "yes", "Paris") turn up in any text


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


def _leaves(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in [str(k), *_leaves(v)]]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _leaves(v)]
    return [] if value is None or isinstance(value, bool) else [str(value)]


def answer_fields(task: dict[str, Any], fields: list[str] | None = None) -> list[str]:
    """The fields of ``task`` that hold its expected answer: ``fields``, or by default those whose
    name contains gold, answer, expected, solution, label, target or reference."""
    from evolve.reflexion.reflect import HIDDEN

    if fields is not None:
        return [k for k in fields if k in task]
    return [k for k in task if any(h in str(k).lower() for h in HIDDEN)]


def carries_answers(
    system: System, suites: dict[str, list[dict]], fields: list[str] | None = None, limit: int = 5
) -> list[str]:
    """Where the system's text components (prompts, memory items, tools, workflow) hold the expected answer
    of a task a gate scores on, compared after case folding and collapsing whitespace; answers
    shorter than :data:`MIN_ANSWER_CHARS` are skipped. At most ``limit`` findings, then a count."""
    texts = [
        (f"{label} {name!r}", _norm("\n".join(_leaves(value))))
        for part, label in (("prompts", "prompt"), ("memory", "memory"), ("tools", "tool"), ("workflow", "workflow"))
        for name, value in sorted(getattr(system, part).items())
    ]
    texts += [
        (f"memory item {iid!r}", _norm("\n".join(_leaves(item))))
        for iid, item in sorted(memory_items(system)[0].items())
    ]  # what it reads, not the store's path
    found = []
    for suite, tasks in suites.items():
        for t in tasks:
            for field in answer_fields(t, fields):
                for ans in sorted({_norm(x) for x in _leaves(t[field])}):
                    if len(ans) < MIN_ANSWER_CHARS:
                        continue
                    for where, text in texts:
                        if ans in text:
                            shown = ans if len(ans) <= 60 else ans[:59] + "…"
                            found.append(
                                f"its {where} holds the expected answer of the {suite} gate's task "
                                f"{t.get('id')} ({field}: {shown!r})"
                            )
    return found[:limit] + (
        [f"and {len(found) - limit} more expected answers of gate tasks"] if len(found) > limit else []
    )


__all__ = [
    "addresses_evaluator",
    "answer_fields",
    "carries_answers",
    "make_pins",
    "memory_items",
    "module_file",
    "pin_changes",
    "pin_id",
    "reaches_evaluation",
]
