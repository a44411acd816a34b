"""Which session a call through the gateway belongs to.

In this order: the ``/s/<session>/`` path prefix, the ``X-Evolve-Session`` header, the OpenAI
body's ``metadata.session_id`` or ``user``, the Anthropic body's ``metadata.user_id`` (a value that
is not a session id is hashed into one); without any, a call whose conversation continues an earlier
call's (its messages up to the last assistant message are that call's messages and answer) joins
that call's session, and any other call starts a session of its own, named by its call id. A gateway
without a trace store puts such a call in session ``default``.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Any

from evolve.gateway.traces import TraceStore
from evolve.gateway.wire import GatewayError, Request

SESSION_HEADER = "x-evolve-session"
_SESSION = re.compile(r"^[A-Za-z0-9_.:@~-]{1,200}$")


def new_call_id(api: str) -> str:
    """A call's id, as the agent's API spells a response's id (``chatcmpl-...``, ``msg_...``)."""
    return ("chatcmpl-" if api == "openai" else "msg_") + secrets.token_hex(12)


async def session_of(request: Any, req: Request, store: TraceStore | None, call_id: str) -> str:
    """The session of ``req`` (its messages as the agent sent them), arriving as HTTP ``request``
    with the id ``call_id``; a 400 for a session named in the path or header that is no session id."""
    for value, where in (
        (request.path_params.get("session"), "the /s/<session>/ path"),
        (request.headers.get(SESSION_HEADER), f"the {SESSION_HEADER} header"),
    ):
        if value:
            if not _SESSION.match(str(value)):
                raise GatewayError(
                    400,
                    f"the session id from {where} must be 1-200 characters of letters, "
                    f"digits and _.:@~-; got {str(value)[:80]!r}",
                )
            return str(value)
    if req.session_hint:  # the body's user / metadata field: any string the API takes is fine
        hint = str(req.session_hint)
        if _SESSION.match(hint):
            return hint
        return "u-" + hashlib.sha256(hint.encode("utf-8", "replace")).hexdigest()[:32]
    if store is None:
        return "default"
    import anyio

    # no session named: a conversation that continues an earlier call's joins its session
    found = await anyio.to_thread.run_sync(store.continued_session, req.messages)
    return found or call_id


__all__ = ["SESSION_HEADER", "new_call_id", "session_of"]
