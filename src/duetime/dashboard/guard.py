"""The ASGI middleware in front of every route of the dashboard: it reads the session,
finds the request's role (from the session, or the credentials of its ``Authorization``
header), answers for the routes a request may not reach (loopback names only without
credentials, sign-in needed, another site's request, a viewer's attempt to act), and
adds the security headers to every response. Refusals under ``/api/`` are JSON."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from duetime.dashboard.security import (
    OPEN_PATHS,
    OPEN_PREFIXES,
    SECURITY_HEADERS,
    SESSION_COOKIE,
    Credentials,
    Role,
    Session,
    Sessions,
    host_name,
    is_loopback,
    same_origin,
    set_session_cookie,
)

Refusal = Callable[[Request], Awaitable[Response]]

#: Where the JSON API lives: its refusals are JSON too.
API_PREFIX = "/api/"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: What a viewer may still post: signing in (as someone else) and out.
_VIEWER_POSTS = (*OPEN_PATHS, "/logout")

LOOPBACK_ONLY = (
    "This dashboard has no authentication configured, so it answers only to localhost, "
    "127.0.0.1 or [::1]."
)
OTHER_SITE = "Refused: this request came from another site (Origin/Referer check)."
READ_ONLY = (
    "Refused: you are signed in as a viewer, who may look but not act. Sign in with the "
    "operator's token or user to act."
)


def refusal(path: str, text: str, status: int, headers: dict[str, str] | None = None) -> Response:
    """A refusal as the route's kind of client reads it: JSON under /api/, else text."""
    if path.startswith(API_PREFIX):
        return JSONResponse({"error": text}, status_code=status, headers=headers)
    return PlainTextResponse(text, status_code=status, headers=headers)


def role_of(request: Request) -> Role | None:
    """The role ``Guard`` found for the request (None: no credentials shown)."""
    role: Role | None = request.scope["state"].get("dashboard_role")
    return role


class Guard:
    """The ASGI middleware in front of every route: sessions, authentication, roles,
    the origin check and the security headers."""

    def __init__(
        self,
        app: ASGIApp,
        credentials: Credentials,
        sessions: Sessions,
        unauthorized: Refusal,
    ) -> None:
        self.app = app
        self.credentials = credentials
        self.sessions = sessions
        self.unauthorized = unauthorized

    def _role(self, request: Request, session: Session) -> Role | None:
        if not self.credentials.configured:
            return Role.OPERATOR  # loopback names only: whoever reaches it runs it
        # Credentials sent with the request speak for it; else the signed-in session.
        return self.credentials.header_role(request.headers.get("authorization")) or session.role

    async def _refused(self, request: Request, role: Role | None) -> Response | None:
        """The answer for a request that may not reach its route, or None."""
        path = request.url.path
        if not self.credentials.configured and not is_loopback(host_name(request)):
            # Without credentials only a loopback name may be used: a web page that
            # re-points its own name at 127.0.0.1 (DNS rebinding) gets nothing.
            return refusal(path, LOOPBACK_ONLY, 421)
        if role is None and path not in OPEN_PATHS and not path.startswith(OPEN_PREFIXES):
            if path.startswith(API_PREFIX):
                challenge = 'Bearer realm="duetime"' if self.credentials.any_token else None
                challenge = challenge or 'Basic realm="duetime", charset="UTF-8"'
                return refusal(path, "Sign-in needed.", 401, {"www-authenticate": challenge})
            return await self.unauthorized(request)
        if request.method not in _SAFE_METHODS:
            if not same_origin(request):
                return refusal(path, OTHER_SITE, 403)
            if role == Role.VIEWER and path not in _VIEWER_POSTS:
                return refusal(path, READ_ONLY, 403)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        session = self.sessions.read(request.cookies.get(SESSION_COOKIE))
        fresh = session is None
        if session is None:
            session = self.sessions.issue(role=None)
        role = self._role(request, session)
        state: dict[str, Any] = scope.setdefault("state", {})
        state["dashboard_session"] = session
        state["dashboard_role"] = role
        path = scope["path"]
        response = await self._refused(request, role)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
                if not path.startswith(OPEN_PREFIXES):
                    headers["cache-control"] = "no-store"  # pages hold task data
                cookies = headers.getlist("set-cookie")
                already = any(value.startswith(SESSION_COOKIE + "=") for value in cookies)
                if fresh and not already:  # a sign-in sets its own session
                    cookie = Response()
                    set_session_cookie(cookie, request, session)
                    for raw_name, raw_value in cookie.raw_headers:
                        if raw_name == b"set-cookie":
                            headers.append("set-cookie", raw_value.decode("latin-1"))
            await send(message)

        if response is not None:
            await response(scope, receive, send_with_headers)
        else:
            await self.app(scope, receive, send_with_headers)
