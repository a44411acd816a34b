"""A candidate's life in the archive: proposed → gated → canary → (pending) → active → retired, or
rejected / rolled back, each move an append-only ``deploy`` event (when, who or which rule, why,
the evidence), and the archive's current pointer (what is served) moved in the same transaction.

Several moves that make one decision (the gates passed and the system made active; a canary
stopped and the active system kept) are written together by :meth:`Deployment.apply`, so a kill -9
leaves the deployment exactly before or after the decision, never between.

The canary under way, if any, is the run state ``deploy.canary`` (what the gateway reads to split
new sessions); systems that must not serve any more (rolled back, rejected) are ``deploy.blocked``.
"""

from __future__ import annotations

import getpass
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve.errors import UserError

STATES = ("proposed", "gated", "canary", "pending", "active", "retired", "rolled_back", "rejected")
ALLOWED: dict[str | None, set[str]] = {
    None: {"proposed", "active"},
    "proposed": {"proposed", "gated", "rejected"},
    "gated": {"canary", "pending", "active", "rejected"},
    "canary": {"pending", "active", "rolled_back"},
    "pending": {"active", "rejected", "proposed"},  # proposed: gated anew, the active system having changed
    "active": {"retired", "rolled_back"},
    "retired": {"active"},
    "rolled_back": {"proposed", "active"},
    "rejected": {"proposed"},
}
EVENT = "deploy"
CANARY_KEY = "deploy.canary"
BLOCKED_KEY = "deploy.blocked"


class DeployError(UserError):
    """A move the lifecycle does not allow, or a deployment that cannot go on as asked."""


def who() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name on this machine
        return "unknown"


@dataclass
class Move:
    system: str
    to: str
    by: str
    why: str
    evidence: dict[str, Any] = field(default_factory=dict)


