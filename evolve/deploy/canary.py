"""The canary: a share of new sessions is served by the candidate (sticky per session, by a hash of
the session id), the users' feedback on both arms feeds a sequential test, and the test promotes
the candidate, keeps waiting, or stops the canary (the active system keeps serving).

The test is valid however often it is checked (after every session): each arm's mean score gets
an anytime-valid confidence sequence, Robbins' normal mixture for a variable bounded in [0, 1]
(sub-Gaussian with variance proxy 1/4; Howard, Ramdas, McAuliffe and Sekhon 2021), at level
alpha/2 per arm, so that the difference of the means lies in [lower, upper] at every check with
probability at least 1 - alpha. Then:

* ``upper < 0``: the candidate is worse on live traffic: stop, roll back;
* ``lower >= -margin`` with at least ``min_sessions`` scored candidate sessions: promote (or wait
  for approval);
* otherwise wait, up to ``max_sessions`` candidate sessions or ``max_hours``: then stop, undecided
  (the candidate is not promoted).

Scores outside [0, 1] are clipped. Only sessions that started after the canary did, on the route
whose new sessions were split, answered first by one of the two arms, with feedback, count, each
with its first score (a value once counted never changes).

The decision follows the evidence without waiting for more of it: a test skipped by the gateway's
throttle is made up as soon as the throttle allows, and a new session bound for the candidate is
held until the feedback already recorded has been tested. A canary past ``max_hours`` ends when it
is next consulted (:func:`end_expired`), feedback or not.
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

from evolve.deploy.lifecycle import DeployError, Deployment, Move


def expired(canary: dict[str, Any], now: float | None = None) -> bool:
    """Whether ``canary`` has run for ``max_hours``."""
    now = time.time() if now is None else now
    return (now - float(canary["started"])) / 3600 >= float(canary["max_hours"])


def in_canary(session_id: str, canary: dict[str, Any]) -> bool:
    """Whether a new session goes to the candidate: a hash of the canary's salt and the session id."""
    h = int(hashlib.sha256(f"{canary['salt']}:{session_id}".encode()).hexdigest()[:12], 16) / 16**12
    return h < float(canary["share"])


def radius(n: int, alpha: float, rho_n: int) -> float:
    """Half-width of a two-sided (1 - alpha) confidence sequence for a [0, 1] mean after n
    observations; tightest near ``rho_n`` observations."""
    if n <= 0:
        return math.inf
    v = n / 4.0
    rho = max(rho_n, 1) / 4.0
    return math.sqrt((v + rho) * math.log((v + rho) / (rho * (alpha / 2) ** 2))) / n


def decide(
    cand: list[float], active: list[float], cfg: dict[str, Any], *, started: float, now: float | None = None
) -> tuple[str, dict[str, Any]]:
    """(``promote`` | ``stop`` | ``expire`` | ``wait``, the evidence)."""
    now = time.time() if now is None else now
    c = [min(1.0, max(0.0, float(x))) for x in cand]
    a = [min(1.0, max(0.0, float(x))) for x in active]
    alpha, margin = float(cfg["alpha"]), float(cfg["margin"])
    rho_n = int(cfg["min_sessions"])
    mc = sum(c) / len(c) if c else None
    ma = sum(a) / len(a) if a else None
    rc, ra = radius(len(c), alpha / 2, rho_n), radius(len(a), alpha / 2, rho_n)
    diff: float | None = None
    lower, upper = -math.inf, math.inf
    if mc is not None and ma is not None:
        lower, upper, diff = (mc - rc) - (ma + ra), (mc + rc) - (ma - ra), mc - ma
    hours = (now - started) / 3600
    ev = {
        "candidate_sessions": len(c),
        "active_sessions": len(a),
        "candidate_mean": mc,
        "active_mean": ma,
        "diff": diff,
        "lower": lower if math.isfinite(lower) else None,
        "upper": upper if math.isfinite(upper) else None,
        "alpha": alpha,
        "margin": margin,
        "hours": round(hours, 3),
    }
    if c and a and upper < 0:
        return "stop", ev
    if c and a and len(c) >= rho_n and lower >= -margin:
        return "promote", ev
    if len(c) >= int(cfg["max_sessions"]) or hours >= float(cfg["max_hours"]):
        return "expire", ev
    return "wait", ev


