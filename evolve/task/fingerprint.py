"""Run fingerprints: which task configuration a run directory was started with, and whether a
resumed run is the same run.

The fingerprint is the task's canonical JSON (without ``out``). A resume must match it, except:

* the ``budget`` may change: it only decides when to stop; what was done is memoised and seeded
  the same either way, so a run stopped by its budget can be given more;
* so may ``failures`` (how often to retry the world failing, when to call a run failed),
  ``deploy`` (what a candidate must pass before it serves users) and ``track`` (the trackers the
  run reports to): no stored result depends on them;
* fields added to evolvekit after the run started, left at their defaults, are ignored, so an
  older run still resumes.

Scoring a run's system (``evolve eval``) may also change ``engine.val_size`` and ``test_size``
(:data:`EVAL_FREE`): they say how much of a split is scored, and each task's rollout is memoised,
so a run that scored a few test tasks can have its systems scored on all of them.
"""

from __future__ import annotations

import json
import types
import typing

from pydantic import BaseModel

from evolve.task.config import TaskConfig
from evolve.types import canonical_json


def fingerprint(task: TaskConfig) -> str:
    return canonical_json(task.model_dump(mode="json", exclude={"out"}))


def same_run(task: TaskConfig, saved: str, *, evaluating: bool = False) -> bool:
    """Whether ``task`` may resume the run whose saved fingerprint is ``saved`` (``evaluating``:
    score its systems, which may also change :data:`EVAL_FREE`)."""
    ours = without_budget(fingerprint(task), evaluating=evaluating)
    older = without_budget(older_fingerprint(task, saved), evaluating=evaluating)
    return without_budget(saved, evaluating=evaluating) in (ours, older)


FREE = ("budget", "failures", "deploy", "track")  # sections a resumed run may change (no stored result depends on them)
EVAL_FREE = ("val_size", "test_size")  # engine fields scoring a run's system may change too


def _drop_free(data: object, evaluating: bool) -> None:
    if isinstance(data, dict):
        for key in FREE:
            data.pop(key, None)
        engine = data.get("engine")
        if evaluating and isinstance(engine, dict):
            for key in EVAL_FREE:
                engine.pop(key, None)


def without_budget(fingerprint: str, *, evaluating: bool = False) -> str:
    """A run fingerprint without its :data:`FREE` sections (and with ``evaluating``, the
    :data:`EVAL_FREE` engine fields): a run may be resumed under another budget (it only decides
    when to stop; what was done is memoised and seeded the same either way) or another failure
    policy."""
    try:
        data = json.loads(fingerprint)
    except (ValueError, TypeError):
        return fingerprint
    _drop_free(data, evaluating)
    return canonical_json(data)


def changes(task: TaskConfig, saved: str, limit: int = 8, *, evaluating: bool = False) -> list[str]:
    """What differs between ``task`` and the run started with the fingerprint ``saved``, as
    ``path: old -> new`` lines (the :data:`FREE` sections and fields newer than the run left out;
    with ``evaluating``, the :data:`EVAL_FREE` engine fields too)."""
    try:
        old = json.loads(saved)
    except (ValueError, TypeError):
        return ["(the saved task configuration is unreadable)"]
    new = json.loads(older_fingerprint(task, saved) or fingerprint(task))
    for d in (old, new):
        _drop_free(d, evaluating)
    out: list[str] = []
    _diff(old, new, "", out)
    if len(out) > limit:
        out = out[:limit] + [f"... and {len(out) - limit} more"]
    return out


def _short(v: object) -> str:
    text = json.dumps(v, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 60 else text[:59] + "…"


def _diff(old: object, new: object, path: str, out: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in old:
                out.append(f"{sub}: (not set) -> {_short(new[key])}")
            elif key not in new:
                out.append(f"{sub}: {_short(old[key])} -> (not set)")
            else:
                _diff(old[key], new[key], sub, out)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            _diff(a, b, f"{path}.{i}", out)
    elif old != new:
        out.append(f"{path}: {_short(old)} -> {_short(new)}")


def older_fingerprint(task: TaskConfig, saved: str) -> str:
    """``task``'s run fingerprint as an older evolvekit wrote it: fields the ``saved`` one lacks
    (at the top level or inside a section such as ``budget`` or ``engine``) and that hold their
    default here are left out, so a run started before a field existed resumes (unless the
    field is now set)."""
    data = task.model_dump(mode="json", exclude={"out"})
    try:
        old = json.loads(saved)
    except (ValueError, TypeError):
        return ""
    if not isinstance(old, dict):
        return ""
    _drop_new_defaults(type(task), data, old)
    return canonical_json(data)


def _drop_new_defaults(model: type[BaseModel], data: dict, old: dict) -> None:
    for name, field in model.model_fields.items():
        if name not in data:
            continue
        if name not in old:
            default = field.get_default(call_default_factory=True)
            if isinstance(default, BaseModel):
                default = default.model_dump(mode="json")
            if data[name] == default:
                del data[name]
            continue
        ann = field.annotation  # recurse into a section (a model, or an optional model) only
        if typing.get_origin(ann) in (typing.Union, types.UnionType):
            ann = next((a for a in typing.get_args(ann) if a is not type(None)), None)
        if (
            isinstance(ann, type)
            and issubclass(ann, BaseModel)
            and isinstance(data[name], dict)
            and isinstance(old[name], dict)
        ):
            _drop_new_defaults(ann, data[name], old[name])
