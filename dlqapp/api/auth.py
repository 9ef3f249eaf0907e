"""HTTP guard: who may call, who may mutate, how big a body may be, and errors as JSON.

Every request but the probes: the `Host` header must name this worker (an IP address, a
loopback name, the advertised host, this machine's name, or one in DLQ_ALLOWED_HOSTS),
which defeats DNS rebinding. The probes (`GET /livez`, `GET /readyz`) answer whatever the
Host: they are read-only and say only whether the worker is alive and ready, and an
orchestrator or load balancer may probe by any name. Mutations (any method but GET/HEAD) also need:
- `Content-Type: application/json`, which a cross-site form or simple fetch cannot send
  without a CORS preflight, and dlqapp answers no preflight. One exception: a `DELETE`
  without a body that carries the right bearer token. A browser attaches no
  `Authorization` header of its own and sends no cross-site `DELETE` without a preflight,
  so such a request cannot come from a hostile page, and it has no body to type. A
  token-less mutation (loopback only) keeps the rule: it is what a page on the operator's
  own machine could forge;
- no `Origin`, or this worker's own, or one in DLQ_ALLOWED_ORIGINS;
- `Authorization: Bearer <DLQ_ADMIN_TOKEN>` when that is set (compared in constant
  time); when it is not set, a loopback client.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from aiohttp import web

from dlqapp.settings import Settings

SAFE_METHODS = frozenset({"GET", "HEAD"})
PROBE_PATHS = frozenset({"/livez", "/readyz"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False


def host_name(host_header: str) -> str:
    """The name in a Host header, without port or IPv6 brackets, lower-cased."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class AccessPolicy:
    """What the guard accepts. `hosts` and `origins` are the configured extras."""

    token: str = ""
    max_body_bytes: int = 4 * 1024 * 1024
    hosts: frozenset[str] = field(default_factory=frozenset)
    origins: frozenset[str] = field(default_factory=frozenset)

    def host_allowed(self, host_header: str | None) -> bool:
        if not host_header:
            return True  # HTTP/1.0 clients; a browser always sends Host
        name = host_name(host_header)
        return _is_ip(name) or name in LOOPBACK_NAMES or name.endswith(".localhost") or name in self.hosts

    def origin_allowed(self, origin: str, host_header: str | None) -> bool:
        origin = origin.rstrip("/").lower()
        if origin in self.origins:
            return True
        parts = urlsplit(origin)
        if not host_header:
            return False
        return parts.scheme in ("http", "https") and parts.netloc == host_header.strip().lower()


def refusal(
    method: str, remote: str | None, headers: Mapping[str, str], policy: AccessPolicy, path: str = ""
) -> tuple[int, str] | None:
    """Why a request is refused, as (status, message naming what to set), or None."""
    if method in SAFE_METHODS and path in PROBE_PATHS:
        return None
    host = headers.get("Host")
    if not policy.host_allowed(host):
        return 403, f"host {host_name(host or '')!r} is not this worker's; add it to DLQ_ALLOWED_HOSTS"
    if method in SAFE_METHODS:
        return None
    given = _bearer(headers)
    token_ok = bool(policy.token) and given is not None and hmac.compare_digest(given.encode(), policy.token.encode())
    content_type = headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    untyped_ok = token_ok and method == "DELETE" and not _has_body(headers)
    if content_type != "application/json" and not untyped_ok:
        return 415, "mutations need Content-Type: application/json"
    origin = headers.get("Origin")
    if origin is not None and not policy.origin_allowed(origin, host):
        return 403, f"origin {origin[:100]!r} may not change this worker; add it to DLQ_ALLOWED_ORIGINS"
    if policy.token:
        if given is None:
            return 401, "this action needs Authorization: Bearer <DLQ_ADMIN_TOKEN>"
        return None if token_ok else (403, "wrong admin token")
    if not is_loopback(remote):
        return 403, "mutations are accepted from loopback clients only; set DLQ_ADMIN_TOKEN to allow remote operators"
    return None


def _bearer(headers: Mapping[str, str]) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    scheme, _, given = (headers.get("Authorization") or "").partition(" ")
    given = given.strip()
    return given if scheme.lower() == "bearer" and given else None


def _has_body(headers: Mapping[str, str]) -> bool:
    """Whether a request announces a body (a length other than 0, or a chunked one)."""
    length = headers.get("Content-Length", "").strip()
    return bool(headers.get("Transfer-Encoding")) or (bool(length) and length != "0")


def guard_middleware(policy: AccessPolicy) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """aiohttp middleware: the rules above, and every HTTP error as a JSON body."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = refusal(request.method, request.remote, request.headers, policy, request.path)
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
                message = f"request body too large (limit {policy.max_body_bytes} bytes, DLQ_MAX_BODY_BYTES)"
            return web.json_response({"error": message}, status=exc.status)

    return guard


def access_policy(settings: Settings) -> AccessPolicy:
    """Who the HTTP server answers to: this machine's names, the advertised host, the extras."""
    hosts = {settings.web_host.lower(), socket.gethostname().lower(), socket.getfqdn().lower(), *settings.allowed_hosts}
    if settings.web_advertised_url:
        hosts.add(host_name(urlsplit(settings.web_advertised_url).netloc))
    return AccessPolicy(
        token=settings.admin_token,
        max_body_bytes=settings.max_body_bytes,
        hosts=frozenset(hosts),
        origins=frozenset(settings.allowed_origins),
    )
