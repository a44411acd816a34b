"""Run fingerprints: which task configuration a run directory was started with, and whether a
resumed run is the same run.

The fingerprint is the task's canonical JSON (without ``out``). A resume must match it, except:

* the ``budget`` may change: it only decides when to stop; what was done is memoised and seeded
  the same either way, so a run stopped by its budget can be given more;
* fields added to evolvekit after the run started, left at their defaults, are ignored, so an
  older run still resumes.
"""

from __future__ import annotations

import json
import types
import typing

from pydantic import BaseModel

from evolve.config import TaskConfig
from evolve.types import canonical_json


def fingerprint(task: TaskConfig) -> str:
    return canonical_json(task.model_dump(mode="json", exclude={"out"}))


def same_run(task: TaskConfig, saved: str) -> bool:
    """Whether ``task`` may resume the run whose saved fingerprint is ``saved``."""
    ours = without_budget(fingerprint(task))
    return without_budget(saved) in (ours, without_budget(older_fingerprint(task, saved)))


def without_budget(fingerprint: str) -> str:
    """A run fingerprint without its ``budget``: a run may be resumed under another budget (it
    only decides when to stop; what was done is memoised and seeded the same either way)."""
    try:
        data = json.loads(fingerprint)
    except (ValueError, TypeError):
        return fingerprint
    if isinstance(data, dict):
        data.pop("budget", None)
    return canonical_json(data)


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
        if isinstance(ann, type) and issubclass(ann, BaseModel) and isinstance(data[name], dict) \
                and isinstance(old[name], dict):
            _drop_new_defaults(ann, data[name], old[name])