def arm_scores(store: Any, canary: dict[str, Any], route: str | None = None) -> tuple[list[float], list[float]]:
    """The scored sessions of each arm since the canary started (on ``route``, the one whose new
    sessions were split): (candidate's, active's)."""
    cand: list[float] = []
    act: list[float] = []
    for _, system, score in store.session_scores(since=canary["started"], route=route):
        if score is None or system not in (canary["system"], canary["active"]):
            continue
        (cand if system == canary["system"] else act).append(score)
    return cand, act


def check(
    archive: Any, store: Any, *, now: float | None = None, by: str = "canary", route: str | None = None
) -> dict[str, Any] | None:
    """Run the canary's test on the trace store's feedback and act on its decision (in one archive
    transaction). None when no canary is under way; else ``{"decision", "evidence", "system"}``."""
    dep = Deployment(archive)
    can = dep.canary()
    if can is None or dep.state(can["system"]) != "canary":
        return None
    cand, act = arm_scores(store, can, route)
    decision, ev = decide(cand, act, can, started=can["started"], now=now)
    sid = can["system"]
    try:
        _act(dep, decision, ev, sid, can, by)
    except DeployError:  # another checker decided first: its decision stands
        return None
    return {"decision": decision, "evidence": ev, "system": sid}


def end_expired(
    archive: Any, store: Any = None, *, now: float | None = None, by: str = "canary", route: str | None = None
) -> dict[str, Any] | None:
    """End a canary that has run for ``max_hours``, feedback or not: the test decides on the feedback
    in ``store`` (a trace store, when given; else none is read) and, undecided, the candidate is
    rolled back and the active system keeps serving. None when no canary is under way or it has time
    left; else as :func:`check`."""
    dep = Deployment(archive)
    can = dep.canary()
    if can is None or dep.state(can["system"]) != "canary" or not expired(can, now):
        return None
    if store is not None:
        return check(archive, store, now=now, by=by, route=route)
    _, ev = decide([], [], can, started=can["started"], now=now)
    ev.update(candidate_sessions=None, active_sessions=None)  # the feedback was not read
    try:
        _act(dep, "expire", ev, can["system"], can, by)
    except DeployError:  # another checker decided first: its decision stands
        return None
    return {"decision": "expire", "evidence": ev, "system": can["system"]}


def _act(dep: Deployment, decision: str, ev: dict[str, Any], sid: str, can: dict[str, Any], by: str) -> None:
    # the decision holds only for the canary it was taken on: checked again inside the transaction
    guard: dict[str, Any] = {
        "expect": {sid: "canary"},
        "expect_canary": can.get("salt"),
        "expect_active": can.get("active"),
    }
    if decision == "promote":
        to = "pending" if can.get("approval") else "active"
        why = (
            f"canary: {ev['candidate_sessions']} candidate sessions score {100 * ev['candidate_mean']:.1f}% against "
            f"{100 * ev['active_mean']:.1f}% ({ev['active_sessions']} sessions); surely no worse than "
            f"-{100 * ev['margin']:.1f} points (lower bound {100 * ev['lower']:+.1f})"
            + ("; waiting for approval" if to == "pending" else "")
        )
        dep.apply([Move(sid, to, by, why, ev)], canary=None, **guard)
    elif decision in ("stop", "expire"):
        why = (
            f"canary: the candidate is worse on live traffic ({100 * ev['candidate_mean']:.1f}% against "
            f"{100 * ev['active_mean']:.1f}%, upper bound {100 * ev['upper']:+.1f} points); rolled back"
            if decision == "stop"
            else _undecided(ev, can)
        )
        dep.apply([Move(sid, "rolled_back", by, why, ev)], canary=None, **guard)


def _undecided(ev: dict[str, Any], can: dict[str, Any]) -> str:
    n = ev.get("candidate_sessions")
    return (
        f"canary: undecided after {ev['hours']:.1f} h"
        + (f" and {n} scored candidate sessions" if n is not None else "")
        + f" (max_hours {float(can['max_hours']):g}, max_sessions {can['max_sessions']}); not promoted, the "
        "active system keeps serving"
    )


__all__ = ["arm_scores", "check", "decide", "end_expired", "expired", "in_canary", "radius"]


