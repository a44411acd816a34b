"""Which tasks two runs share: the same id *and* the same content.

Task ids repeat across runs that hold other tasks: a dataset generated from the seed may number
its tasks alike for every seed (the toy world's ``test-7`` adds other numbers in seed 0 and seed
1), and a comparison paired on ids alone reads noise as a result. A run records the content hash of each of
its tasks when it starts (:func:`evolve.task.content.record`); two runs' scores pair
on a task only when both recorded it with the same hash. A run an older evolvekit made recorded
none: its tasks pair with another run's only when both were made with the same dataset settings,
seed and task folder (so the same tasks were loaded), else nothing pairs and the answer says why.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from evolve.task.content import KEY


def _loaded_with(archive: Any) -> tuple[Any, ...] | None:
    """What decides which tasks a run loaded: its dataset settings, seed and task folder."""
    try:
        task = json.loads(archive.get_state("task") or "null")
    except ValueError:
        return None
    if not isinstance(task, dict):
        return None
    return json.dumps(task.get("dataset"), sort_keys=True), task.get("seed"), archive.get_state("base_dir")


def same_tasks(a: Any, b: Any, split: str, ids: Iterable[str]) -> tuple[list[str], str | None]:
    """Of ``ids`` (tasks both archives scored on ``split``), those that are the same task in both,
    and why the others are left out (``None`` when none is)."""
    ids = sorted(ids)
    if a is b or a.path.resolve() == b.path.resolve():
        return ids, None
    ha, hb = a.get_state(KEY), b.get_state(KEY)
    if isinstance(ha, dict) and isinstance(hb, dict):
        sa, sb = ha.get(split) or {}, hb.get(split) or {}
        same = [t for t in ids if t in sa and sa[t] == sb.get(t)]
        left = len(ids) - len(same)
        return same, (
            f"{left} task{'s' if left != 1 else ''} with the same id hold other content in the two runs "
            "(another seed or dataset): not paired"
        ) if left else None
    if _loaded_with(a) is not None and _loaded_with(a) == _loaded_with(b):
        return ids, None
    older = a.run_dir if not isinstance(ha, dict) else b.run_dir
    return [], (
        f"{older} was made by an older evolvekit that did not record its tasks' content, and the two runs "
        "were not made with the same dataset settings, seed and task folder: no task can be paired"
    )


__all__ = ["same_tasks"]
