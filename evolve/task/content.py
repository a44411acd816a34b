"""Each task's content hash, recorded in the run: which tasks two runs share.

Task ids repeat across runs that hold other tasks (a dataset generated from the seed numbers its
tasks the same way for every seed), so a comparison of two runs pairs a task only when both runs
recorded it with the same content (:func:`evolve.results.pairing.same_tasks`). A run records the
hash of each of its tasks when it opens (:func:`record`, the ``task_hashes`` run state).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

KEY = "task_hashes"  # run state: {split: {task id: content hash}}


def task_hash(task: Mapping[str, Any]) -> str:
    """A short hash of a task's whole content (its canonical JSON)."""
    text = json.dumps(task, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def task_hashes(splits: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, str]]:
    return {split: {str(t.get("id")): task_hash(t) for t in tasks} for split, tasks in splits.items()}


def record(archive: Any, splits: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    """Store the content hash of each task of the run in ``archive``: the tasks it started its work
    with (a start that did no work yet records them again)."""
    saved, now = archive.get_state(KEY), task_hashes(splits)
    if saved != now and (saved is None or not archive.usage()["rollouts"]):
        archive.put_state(KEY, now)


__all__ = ["KEY", "record", "task_hash", "task_hashes"]
