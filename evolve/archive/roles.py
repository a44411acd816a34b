"""Lineage and rollback per model role: a team's adapters as parts of one system.

A system with several model roles (``System.models``: role -> ModelSpec) holds one adapter per
role; a child that retrains one role refers to the same artifacts for the others. These read that
history from the archive and undo one role without touching the rest:

* :func:`role_history`: the systems along the first-parent lineage where ``role``'s model changed,
  oldest first, each with the operator that changed it and the adapter it got;
* :func:`rollback_role`: a new system that is ``system`` with ``role``'s model as it was in an
  earlier one (the other roles as they are now), stored with both as parents and made current.
  Nothing is deleted; rolling back every role to one system is :meth:`Archive.rollback`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from evolve.errors import ArchiveError
from evolve.types import System

if TYPE_CHECKING:  # pragma: no cover
    from evolve.archive.store import Archive


def _model(system: System, role: str) -> dict[str, Any] | None:
    spec = system.models.get(role)
    return None if spec is None else spec.model_dump(mode="json")


def role_history(archive: Archive, system_id: str, role: str) -> list[dict[str, Any]]:
    """``[{"system", "operator", "generation", "adapter"}]``: where ``role``'s model changed along
    ``system_id``'s first-parent lineage (the root first), ``adapter`` being its sha256 or None."""
    have = sorted(archive.get_system(system_id).models)
    if role not in have:
        raise ArchiveError(f"system {system_id[:12]} has no role {role!r}; its roles are {', '.join(have)}")
    chain = list(reversed(archive.lineage(system_id)))
    out: list[dict[str, Any]] = []
    before: Any = ...
    for sid in chain:
        system = archive.get_system(sid)
        now = _model(system, role)
        if now != before:
            rec = archive.record(sid)
            spec = system.models.get(role)
            out.append(
                {
                    "system": sid,
                    "operator": rec.operator,
                    "generation": rec.generation,
                    "adapter": spec.adapter.sha256 if spec is not None and spec.adapter is not None else None,
                }
            )
        before = now
    return out


def rollback_role(archive: Archive, system_id: str, role: str, to: str, *, make_current: bool = True) -> System:
    """``system_id`` with ``role``'s model (its adapter) as it was in ``to``, the other roles as they
    are: stored with parents ``(system_id, to)`` and, with ``make_current``, made the current system.
    Returns the new system (the same as ``system_id`` when ``role`` is already as in ``to``)."""
    sid, old_id = archive.resolve(system_id), archive.resolve(to)
    system, old = archive.get_system(sid), archive.get_system(old_id)
    for name, s in (("system", system), ("the system rolled back to", old)):
        if role not in s.models:
            raise ArchiveError(f"{name} {s.id[:12]} has no role {role!r}; its roles are {', '.join(sorted(s.models))}")
    child = system.replace(models={**system.models, role: old.models[role]})
    if child.id != sid:
        archive.add_system(
            child,
            parents=(sid, old_id),
            operator="rollback_role",
            rationale=f"{role}'s model as in {old_id[:12]}, the other roles as in {sid[:12]}",
            generation=archive.record(sid).generation,
            info={"role": role, "from": old_id},
        )
    if make_current:
        archive.set_current(child.id, f"rollback {role}")
    return child


__all__ = ["role_history", "rollback_role"]
