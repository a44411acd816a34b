"""The gateway's HTTP surface, what every endpoint does before and after its own work: who may call
(the API key; a browser's Origin and, on loopback, the Host), the JSON body read within its size
limit, and answers as JSON, errors in the shape of the agent's API."""

from __future__ import annotations

import hmac
import json
from typing import Any

from evolve.gateway.wire import GatewayError

MAX_BODY = 32 << 20


def authorized(request: Any, api_key: str | None) -> bool:
    """Whether the request carries ``api_key`` (``Authorization: Bearer`` or ``x-api-key``); any
    request when no key is asked."""
    if not api_key:
        return True
    want = api_key.encode()
    bearer = request.headers.get("authorization", "")
    given = bearer[7:] if bearer.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
    return hmac.compare_digest(given.encode("utf-8", "replace"), want)


def check_origin(request: Any, allow_origins: tuple[str, ...], loopback: bool) -> None:
    """A web page must not drive a gateway on this machine: requests from a browser (an Origin
    header) are refused unless allowed, and on loopback the Host must name loopback (DNS rebinding)."""
    origin = request.headers.get("origin")
    if origin and origin not in allow_origins:
        raise GatewayError(
            403,
            f"requests from web pages are refused (Origin {origin!r}); list the origin in "
            "the gateway's allow_origins to permit it",
            code="origin_not_allowed",
        )
    if loopback:
        host = (request.headers.get("host") or "").rsplit(":", 1)[0].strip("[]").lower()
        if host and host not in ("localhost", "127.0.0.1", "::1") and not host.startswith("127."):
            raise GatewayError(
                403,
                f"Host {host!r} is not this machine's loopback; the gateway is bound to loopback",
                code="host_not_allowed",
            )


async def read_json(request: Any) -> Any:
    """The request's JSON body: a 415 for another content type, a 413 past :data:`MAX_BODY` bytes
    (a chunked body too), a 400 for JSON that does not parse."""
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise GatewayError(415, f"the request body must be JSON (Content-Type: application/json), not {ctype!r}")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY:
        raise GatewayError(413, f"the request body is over {MAX_BODY} bytes")
    parts, size = [], 0
    async for part in request.stream():  # a chunked body is bounded too
        size += len(part)
        if size > MAX_BODY:
            raise GatewayError(413, f"the request body is over {MAX_BODY} bytes")
        parts.append(part)
    try:
        return json.loads(b"".join(parts))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise GatewayError(400, f"the request body is not valid JSON: {type(e).__name__}: {str(e)[:200]}") from None


def json_response(status: int, value: Any, headers: dict[str, str] | None = None) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(value, status_code=status, headers=headers)


def error_response(api: str, err: GatewayError) -> Any:
    """``err`` as the agent's API (``openai`` or ``anthropic``) shapes an error."""
    return json_response(err.status, err.anthropic() if api == "anthropic" else err.openai())


__all__ = ["MAX_BODY", "authorized", "check_origin", "error_response", "json_response", "read_json"]
