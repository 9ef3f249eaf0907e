"""HTTP guard: who may mutate, how big a body may be, and errors as JSON.

Mutations (any method but GET/HEAD/OPTIONS) need `Authorization: Bearer
<DLQ_ADMIN_TOKEN>` when that is set (compared in constant time); when it is not set
they are accepted from loopback clients only.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Awaitable, Callable

from aiohttp import web

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False


def refusal(method: str, remote: str | None, authorization: str | None, token: str) -> tuple[int, str] | None:
    """Why a request is refused, as (status, message), or None when it may proceed."""
    if method in SAFE_METHODS:
        return None
    if token:
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given:
            return 401, "this action needs Authorization: Bearer <DLQ_ADMIN_TOKEN>"
        if not hmac.compare_digest(given.strip().encode(), token.encode()):
            return 403, "wrong admin token"
        return None
    if not is_loopback(remote):
        return 403, "mutations are accepted from loopback clients only; set DLQ_ADMIN_TOKEN to allow remote operators"
    return None


def guard_middleware(token: str) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """aiohttp middleware: the auth rule above, and every HTTP error as a JSON body."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = refusal(request.method, request.remote, request.headers.get("Authorization"), token)
        if refused is not None:
            status, message = refused
            return web.json_response({"error": message}, status=status)
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else exc.reason
            if exc.status == 413:
                message = f"request body too large (limit {request.app._client_max_size} bytes, DLQ_MAX_BODY_BYTES)"
            return web.json_response({"error": message}, status=exc.status)

    return guard
