"""The gate split: the val tasks a deploy policy's gate scores on, held out of the run's own
selection (train and val) before anything is scored, chosen by the seed and kept in the run state
(``deploy.gate``). Here, below the session, because the session carves it when it opens a run;
:mod:`evolve.deploy.gates` gates on it."""

from __future__ import annotations

import hashlib
from typing import Any

from evolve.errors import ConfigError
from evolve.types import canonical_json

GATE_KEY = "deploy.gate"


def _content(task: dict) -> str:
    return canonical_json({k: v for k, v in task.items() if k != "id"})


def carve(splits: dict[str, list[dict]], ids: list[str]) -> dict[str, list[dict]]:
    """``splits`` with the gate split (the val tasks of ``ids``, or the source's own ``gate`` split)
    held out: out of val, and a train or val task equal to a gate task (its id, or all else) out too."""
    out = dict(splits)
    if "gate" not in out:
        keep = set(ids)
        out["gate"] = [t for t in out.get("val", []) if str(t.get("id")) in keep]
    held = {str(t.get("id")) for t in out["gate"]}
    same = {_content(t) for t in out["gate"]}
    for name in ("train", "val"):
        out[name] = [t for t in out.get(name, []) if str(t.get("id")) not in held and _content(t) not in same]
    return out


def choose_gate(splits: dict[str, list[dict]], share: float, seed: int) -> list[str]:
    """The ids of the val tasks a run seeded ``seed`` holds out as its gate split."""
    if "gate" in splits:
        return sorted(str(t.get("id")) for t in splits["gate"])
    val = splits.get("val", [])
    n = round(share * len(val))
    if n < 1 or n >= len(val):
        raise ConfigError(
            f"deploy.gate_share={share:g} of the {len(val)} val tasks leaves "
            f"{'no gate task' if n < 1 else 'no val task'}; give more val tasks, another share, or a "
            "suite a task file of its own (tasks: FILE.jsonl)",
            path="deploy.gate_share",
        )
    rank = sorted(val, key=lambda t: hashlib.sha256(f"{seed}/gate/{t.get('id')}".encode()).hexdigest())
    return sorted(str(t.get("id")) for t in rank[:n])


def hold_out_gate(session: Any) -> None:
    """Hold the gate split out of a session's splits (see the module docstring). A run that scored
    anything before its policy gated on the gate split has none: its selection saw every task."""
    archive, task = session.archive, session.task
    saved = archive.get_state(GATE_KEY)
    dep = task.deploy
    gates = dep is not None and any(
        s.tasks == "gate" for s in ([dep.regression] if dep.regression else []) + list(dep.guards)
    )
    if (gates or saved is not None) and not archive.usage()["rollouts"]:  # nothing scored yet: chosen now
        now = (
            {
                "ids": choose_gate(session.splits, task.deploy.gate_share, task.seed),
                "seed": task.seed,
                "share": task.deploy.gate_share,
            }
            if gates
            else None
        )
        if now != saved:
            archive.put_state(GATE_KEY, now)
        saved = now
    if saved is not None:
        session.splits = carve(session.splits, saved["ids"])


__all__ = ["GATE_KEY", "carve", "choose_gate", "hold_out_gate"]
