"""HTTP plumbing every route shares: JSON errors, query and body parsing, who asked."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from faust import web
from faust.web.drivers.aiohttp import Web as AiohttpWeb

from dlqapp.core.commands import ReplayStatus
from dlqapp.core.requests import without_lone_surrogates
from dlqapp.deadletters.queries import BadQuery
from dlqapp.settings import parse_duration_ms

STATUS_CODES: dict[str, int] = {
    ReplayStatus.REPROCESSED: 200,
    ReplayStatus.DISCARDED: 200,
    ReplayStatus.FIRED: 200,
    ReplayStatus.DEAD_LETTERED: 200,
    ReplayStatus.EXPIRED: 200,
    ReplayStatus.NOT_FOUND: 404,
    ReplayStatus.REFUSED: 409,
    ReplayStatus.SET: 200,
    ReplayStatus.INVALID: 400,
    ReplayStatus.ERROR: 500,
}


class SurrogateSafeWeb(AiohttpWeb):
    """Faust's aiohttp web driver, whose JSON answers survive what orjson refuses in what they
    show: a lone surrogate (a model name or payload stored before dlqapp refused them; every
    read showing one answered 500), an integer past 64 bits in a dead letter's payload."""

    def json(self, value: Any, **kwargs: Any) -> Any:
        try:
            return super().json(value, **kwargs)
        except (TypeError, UnicodeEncodeError):  # "str is not valid UTF-8: surrogates not allowed"
            pass
        cleaned = without_lone_surrogates(value)
        try:
            return super().json(cleaned, **kwargs)
        except (TypeError, UnicodeEncodeError):  # orjson's other refusals: an integer past 64 bits, deep nesting
            text = json.dumps(cleaned, default=str)
            return self.bytes(
                text.encode(), content_type=kwargs.pop("content_type", None) or "application/json", **kwargs
            )


class ApiError(Exception):
    """An error answered as `{"error": message}` with an HTTP status."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


def error_response(view: web.View, exc: ApiError) -> web.Response:
    return view.json({"error": exc.message, **exc.extra}, status=exc.status)


def handled(handler: Callable[..., Awaitable[web.Response]]) -> Callable[..., Awaitable[web.Response]]:
    """Turn `ApiError` and `BadQuery` raised by a handler into JSON error responses."""

    async def wrapper(self: web.View, request: web.Request, **kwargs: Any) -> web.Response:
        try:
            return await handler(self, request, **kwargs)
        except ApiError as exc:
            return error_response(self, exc)
        except BadQuery as exc:
            return self.json({"error": str(exc)}, status=400)

    wrapper.__name__ = handler.__name__
    wrapper.__doc__ = handler.__doc__
    return wrapper


def lateness_window(request: web.Request) -> int | None:
    """`?window=` of a health read in ms (None: the whole window kept)."""
    text = request.query.get("window")
    if text is None:
        return None
    try:
        window_ms = parse_duration_ms(text)
    except ValueError as exc:
        raise BadQuery(f"window: {exc}") from None
    if window_ms <= 0:
        raise BadQuery("window must be positive (example: 15s)")
    return window_ms


async def read_json(request: web.Request) -> Any:
    """The request body as JSON, or ApiError 400 naming the problem."""
    body = await request.read()
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None


def actor_of(request: web.Request) -> str:
    """Who asked: the X-DLQ-Actor header, else the client address."""
    # faust's Request type has no `remote`; its aiohttp driver hands views aiohttp's Request, which has
    return (request.headers.get("X-DLQ-Actor") or f"api@{request.remote}")[:200]  # type: ignore[attr-defined]


def command_response(view: web.View, result: dict[str, Any]) -> web.Response:
    return view.json(result, status=STATUS_CODES.get(result.get("status", ReplayStatus.ERROR), 500))


def optional_limit(query: Mapping[str, str]) -> int | None:
    """`?limit=` (at least 1), or None when not given."""
    raw = query.get("limit")
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadQuery(f"limit must be an integer, not {raw!r}") from None
    if value < 1:
        raise BadQuery("limit must be >= 1")
    return value


def budget_of(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The key and limits of a `POST /budgets/` body: `tenant` (or `*`) or `model`, and
    `day_usd` / `month_usd` (null or left out: no limit on that window)."""
    tenant, model = body.get("tenant"), body.get("model")
    if (tenant is None) == (model is None):
        raise ApiError(400, 'name either "tenant" (a tenant, or "*" for every tenant) or "model"')
    name = tenant if tenant is not None else model
    if not isinstance(name, str) or not name:
        raise ApiError(400, "tenant or model must be a non-empty string")
    unknown = set(body) - {"tenant", "model", "day_usd", "month_usd"}
    if unknown:
        raise ApiError(400, f"unknown field(s) {sorted(unknown)}: tenant or model, day_usd, month_usd")
    key = name if tenant is not None else f"model:{name}"
    return key, {k: body.get(k) for k in ("day_usd", "month_usd")}


def force_of(body: dict[str, Any]) -> bool:
    force = body.get("force", False)
    if not isinstance(force, bool):
        raise ApiError(400, "force must be true or false")
    return force


def top_of(params: Any) -> int:
    """The `top` of a fan-out's local read (how many items each worker sends)."""
    try:
        top = int(params.get("top", "50"))
    except ValueError:
        raise BadQuery("top must be an integer") from None
    if top < 0:
        raise BadQuery("top must be >= 0")
    return top
