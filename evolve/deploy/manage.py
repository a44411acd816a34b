"""Driving the lifecycle: ``promote`` (integrity, gates, then canary, approval or activation),
``approve``, ``rollback`` and ``status``, the same for the CLI and the Python API."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evolve.deploy.lifecycle import DeployError, Deployment, Move, open_run, who
from evolve.deploy.pins import PINS_KEY, save_pins


def _proposed(dep: Deployment) -> list[str]:
    states = dep.states()
    return [e["system"] for e in dep.events() if e["to"] == "proposed" and states.get(e["system"]) == "proposed"]


def _candidate(dep: Deployment, archive: Any, system: str | None) -> str:
    if system is not None:
        return archive.resolve(system)
    proposed = _proposed(dep)
    if not proposed:
        raise DeployError(
            "no system is proposed for promotion in this run; name one (evolve promote TASK RUN "
            "--system ID), or let a run with a deploy: section propose its best"
        )
    return proposed[-1]


def pins_for(
    cfg: Any, base: Path, archive: Any, *, repin: bool, by: str, splits: dict[str, list[dict]] | None = None
) -> tuple[dict[str, Any], str]:
    """The deployment's pins: saved the first time (or with ``repin``); a change since is refused.
    ``splits``: the run's splits, when they were loaded already."""
    from evolve.deploy.gates import run_splits
    from evolve.deploy.pins import forged_caches, make_pins, pin_changes

    saved = archive.get_state(PINS_KEY)
    observed = ((saved or {}).get("pins", {}).get("code") or {}).get("observed", [])
    now = make_pins(cfg, base, splits if splits is not None else run_splits(cfg, base, archive), observed)
    if saved is not None and not repin:
        changed = pin_changes(saved["pins"], now)
        if changed:
            raise DeployError(
                "the evaluation changed since it was pinned: "
                + "; ".join(changed[:6])
                + (f"; and {len(changed) - 6} more" if len(changed) > 6 else "")
                + ". Review the change, then re-pin "
                "it with evolve promote TASK RUN --repin"
            )
        pins, pid = saved["pins"], saved["id"]
    else:
        pins, pid = save_pins(archive, now, by, saved)
    forged = forged_caches(pins)
    if forged:
        raise DeployError(
            "a bytecode cache of the evaluation's code would run instead of its source: "
            + "; ".join(forged)
            + ". It is stale or forged: delete it (it is only a cache), then run "
            "evolve promote again"
        )
    return pins, pid


def gated_against(dep: Deployment, system: str) -> dict[str, Any] | None:
    """The evidence of ``system``'s latest gate (``active``: the system it was compared with,
    ``pins``: the pins' id), or None when it was never gated."""
    gated = [e for e in dep.events(system) if e["to"] == "gated"]
    return gated[-1]["evidence"] if gated else None


def stale(dep: Deployment, archive: Any, system: str) -> str | None:
    """Why ``system``'s gate no longer stands (None: it does): the active system or the pins
    changed since it was gated."""
    ev = gated_against(dep, system)
    if ev is None or "active" not in ev:
        return f"{system[:12]} has no record of the active system it was gated against"
    if ev["active"] != dep.active():
        return f"{system[:12]} was gated against {str(ev['active'])[:12]}, and {str(dep.active())[:12]} is active now"
    pid = (archive.get_state(PINS_KEY) or {}).get("id")
    if ev.get("pins") != pid:
        return (
            f"{system[:12]} was gated under the pins {ev.get('pins')}, and the evaluation was re-pinned since ({pid})"
        )
    return None


