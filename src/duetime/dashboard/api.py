"""The dashboard's JSON API for scripts and other tools: what the pages show, read with
GET under ``/api/``, and the pages' actions as POSTs (``api_actions``), all through the
public ``AsyncQueue`` API. docs/dashboard.md describes every route.

The API keeps the pages' rules: the same credentials and roles (``guard``: a viewer
may GET, never POST), and a POST carries a JSON body (``Content-Type:
application/json``, which a form on another site cannot send) and the session's CSRF
token in the ``X-Duetime-CSRF`` header, unless it signs in with ``Authorization:
Bearer``, which a browser never adds by itself. Answers are JSON; an error is
``{"error": text}`` with its status.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import enum
import hmac
import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from duetime import AsyncQueue, validation
from duetime.dashboard import views, workers_view
from duetime.dashboard.guard import role_of
from duetime.dashboard.inputs import dead_filter, page_number
from duetime.dashboard.search_view import SEARCH_BUDGET, SEARCH_LIMIT, asked
from duetime.dashboard.security import session_of
from duetime.dashboard.site import Dashboard
from duetime.errors import (
    DuetimeError,
    InvalidInputError,
    RedisUnavailableError,
    TaskNotFoundError,
    TaskStateError,
)
from duetime.store.redis.connections import mask_urls_in

CSRF_HEADER = "x-duetime-csrf"
#: How many tasks a listing may ask for at once.
MOST_LISTED = 1000
Endpoint = Callable[[Request], Awaitable[Response]]


def jsonable(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON can hold it: records as objects, states as their names, bytes
    as ``{"$bytes": base64}``, a float that is not finite as its name (``"nan"``), keys
    as text (a key that is not text as its JSON)."""
    if depth > 100:
        raise InvalidInputError("data nested too deep to show")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            item.name: jsonable(getattr(value, item.name), depth + 1)
            for item in dataclasses.fields(value)
            if item.init
        }
    if isinstance(value, enum.Enum):
        return jsonable(value.value, depth + 1)
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode()}
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {_key(key, depth): jsonable(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(item, depth + 1) for item in value]
    return value


def _key(key: Any, depth: int) -> str:
    return key if isinstance(key, str) else json.dumps(jsonable(key, depth + 1))


def answer(value: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(jsonable(value), status_code=status)


def _status_of(error: Exception) -> tuple[int, str]:
    if isinstance(error, HTTPException):
        return error.status_code, str(error.detail)
    if isinstance(error, InvalidInputError):
        return 400, str(error)
    if isinstance(error, TaskNotFoundError):
        return 404, str(error.args[0]) if error.args else str(error)
    if isinstance(error, TaskStateError):
        return 409, str(error)
    if isinstance(error, RedisUnavailableError):
        return 503, mask_urls_in(str(error))
    return 500, mask_urls_in(str(error))


def json_errors(endpoint: Endpoint) -> Endpoint:
    """``endpoint`` with its errors answered as ``{"error": ...}`` and their status."""

    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except (HTTPException, DuetimeError) as error:
            status, text = _status_of(error)
            return JSONResponse({"error": text}, status_code=status)

    return guarded


def whole(request: Request, name: str, default: int, least: int, most: int) -> int:
    """A whole-number query parameter, checked (400 with the range otherwise)."""
    text = request.query_params.get(name)
    try:
        number = default if text is None else int(text)
    except ValueError:
        raise InvalidInputError(f"{name} must be a whole number, got {text!r}") from None
    return validation.whole_number(number, name, least, most)


class ApiBase:
    """What the API's routes share: the dashboard, its queue by name, and the checks a
    POST passes before its body is read."""

    def __init__(self, site: Dashboard) -> None:
        self.site = site

    def queue(self, request: Request) -> tuple[str, AsyncQueue]:
        return self.site.queue(request)

    async def body(self, request: Request) -> dict[str, Any]:
        """The JSON object a POST carries, once its CSRF token (or its bearer token)
        and its content type are right."""
        if not self._bearer(request):
            given = request.headers.get(CSRF_HEADER, "")
            expected = self.site.sessions.csrf_token(session_of(request))
            if not hmac.compare_digest(given, expected):
                raise HTTPException(
                    403, "the X-Duetime-CSRF header is missing or wrong: GET /api/session for "
                    "this session's token, or sign in with Authorization: Bearer",
                )  # fmt: skip
        kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind != "application/json":
            raise HTTPException(415, "send the body as JSON (Content-Type: application/json)")
        raw = await request.body()
        try:
            found = json.loads(raw or b"{}")
        except (ValueError, RecursionError):
            raise InvalidInputError("the body is not valid JSON") from None
        if not isinstance(found, dict):
            raise InvalidInputError("the body must be a JSON object")
        return found

    def _bearer(self, request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and (
            self.site.credentials.token_role(token.strip()) is not None
        )


class ApiReads(ApiBase):
    """The GET routes: each answers what a page shows, as JSON."""

    async def session(self, request: Request) -> Response:
        """This session's role and CSRF token (for a script that POSTs with a cookie)."""
        token = self.site.sessions.csrf_token(session_of(request))
        return answer({"role": role_of(request), "csrf": token, "queues": self.site.names})

    async def queues(self, request: Request) -> Response:
        names = list(self.site.queues)
        stats = await asyncio.gather(*(self.site.queues[name].stats() for name in names))
        return answer([{"name": name, "stats": s} for name, s in zip(names, stats, strict=True)])

    async def workers(self, request: Request) -> Response:
        found = await workers_view.workers(self.site.queues, self.site.settings, time.time())
        return answer(found.rows)

    async def stats(self, request: Request) -> Response:
        return answer(await self.queue(request)[1].stats())

    async def throughput(self, request: Request) -> Response:
        minutes = whole(request, "minutes", 60, 1, 60)
        return answer(await self.queue(request)[1].throughput(minutes))

    async def tasks(self, request: Request) -> Response:
        state = request.query_params.get("state", "scheduled")
        limit = whole(request, "limit", 50, 1, MOST_LISTED)
        offset = whole(request, "offset", 0, 0, 1_000_000)
        return answer(await self.queue(request)[1].tasks(state, limit, offset))

    async def task(self, request: Request) -> Response:
        queue = self.queue(request)[1]
        task_id = validation.task_id(request.query_params.get("id", ""))
        status = await queue.status(task_id)
        if status is None:
            raise queue.core.inspection.not_found(task_id)
        return answer(status)

    async def dead(self, request: Request) -> Response:
        """Dead tasks, most recent first, filtered as on the Dead page (a filtered read
        is bounded as there, and says so)."""
        chosen, _, error = dead_filter(request.query_params)
        if error is not None:
            raise InvalidInputError(error)
        page = page_number(request.query_params.get("page"))
        return answer(await views.dead_page(self.queue(request)[1], chosen, page))

    async def flow(self, request: Request) -> Response:
        most_keys = whole(request, "keys", 50, 0, 1000)
        queue = self.queue(request)[1]
        state, limits = await asyncio.gather(queue.flow(most_keys), queue.limits())
        return answer({"flow": state, "limits": limits})

    async def cron(self, request: Request) -> Response:
        upcoming = whole(request, "upcoming", 3, 0, 100)
        return answer(await self.queue(request)[1].list_cron(upcoming))

    async def search(self, request: Request) -> Response:
        """A search as on the Search page: the same fields (id, task, error, field,
        value, state), a ``cursor`` to go on, ``budget`` and ``limit``."""
        wanted = asked(request.query_params)
        if wanted.criteria is None:
            raise InvalidInputError(wanted.error or "search by id, task, error or field")
        budget = whole(request, "budget", SEARCH_BUDGET, 1, 1_000_000)
        limit = whole(request, "limit", SEARCH_LIMIT, 1, 10_000)
        cursor = request.query_params.get("cursor") or None
        queue = self.queue(request)[1]
        found = await queue.search(wanted.criteria, cursor=cursor, budget=budget, limit=limit)
        return answer(found)
