"""The run state the loop's parts share, typed: which system is the baseline, which systems were
accepted (with their val scores), which were re-evaluated on more samples, one row per finished
generation, the operators' memoised proposals, the wall time spent, the model calls operators
made themselves and the engine's status of the run. It lives in the archive's ``state`` table (so a
resumed run reads it back), under the keys earlier evolvekits wrote, and this is the one module
that reads or writes those keys. With ``engine.curriculum``, each generation's curriculum decision too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from evolve.types import Candidate

if TYPE_CHECKING:
    from evolve.archive import Archive


class Accepted(BaseModel):
    """A system the loop accepted: its val score when accepted, and the generation."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    system_id: str
    score: float
    generation: int


class GenerationRow(BaseModel):
    """One finished generation: the best val score and system after it, and what it spent."""

    model_config = ConfigDict(frozen=True, extra="allow")
    index: int
    best_val: float
    best: str
    children: int = 0
    accepted: int = 0
    rollouts: int = 0
    calls: int | None = None
    tokens: int = 0
    seconds: float = 0.0

    def __getitem__(self, key: str) -> Any:  # report.json and older callers read rows as mappings
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


class RunState:
    """Typed reads and writes of one run's shared state (see the module docstring)."""

    def __init__(self, archive: Archive) -> None:
        self.archive = archive

    # the starting system
    @property
    def baseline(self) -> str | None:
        return self.archive.get_state("baseline")

    @baseline.setter
    def baseline(self, system_id: str) -> None:
        self.archive.put_state("baseline", system_id)

    # accepted systems
    def accepted(self) -> list[Accepted]:
        return [Accepted.model_validate(a) for a in self.archive.get_state("accepted", [])]

    def accept(self, system_id: str, score: float, generation: int) -> None:
        """Add ``system_id`` to the accepted systems (once)."""
        acc = self.archive.get_state("accepted", [])
        if system_id not in [a["system_id"] for a in acc]:
            acc.append({"system_id": system_id, "score": score, "generation": generation})
            self.archive.put_state("accepted", acc)

    # re-evaluation on more samples (engine.reeval)
    def reevaluated(self) -> dict[str, tuple[float, int]]:
        """``system_id -> (val mean over all samples, the generation that first refined it)``."""
        return {k: (float(v[0]), int(v[1])) for k, v in self.archive.get_state("reevaluated", {}).items()}

    def refine(self, system_id: str, mean: float, generation: int) -> None:
        refined = self.archive.get_state("reevaluated", {})
        if system_id not in refined:  # the first generation that refined it counts (see evolve.loop.pool)
            refined[system_id] = [mean, generation]
            self.archive.put_state("reevaluated", refined)

    # generations
    def generations(self) -> list[GenerationRow]:
        return [GenerationRow.model_validate(r) for r in self.archive.get_state("generations", [])]

    def add_generation(self, row: GenerationRow) -> None:
        rows = self.archive.get_state("generations", [])
        rows.append(row.model_dump(mode="json", exclude_unset=True))
        self.archive.put_state("generations", rows)

    # operators' proposals, memoised per (generation, operator index, parent)
    def proposals(self, generation: int, op_index: int, parent_id: str) -> list[Candidate] | None:
        saved = self.archive.get_state(f"proposals/{generation}/{op_index}/{parent_id}")
        return None if saved is None else [Candidate.model_validate(c) for c in saved]

    def save_proposals(self, generation: int, op_index: int, parent_id: str, cands: list[Candidate]) -> None:
        self.archive.put_state(
            f"proposals/{generation}/{op_index}/{parent_id}", [c.model_dump(mode="json") for c in cands]
        )

    # the curriculum's decision per generation (engine.curriculum: evolve.loop.curriculum)
    def curriculum(self, generation: int) -> dict[str, Any] | None:
        return self.archive.get_state(f"curriculum/{generation}")

    def save_curriculum(self, generation: int, decision: dict[str, Any]) -> None:
        self.archive.put_state(f"curriculum/{generation}", decision)

    def curricula(self) -> list[dict[str, Any]]:
        """Every generation's decision, in generation order."""
        return sorted(self.archive.state_items("curriculum/").values(), key=lambda d: int(d["generation"]))

    # the engine's own account of the run
    @property
    def status(self) -> str | None:
        """``running`` while the engine works, then ``finished``, ``failed`` (too many failed rollouts)
        or ``stopped`` (interrupted, the world failing: ``--resume`` continues); None for a run an older
        evolvekit made. Only the engine sets it: a promotion, a rollback or an evaluation changes nothing."""
        return self.archive.get_state("status")

    @status.setter
    def status(self, value: str) -> None:
        self.archive.put_state("status", value)

    # spending that is not in the trajectories
    @property
    def elapsed(self) -> float:
        return float(self.archive.get_state("elapsed", 0.0))

    @elapsed.setter
    def elapsed(self, seconds: float) -> None:
        self.archive.put_state("elapsed", seconds)

    def operator_llm(self) -> dict[str, Any]:
        """The model calls operators made themselves: ``{calls, tokens, cost}``."""
        return dict(self.archive.get_state("operator_llm") or {"calls": 0, "tokens": 0, "cost": 0.0})

    def charge_operator_llm(self, calls: int, tokens: int, cost: float) -> None:
        op = self.operator_llm()
        op["calls"] += calls
        op["tokens"] += tokens
        op["cost"] += cost
        self.archive.put_state("operator_llm", op)


__all__ = ["Accepted", "GenerationRow", "RunState"]