class Deployment:
    """The lifecycle of the systems of one run, over its :class:`~evolve.archive.Archive`."""

    def __init__(self, archive: Any) -> None:
        self.archive = archive

    # ------------------------------------------------------------------ reading

    def events(self, system: str | None = None) -> list[dict[str, Any]]:
        evs = self.archive.events(EVENT)
        return [e for e in evs if system is None or e["system"] == system]

    def states(self) -> dict[str, str]:
        """Every system that has a state, to its state (the current pointer's system is active even
        before the first deploy event: the run's baseline or its last promotion)."""
        out: dict[str, str] = {}
        for e in self.archive.events(EVENT):
            out[e["system"]] = e["to"]
        cur = self.archive.current()
        if cur is not None and cur not in out:
            out[cur] = "active"
        return out

    def state(self, system: str) -> str | None:
        return self.states().get(system)

    def active(self) -> str | None:
        return self.archive.current()

    def canary(self) -> dict[str, Any] | None:
        return self.archive.get_state(CANARY_KEY)

    def blocked(self) -> list[str]:
        return list(self.archive.get_state(BLOCKED_KEY, []) or [])

    def previous_active(self) -> str | None:
        """The system that was active before the current one (what ``evolve rollback`` returns to)."""
        cur = self.archive.current()
        seen: list[str] = []
        for sid, _, _ in self.archive.pointer_history():
            if not seen or seen[-1] != sid:
                seen.append(sid)
        earlier = [s for s in seen if s != cur]
        blocked = set(self.blocked())
        for sid in reversed(earlier):
            if sid not in blocked:
                return sid
        return None

    # ------------------------------------------------------------------ writing

    def apply(
        self,
        moves: list[Move],
        *,
        canary: Any = ...,
        reason: str | None = None,
        expect: dict[str, str | None] | None = None,
        expect_canary: Any = ...,
        expect_active: Any = ...,
    ) -> list[int]:
        """Make ``moves`` in one transaction. A move to ``active`` retires the active system (unless
        a move in the same list says otherwise) and points ``current`` at it. ``canary`` (a dict, or
        None to end it) sets the canary under way in the same transaction. ``expect`` (system ->
        state), ``expect_canary`` (the salt of the canary that must be under way, or None: none) and
        ``expect_active`` are checked inside the transaction: a decision taken on what was read
        before is refused (:class:`DeployError`) when another one came first. Returns the event seqs."""
        seqs: list[int] = []
        with self.archive.transaction():
            states = self.states()
            for sid, want in (expect or {}).items():
                if states.get(sid) != want:
                    raise DeployError(
                        f"system {sid[:12]} is {states.get(sid) or 'not in the lifecycle'} now, not "
                        f"{want}: another decision came first"
                    )
            if expect_canary is not ...:
                can = self.canary()
                if (can or {}).get("salt") != expect_canary:
                    raise DeployError(
                        "a canary started or ended meanwhile: "
                        + (f"{can['system'][:12]} is under way" if can else "none is under way")
                    )
            if expect_active is not ... and self.archive.current() != expect_active:
                raise DeployError(
                    f"the active system changed meanwhile ({str(expect_active)[:12]} -> "
                    f"{str(self.archive.current())[:12]}); run the command again"
                )
            blocked = set(self.blocked())
            for m in moves:
                if m.to not in STATES:
                    raise DeployError(f"no lifecycle state {m.to!r}; the states are {list(STATES)}")
                was = states.get(m.system)
                if m.to not in ALLOWED[was]:
                    raise DeployError(
                        f"system {m.system[:12]} is {was or 'not in the lifecycle'}; it cannot become "
                        f"{m.to} (from {was} it can become {sorted(ALLOWED[was])})"
                    )
                if m.to == "active":
                    old = self.archive.current()
                    if (
                        old is not None
                        and old != m.system
                        and states.get(old) == "active"
                        and not any(x.system == old for x in moves)
                    ):
                        seqs.append(self._log(Move(old, "retired", m.by, f"replaced by {m.system[:12]}"), "active"))
                        states[old] = "retired"
                    self.archive.set_current(
                        m.system, reason or ("rollback" if was in ("retired", "rolled_back") else "promote")
                    )
                    blocked.discard(m.system)
                if m.to in ("rolled_back", "rejected"):
                    blocked.add(m.system)
                seqs.append(self._log(m, was))
                states[m.system] = m.to
            self.archive.put_state(BLOCKED_KEY, sorted(blocked))
            if canary is not ...:
                self.archive.put_state(CANARY_KEY, canary)
        return seqs

    def _log(self, m: Move, was: str | None) -> int:
        return self.archive.log_event(
            EVENT, {"system": m.system, "from": was, "to": m.to, "by": m.by, "why": m.why, "evidence": m.evidence}
        )

    def propose(self, system: str, *, by: str, why: str, evidence: dict[str, Any] | None = None) -> bool:
        """Propose ``system`` for promotion (the engine's best, or a person's pick); False when it is
        already in the lifecycle beyond proposal (nothing written)."""
        was = self.state(system)
        if was not in (None, "rolled_back", "rejected"):
            return False
        self.apply([Move(system, "proposed", by, why, evidence or {})])
        return True

    def start_canary(self, system: str, cfg: dict[str, Any], moves: list[Move], **guard: Any) -> dict[str, Any]:
        canary = {
            "system": system,
            "active": self.active(),
            "started": time.time(),
            "salt": secrets.token_hex(8),
            **cfg,
        }
        self.apply(moves, canary=canary, **guard)
        return canary

    def rollback(self, to: str | None = None, *, by: str, why: str = "rolled back by hand") -> tuple[str, str | None]:
        """Make ``to`` (default: the previous active system) serve new sessions now; the system it
        replaces, and a canary under way, are rolled back. With a canary under way and no ``to``,
        only the canary ends (the active system stays). Returns (now active, rolled back)."""
        cur = self.active()
        can = self.canary()
        if to is None and can is not None and self.state(can["system"]) == "canary" and cur is not None:
            self.apply(
                [Move(can["system"], "rolled_back", by, f"canary ended by a rollback: {why}")],
                canary=None,
                expect={can["system"]: "canary"},
                expect_canary=can.get("salt"),
            )
            return cur, can["system"]
        target = to or self.previous_active()
        if target is None:
            raise DeployError(
                "nothing to roll back to: no earlier system was active in this run; name one with "
                "evolve rollback RUN SYSTEM"
            )
        moves = []
        if can is not None and self.state(can["system"]) == "canary":
            moves.append(Move(can["system"], "rolled_back", by, f"canary ended by a rollback: {why}"))
        if cur is not None and cur != target and self.state(cur) == "active":
            moves.append(Move(cur, "rolled_back", by, why))
        if target != cur:
            moves.append(Move(target, "active", by, why))
        if not moves:
            raise DeployError(f"system {target[:12]} is already active and no canary is under way")
        self.apply(moves, canary=None if can is not None else ..., reason="rollback", expect_active=cur)
        return target, cur if cur != target else None

    def check(self) -> list[str]:
        """What is inconsistent between the audit trail and the pointer (empty: nothing)."""
        problems = []
        states = self.states()
        active = [s for s, st in states.items() if st == "active"]
        cur = self.archive.current()
        if cur is not None and active != [cur]:
            problems.append(f"the current system is {cur[:12]} but the trail says active: {[a[:12] for a in active]}")
        can = self.canary()
        if can is not None and states.get(can["system"]) != "canary":
            problems.append(
                f"a canary of {can['system'][:12]} is recorded but that system is {states.get(can['system'])}"
            )
        return problems


def open_run(run_dir: str | Path) -> Any:
    """The archive of the run folder ``run_dir``; a folder without one is a :class:`~evolve.errors.RunDirError`."""
    from evolve.archive import Archive
    from evolve.errors import RunDirError

    if not (Path(run_dir) / "archive.sqlite").exists():
        raise RunDirError(f"{run_dir} is not an evolvekit run directory (no archive.sqlite)")
    return Archive(run_dir, create=False)


__all__ = ["ALLOWED", "STATES", "DeployError", "Deployment", "Move", "open_run", "who"]