class CanaryView:
    """What a gateway route that follows a run needs of its deployment: the canary under way and
    the systems that must not serve (re-read at most every ``poll`` seconds), where a session goes
    (:meth:`split`), and the canary's test run on the route's feedback (:meth:`check`).

    The test runs at most every ``every`` seconds. Feedback that comes sooner is tested by a
    background thread once ``every`` has passed since the last test, with no more feedback needed;
    and before a new session goes to the candidate, feedback no test has read yet is tested first,
    so no new session goes to a candidate that the recorded evidence already stops."""

    def __init__(self, run: Any, *, poll: float = 1.0, every: float = 0.2, route: str | None = None) -> None:
        import threading

        self.run, self.poll, self.every, self.route = run, poll, every, route
        self._archive: Any = None
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._seen: tuple[float, dict[str, Any] | None, frozenset[str]] = (-math.inf, None, frozenset())
        self._checked = -math.inf
        self._dirty = False  # feedback came that no test has read yet
        self._store: Any = None  # the trace store that feedback went to: what the made-up test reads
        self._worker: Any = None
        self._closed = False
        self.log: Any = None

    def _arch(self) -> Any:
        if self._archive is None:
            from evolve.archive import Archive

            self._archive = Archive(self.run, create=False)
        return self._archive

    def view(self) -> tuple[dict[str, Any] | None, frozenset[str]]:
        with self._lock:
            t, can, blocked = self._seen
            if time.monotonic() - t >= self.poll:
                try:
                    a = self._arch()
                    can = a.get_state("deploy.canary")
                    blocked = frozenset(a.get_state("deploy.blocked", []) or [])
                except Exception:  # noqa: BLE001 - keep what we had; the next look tries again
                    pass
                self._seen = (time.monotonic(), can, blocked)
            return can, blocked

    def refresh(self) -> None:
        with self._lock:
            self._seen = (-math.inf, *self._seen[1:])

    def split(self, session: str | None, store: Any = None) -> tuple[str | None, frozenset[str]]:
        """Where a call goes: (the candidate's id when ``session``, a new session, goes to the
        candidate, else None; the systems that must not serve). A canary past ``max_hours`` ends
        here, feedback or not; a new session bound for the candidate waits for the test of the
        feedback in ``store`` that no test has read yet."""
        can, blocked = self.view()
        if can is None:
            return None, blocked
        bound = session is not None and can["system"] not in blocked and in_canary(session, can)
        if expired(can) or (bound and self._dirty and store is not None):
            try:
                with self._lock:
                    self._test(store)
            except Exception as e:  # noqa: BLE001 - untested evidence: the active system serves meanwhile
                bound = False
                if self.log:
                    self.log(f"canary check on route {self.route} failed: {type(e).__name__}: {e}")
            self.refresh()
            can, blocked = self.view()
            bound = bound and can is not None and can["system"] not in blocked and not expired(can)
        return (can["system"] if bound and can is not None else None), blocked

    def check(self, store: Any) -> dict[str, Any] | None:
        """The canary's test on the trace store, acted on; the decision, or None (no canary, or
        tested later: at most every ``every`` seconds)."""
        with self._lock:
            self._store = store
            if time.monotonic() - self._checked < self.every:
                self._dirty = True
                self._later()
                return None
            return self._test(store)

    def _test(self, store: Any) -> dict[str, Any] | None:
        # with the lock held
        self._checked = time.monotonic()
        got = check(self._arch(), store, route=self.route) if store is not None else end_expired(self._arch())
        self._dirty = False
        if got is not None and got["decision"] != "wait":
            self._seen = (-math.inf, *self._seen[1:])  # the next session sees the decision
            if self.log:
                self.log(f"canary of {got['system'][:12]}: {got['decision']}")
        return got

    def _later(self) -> None:
        # with the lock held: the skipped test is made up once ``every`` has passed
        import threading

        if self._closed:
            return
        if self._worker is None:
            self._worker = threading.Thread(target=self._catch_up, name=f"evolve-canary:{self.route}", daemon=True)
            self._worker.start()
        self._wake.notify()

    def _catch_up(self) -> None:
        with self._lock:
            while not self._closed:
                wait = self._checked + self.every - time.monotonic()
                if not self._dirty or wait > 0:
                    self._wake.wait(None if not self._dirty else wait)
                    continue
                try:
                    self._test(self._store)
                except Exception as e:  # noqa: BLE001 - the next feedback tries again
                    self._dirty = False
                    if self.log:
                        self.log(f"canary check on route {self.route} failed: {type(e).__name__}: {e}")
            if self._store is not None:
                self._store.close()  # this thread's own connection

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            worker = self._worker
        if worker is not None:
            worker.join(timeout=30)
        with self._lock:
            if self._archive is not None:
                self._archive.close()
                self._archive = None


__all__ += ["CanaryView"]
