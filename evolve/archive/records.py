"""The records the archive hands back: how a system entered it, a stored trajectory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from evolve.types import Trajectory


@dataclass(frozen=True)
class SystemRecord:
    """How a system entered the archive: its parents, the operator that made it and why."""

    id: str
    parents: tuple[str, ...]
    operator: str
    rationale: str
    generation: int
    created_at: float
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "parents": list(self.parents),
            "operator": self.operator,
            "rationale": self.rationale,
            "generation": self.generation,
            "created_at": self.created_at,
            "info": self.info,
        }


@dataclass(frozen=True)
class TrajectoryRow:
    """A stored trajectory with the bookkeeping it was filed under."""

    key: str
    split: str
    phase: str
    generation: int
    trajectory: Trajectory
