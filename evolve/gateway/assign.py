"""Which system answers a call on a route that follows a run.

A session stays with the system that answered its first call on the route (``sticky``, and the
route can answer with a given system: its prompts are applied at the gateway, or its upstream
:attr:`~evolve.gateway.upstream.Upstream.serves_systems`), so a promotion serves new sessions. The
run's deployment (the route's ``canary``) then has its say: a canary takes its share of new
sessions, and a session whose system was rolled back is moved off it. ``None`` is the route's
current system.
"""

from __future__ import annotations

from evolve.gateway.traces import TraceStore
from evolve.gateway.upstream import Route


async def first_system(route: Route, session: str, store: TraceStore) -> tuple[str | None, bool]:
    """(the system that answered ``session``'s first call if that call was on ``route``, whether the
    session is new on this route)."""
    import anyio

    first = await anyio.to_thread.run_sync(store.session_first, session)
    if first is not None and first[1] == route.name:
        return first[0], False
    return None, True


async def assigned_system(route: Route, session: str, store: TraceStore | None) -> str | None:
    """The system that answers this call of ``session`` on ``route`` (None: the route's current one)."""
    import anyio

    pinned, new = None, True
    if route.sticky and store is not None and (route.source is not None or route.upstream.serves_systems):
        pinned, new = await first_system(route, session, store)
    if route.canary is not None:  # the run's deployment: a canary's share of new sessions, rolled-back systems
        to_candidate, blocked = await anyio.to_thread.run_sync(route.canary.split, session if new else None, store)
        if pinned in blocked:
            pinned = None
        if to_candidate is not None:
            pinned = to_candidate
    return pinned


__all__ = ["assigned_system", "first_system"]
