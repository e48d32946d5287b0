"""What every route of the dashboard shares: the queues (opened in the app's lifespan),
the credentials and sessions, the templates, and the ways a route answers: a page (or
only its ``live`` block), a redirect with a one-shot notice, the sign-in needed, an
error page.

A page asked for with the header ``X-Duetime-Fragment: live`` answers with only its
``live`` block, which the page's script swaps in every few seconds.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)

from duetime import AsyncQueue, __version__, validation
from duetime.dashboard.formatting import FILTERS, relative
from duetime.dashboard.guard import role_of
from duetime.dashboard.inputs import local_path
from duetime.dashboard.security import Credentials, Role, Sessions, session_of
from duetime.errors import ConfigurationError, RedisUnavailableError
from duetime.settings import Settings
from duetime.store.redis.connections import mask_urls_in
from duetime.store.redis.runner import RedisSpec

HERE = Path(__file__).parent
NOTICE_COOKIE = "duetime_notice"
FRAGMENT_HEADER = "x-duetime-fragment"


@dataclass(frozen=True, slots=True)
class Notice:
    """The one-shot message shown after an action."""

    text: str
    kind: str = "ok"  # ok | error
    link: str | None = None  # a local path to follow up (e.g. the task just made)


class Dashboard:
    """The state the routes share: the queues (opened in the app's lifespan), the
    credentials and sessions, the templates."""

    def __init__(
        self,
        queue_names: Sequence[str],
        redis: RedisSpec,
        *,
        shards: int,
        settings: Settings,
        credentials: Credentials,
        sessions: Sessions,
        refresh_seconds: float,
    ) -> None:
        names = [validation.queue_name(name) for name in queue_names]
        if not names:
            raise ConfigurationError("give the dashboard at least one queue")
        self.names = list(dict.fromkeys(names))  # in the order given, once each
        self.redis = redis
        self.shards = validation.shards(shards)
        self.settings = settings
        self.credentials = credentials
        self.sessions = sessions
        self.refresh_seconds = refresh_seconds
        self.queues: dict[str, AsyncQueue] = {}
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=True,  # every template, every value: task data is untrusted
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters.update(FILTERS)

    # --- lifecycle -----------------------------------------------------------------------

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # Made here, so that their connections belong to the server's event loop.
        self.queues = {
            name: AsyncQueue(name, self.redis, settings=self.settings, shards=self.shards)
            for name in self.names
        }
        try:
            yield
        finally:
            queues, self.queues = self.queues, {}
            await asyncio.gather(*(queue.close() for queue in queues.values()))

    def queue(self, request: Request) -> tuple[str, AsyncQueue]:
        name = str(request.path_params["queue"])
        if name not in self.names:
            raise HTTPException(404, f"This dashboard does not show a queue named {name!r}.")
        if name not in self.queues:
            raise RuntimeError("the dashboard app must run with its lifespan (it opens queues)")
        return name, self.queues[name]

    # --- rendering -----------------------------------------------------------------------

    def render(
        self,
        request: Request,
        template_name: str,
        context: dict[str, Any],
        status: int = 200,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        session = session_of(request)
        template = self.templates.get_template(template_name)
        values: dict[str, Any] = {
            "request": request,
            "queue_names": self.names,
            "queue": None,
            "page": "",
            "csrf": self.sessions.csrf_token(session),
            "refresh_ms": int(self.refresh_seconds * 1000),
            "signed_in": session.authenticated,
            # The sign-in page shows no navigation: queue names are not for strangers.
            "authorized": role_of(request) is not None,
            # A viewer sees every page, without the forms that act.
            "role": role_of(request),
            "can_act": role_of(request) == Role.OPERATOR,
            "token_login": self.credentials.any_token,
            "version": __version__,
            "now": time.time(),
            "relative": relative,
            "notice": None,
            **context,
        }
        if request.headers.get(FRAGMENT_HEADER) == "live" and "live" in template.blocks:
            block = template.blocks["live"](template.new_context(values))
            return HTMLResponse("".join(block), status, headers)
        note = self.sessions.read_note(request.cookies.get(NOTICE_COOKIE))
        if note is not None:
            with suppress(ValueError, TypeError):  # a notice of an older version
                values["notice"] = Notice(**json.loads(note))
        response = HTMLResponse(template.render(values), status, headers)
        if NOTICE_COOKIE in request.cookies:
            response.delete_cookie(NOTICE_COOKIE, path="/")
        return response

    def redirect(self, request: Request, to: str, notice: Notice) -> Response:
        response = RedirectResponse(to, status_code=303)
        note = json.dumps({"text": notice.text, "kind": notice.kind, "link": notice.link})
        response.set_cookie(
            NOTICE_COOKIE,
            self.sessions.sign_note(note),
            max_age=60,
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def unauthorized(self, request: Request) -> Response:
        """The answer to a request without valid credentials: 401, with the sign-in form
        when a token is configured, or the basic-auth challenge."""
        if request.headers.get(FRAGMENT_HEADER):
            return PlainTextResponse("Sign-in needed.", status_code=401)
        if self.credentials.any_token:
            asked = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return self.render(
                request,
                "login.html",
                {"next": local_path(asked, "/"), "error": None},
                status=401,
                headers={"www-authenticate": 'Bearer realm="duetime"'},
            )
        return PlainTextResponse(
            "This dashboard needs a user name and password.",
            status_code=401,
            headers={"www-authenticate": 'Basic realm="duetime", charset="UTF-8"'},
        )

    async def failed(self, request: Request, error: Exception) -> Response:
        """An error page: HTTP errors with their status, duetime errors as 503 (Redis
        out of reach) or 500, with a message that never shows a password."""
        if isinstance(error, HTTPException):
            status, message, headers = error.status_code, error.detail, error.headers
        elif isinstance(error, RedisUnavailableError):
            status, message, headers = 503, mask_urls_in(str(error)), None
        else:
            status, message, headers = 500, mask_urls_in(str(error)), None
        if request.url.path.startswith("/api/"):  # the JSON API answers in JSON
            return JSONResponse({"error": message}, status_code=status, headers=headers)
        if request.headers.get(FRAGMENT_HEADER):
            return PlainTextResponse(message, status_code=status, headers=headers)
        return self.render(
            request, "error.html", {"status": status, "message": message}, status, headers
        )