def promote(
    task_file: str | Path,
    run_dir: str | Path,
    *,
    system: str | None = None,
    by: str | None = None,
    repin: bool = False,
    overrides: Sequence[str] = (),
    observer: Any = None,
) -> dict[str, Any]:
    """Take a proposed system (or ``system``) through the deploy policy of ``task_file``: the
    integrity checks, the gates, then a canary, approval, or activation. Returns ``{"system",
    "state", "message", "gates"}``; a candidate that fails is ``rejected`` with the evidence."""
    from evolve.deploy.gates import all_suite_tasks, run_gates, run_splits, split_files
    from evolve.deploy.integrity import addresses_evaluator, carries_answers, reaches_evaluation
    from evolve.deploy.reads import hold, refuse_unaccepted
    from evolve.errors import UserError
    from evolve.task.taskfile import load_task

    cfg, base = load_task(task_file, overrides)
    if cfg.deploy is None:
        raise UserError(
            f"{task_file} has no deploy: section; add one (docs/deploy.md) to gate promotions, or make a "
            "system current with evolve rollback RUN SYSTEM"
        )
    by = by or who()
    with open_run(run_dir) as archive:
        dep = Deployment(archive)
        if repin and system is None and not _proposed(dep):
            _, pid = pins_for(cfg, base, archive, repin=True, by=by)
            return {"system": None, "state": None, "gates": [], "message": f"re-pinned the evaluation ({pid})"}
        sid = _candidate(dep, archive, system)
        state = dep.state(sid)
        if state == "canary":
            return {
                "system": sid,
                "state": "canary",
                "gates": [],
                "message": "the canary is under way; the gateway decides on feedback (evolve status shows it)",
            }
        regate = stale(dep, archive, sid) if state == "pending" else None
        if state == "pending" and regate is None:
            return {
                "system": sid,
                "state": "pending",
                "gates": [],
                "message": "waiting for approval: evolve promote ... --approve",
            }
        if state not in (None, "proposed", "rolled_back", "rejected", "pending"):
            raise DeployError(
                f"system {sid[:12]} is {state}; only a proposed, rejected or rolled-back system can be promoted"
            )
        if (running := dep.canary()) is not None:
            raise DeployError(
                f"a canary of {running['system'][:12]} is under way; wait for its decision or end "
                "it with evolve rollback RUN (the active system stays)"
            )
        splits = run_splits(cfg, base, archive)
        pins, pid = pins_for(cfg, base, archive, repin=repin, by=by, splits=splits)
        refuse_unaccepted(archive, pins)  # a file a gate read waits for a person (evolve.deploy.reads)
        cand = archive.get_system(sid)
        active_id = dep.active()
        active = archive.get_system(active_id) if active_id else None
        moves = (
            []
            if state == "proposed"
            else [Move(sid, "proposed", by, f"gated anew: {regate}" if regate else "proposed by hand")]
        )
        refused = (
            reaches_evaluation(cand, pins, base, split_files(cfg, base))
            + addresses_evaluator(cand, active)
            + carries_answers(cand, all_suite_tasks(cfg, base, splits), cfg.deploy.answer_fields)
        )
        if refused:
            why = "refused before scoring: " + "; ".join(refused)
            dep.apply(moves + [Move(sid, "rejected", "integrity", why, {"findings": refused, "pins": pid})])
            return {"system": sid, "state": "rejected", "gates": [], "message": why}
    results, reads = run_gates(cfg, base, Path(run_dir), cand, active, pins, pid, observer=observer)
    if reads:  # never pinned on their own: a person looks at each (evolve.deploy.reads)
        with open_run(run_dir) as archive:
            raise hold(archive, reads)
    gates = [r.to_json() for r in results]
    evidence = {"gates": gates, "pins": pid, "active": active_id}
    failed = [r for r in results if not r.passed]
    with open_run(run_dir) as archive:
        dep = Deployment(archive)
        # what the gates were decided on must still hold when the decision is written
        guard: dict[str, Any] = {"expect": {sid: state}, "expect_canary": None, "expect_active": active_id}
        if failed:
            why = "; ".join(r.message for r in failed)
            dep.apply(moves + [Move(sid, "rejected", "gates", why, evidence)], **guard)
            return {"system": sid, "state": "rejected", "gates": gates, "message": why}
        moves.append(Move(sid, "gated", "gates", "; ".join(r.message for r in results) or "no gates", evidence))
        d = cfg.deploy
        if d.canary is not None:
            can = d.canary.model_dump() | {"approval": d.approval}
            moves.append(Move(sid, "canary", by, f"canary: {100 * d.canary.share:g}% of new sessions"))
            dep.start_canary(sid, can, moves, **guard)
            msg = (
                f"gates passed; canary started: {sid[:12]} serves {100 * d.canary.share:g}% of new sessions on the "
                "gateway routes that follow this run"
            )
            return {"system": sid, "state": "canary", "gates": gates, "message": msg}
        if d.approval:
            moves.append(Move(sid, "pending", "policy", "gates passed; approval required"))
            dep.apply(moves, **guard)
            return {
                "system": sid,
                "state": "pending",
                "gates": gates,
                "message": "gates passed; waiting for approval: evolve promote ... --approve",
            }
        moves.append(Move(sid, "active", by, "gates passed"))
        dep.apply(moves, **guard)
        return {"system": sid, "state": "active", "gates": gates, "message": f"gates passed; {sid[:12]} is active"}


def approve(run_dir: str | Path, *, system: str | None = None, by: str | None = None) -> dict[str, Any]:
    """A person's approval of a pending system: it becomes active. An approval stands only against
    the active system (and the pins) the system was gated on; otherwise it is refused, saying so, and
    ``promote`` gates it again."""
    by = by or who()
    with open_run(run_dir) as archive:
        dep = Deployment(archive)
        states = dep.states()
        if system is not None:
            sid = archive.resolve(system)
        else:
            pending = [s for s, st in states.items() if st == "pending"]
            if not pending:
                raise DeployError("no system is waiting for approval in this run (evolve status shows the lifecycle)")
            sid = pending[-1]
        if states.get(sid) != "pending":
            raise DeployError(
                f"system {sid[:12]} is {states.get(sid) or 'not in the lifecycle'}, not pending; "
                "only a system that passed the gates (and canary) can be approved"
            )
        can = dep.canary()
        if can is not None:
            raise DeployError(
                f"a canary of {can['system'][:12]} is under way, compared with the active system; wait "
                "for its decision (or end it with evolve rollback RUN) before approving another"
            )
        why = stale(dep, archive, sid)
        if why is not None:  # its gate said nothing about the system it would replace
            raise DeployError(
                f"the approval of {sid[:12]} does not stand: {why}. Gate it against the active system "
                f"again with evolve promote TASK RUN --system {sid[:12]}, then approve it"
            )
        dep.apply(
            [Move(sid, "active", by, f"approved by {by}")],
            expect={sid: "pending"},
            expect_canary=None,
            expect_active=dep.active(),
        )
    return {"system": sid, "state": "active", "message": f"{sid[:12]} approved by {by}; it is active"}


def rollback(
    run_dir: str | Path, system: str | None = None, *, by: str | None = None, why: str | None = None
) -> dict[str, Any]:
    """Make the previous active system (or ``system``) serve new sessions now; ends a canary."""
    by = by or who()
    with open_run(run_dir) as archive:
        dep = Deployment(archive)
        target = archive.resolve(system) if system is not None else None
        now, old = dep.rollback(target, by=by, why=why or f"rolled back by {by}")
    return {
        "system": now,
        "rolled_back": old,
        "message": f"{now[:12]} is active" + (f"; {old[:12]} rolled back" if old else ""),
    }


def status(run_dir: str | Path, *, traces: str | Path | None = None) -> dict[str, Any]:
    """The active system, the lifecycle of every system in it, the canary under way (with its test
    on ``traces``, if given), the audit trail and any inconsistency."""
    from evolve.deploy.canary import arm_scores, decide, expired

    with open_run(run_dir) as archive:
        dep = Deployment(archive)
        out: dict[str, Any] = {
            "active": dep.active(),
            "states": dep.states(),
            "canary": dep.canary(),
            "blocked": dep.blocked(),
            "trail": dep.events(),
            "problems": dep.check(),
            "pins": (archive.get_state(PINS_KEY) or {}).get("id"),
        }
        from evolve.deploy.reads import unaccepted

        # files a gate read that wait for a person (evolve promote --accept-read), with the sha256 it read
        out["unaccepted"] = unaccepted(archive, (archive.get_state(PINS_KEY) or {}).get("pins"))
    # status only reads: an expired canary is ended by the gateway's next call (it serves no new session)
    out["canary_expired"] = out["canary"] is not None and expired(out["canary"])
    if out["canary"] is not None and traces is not None:
        from evolve.gateway.traces import TraceStore

        st = TraceStore(traces, create=False, read_only=True)  # status only reads: no write, no file left beside it
        try:
            c, a = arm_scores(st, out["canary"])
        finally:
            st.close()
        decision, ev = decide(c, a, out["canary"], started=out["canary"]["started"])
        out["canary_test"] = {"decision": decision, **ev}
    return out


__all__ = ["approve", "promote", "rollback", "status"]
