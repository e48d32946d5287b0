"""Who may use the dashboard and how a request proves it: the bind-address check, the
token and basic-auth credentials, signed session cookies, CSRF tokens, the same-origin
check on state-changing requests, and the security headers every response carries.

``Guard`` is the ASGI middleware that applies all of it before a request reaches a
page; the pages only call ``verified_form`` on their POST bodies (the CSRF token lives
in the form, which a middleware should not consume).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import FormData, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from duetime.errors import ConfigurationError

#: The cookie holding the signed session (CSRF nonce, and whether the token was given).
SESSION_COOKIE = "duetime_session"
#: How long a sign-in with the token lasts.
SESSION_LIFETIME = 12 * 3600
#: Shortest token accepted: a guessable token on an open port is no protection.
MIN_TOKEN_LENGTH = 16
#: Requests that need no credentials: the sign-in form, and the package's own CSS, JS
#: and icon (public files of the package, so that the sign-in page is styled).
OPEN_PATHS = ("/login",)
OPEN_PREFIXES = ("/static/",)

SECURITY_HEADERS: Mapping[str, str] = {
    # No inline script or style anywhere: every script and stylesheet is a file we ship.
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    # Same-origin requests keep their Referer (the CSRF check reads it); others get none.
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "permissions-policy": "camera=(), microphone=(), geolocation=(), payment=()",
}

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) can only
    be reached from this machine."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a request must show when any is set: the bearer token (also accepted by the
    sign-in form) and/or a basic-auth user and password."""

    token: str | None = None
    basic_user: str | None = None
    basic_password: str | None = None

    @classmethod
    def of(cls, token: str | None, basic_auth: str | tuple[str, str] | None) -> Credentials:
        """Checked credentials; ConfigurationError says what to give instead."""
        if token is not None and len(token) < MIN_TOKEN_LENGTH:
            raise ConfigurationError(
                f"the dashboard token must be at least {MIN_TOKEN_LENGTH} characters; make one "
                'with: python -c "import secrets; print(secrets.token_urlsafe(32))"'
            )
        user = password = None
        if basic_auth is not None:
            if isinstance(basic_auth, str):
                user, colon, password = basic_auth.partition(":")
                if not colon:
                    raise ConfigurationError("basic auth must be given as user:password")
            else:
                user, password = basic_auth
            if not user or not password or ":" in user:
                raise ConfigurationError(
                    "basic auth needs a user name (without ':') and a non-empty password, "
                    "as user:password"
                )
        return cls(token or None, user, password)

    @property
    def configured(self) -> bool:
        return self.token is not None or self.basic_user is not None

    def token_matches(self, given: str) -> bool:
        return self.token is not None and _same(given, self.token)

    def header_matches(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header carries valid credentials."""
        if not authorization:
            return False
        scheme, _, value = authorization.partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer":
            return self.token_matches(value)
        if scheme == "basic" and self.basic_user is not None and self.basic_password:
            try:
                decoded = base64.b64decode(value, validate=True).decode()
            except (ValueError, UnicodeDecodeError):
                return False
            user, _, password = decoded.partition(":")
            # Both compared, always: no early exit that would time the user name.
            user_ok = _same(user, self.basic_user)
            return _same(password, self.basic_password) and user_ok
        return False


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def check_exposure(host: str, credentials: Credentials) -> None:
    """Refuse to serve on an address other hosts can reach without credentials."""
    if is_loopback(host) or credentials.configured:
        return
    raise ConfigurationError(
        f"the dashboard would be reachable from other machines on {host!r} without any "
        "authentication, and it can requeue, delete and run tasks: give a token "
        "(--token or $DUETIME_DASHBOARD_TOKEN, at least "
        f"{MIN_TOKEN_LENGTH} characters) or basic auth (--basic-auth user:password), or "
        "bind to 127.0.0.1 and reach it through an SSH tunnel"
    )


@dataclass(frozen=True, slots=True)
class Session:
    """One browser's session: a random nonce (its CSRF token is derived from it) and
    whether the token was given on the sign-in form."""

    nonce: str
    authenticated: bool
    issued: int  # epoch seconds
    cookie: str  # the signed value of the cookie


class Sessions:
    """Signs and checks session cookies and CSRF tokens with a key of this process
    (sessions end when the dashboard restarts: nothing to store, nothing to leak)."""

    def __init__(self, key: bytes | None = None, lifetime: float = SESSION_LIFETIME) -> None:
        self.key = key or secrets.token_bytes(32)
        self.lifetime = lifetime

    def _sign(self, text: str) -> str:
        digest = hmac.new(self.key, text.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def issue(self, authenticated: bool) -> Session:
        nonce = secrets.token_urlsafe(18)
        issued = int(time.time())
        body = f"{nonce}.{'a' if authenticated else '-'}.{issued}"
        return Session(nonce, authenticated, issued, f"{body}.{self._sign(body)}")

    def read(self, cookie: str | None) -> Session | None:
        """The session of a cookie, or None if it is missing, forged or expired."""
        if not cookie or cookie.count(".") != 3:
            return None
        body, _, signature = cookie.rpartition(".")
        if not hmac.compare_digest(signature, self._sign(body)):
            return None
        nonce, flag, issued_text = body.split(".")
        if not issued_text.isdigit():
            return None
        issued = int(issued_text)
        authenticated = flag == "a"
        if authenticated and time.time() - issued > self.lifetime:
            return None
        return Session(nonce, authenticated, issued, cookie)

    def csrf_token(self, session: Session) -> str:
        return self._sign(f"csrf:{session.nonce}")

    def sign_note(self, text: str) -> str:
        """A value a client may hold but not forge (the one-shot notice after an action)."""
        payload = base64.urlsafe_b64encode(text.encode()).decode()
        return f"{payload}.{self._sign('note:' + payload)}"

    def read_note(self, value: str | None) -> str | None:
        if not value or "." not in value:
            return None
        payload, _, signature = value.rpartition(".")
        if not hmac.compare_digest(signature, self._sign("note:" + payload)):
            return None
        try:
            return base64.urlsafe_b64decode(payload.encode()).decode()
        except (ValueError, UnicodeDecodeError):
            return None


def session_of(request: Request) -> Session:
    """The session ``Guard`` attached to the request."""
    session = request.scope["state"]["dashboard_session"]
    assert isinstance(session, Session)
    return session


def set_session_cookie(response: Response, request: Request, session: Session) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        session.cookie,
        max_age=SESSION_LIFETIME if session.authenticated else None,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


async def verified_form(request: Request, sessions: Sessions) -> FormData:
    """The POSTed form, once its CSRF token is the one of this session (403 otherwise)."""
    form = await request.form()
    given = form.get("csrf")
    expected = sessions.csrf_token(session_of(request))
    if not isinstance(given, str) or not hmac.compare_digest(given, expected):
        raise HTTPException(
            403, "This form is stale or did not come from the dashboard (CSRF token missing "
            "or wrong). Reload the page and try again.",
        )  # fmt: skip
    return form


def same_origin(request: Request) -> bool:
    """Whether an unsafe request says it comes from a page of this very host: its
    Origin, else its Referer, must name the host it was sent to. A request with neither
    (some privacy tools strip both) is left to the CSRF token."""
    host = request.headers.get("host", "")
    origin = request.headers.get("origin")
    if origin is not None:
        return origin != "null" and urlsplit(origin).netloc == host
    referer = request.headers.get("referer")
    if referer is not None:
        return urlsplit(referer).netloc == host
    return True


def host_name(request: Request) -> str:
    """The Host header without its port (IPv6 addresses keep their brackets off)."""
    host = request.headers.get("host", "")
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rpartition(":")[0] if host.count(":") == 1 else host


Refusal = Callable[[Request], Awaitable[Response]]


class Guard:
    """The ASGI middleware in front of every route: sessions, authentication, the
    origin check and the security headers."""

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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        session = self.sessions.read(request.cookies.get(SESSION_COOKIE))
        fresh = session is None
        if session is None:
            session = self.sessions.issue(authenticated=False)
        state: dict[str, Any] = scope.setdefault("state", {})
        state["dashboard_session"] = session
        authorized = session.authenticated or self.credentials.header_matches(
            request.headers.get("authorization")
        )
        state["dashboard_authorized"] = authorized
        path = scope["path"]
        response: Response | None = None
        if not self.credentials.configured and not is_loopback(host_name(request)):
            # Without credentials only a loopback name may be used: a web page that
            # re-points its own name at 127.0.0.1 (DNS rebinding) gets nothing.
            response = PlainTextResponse(
                "This dashboard has no authentication configured, so it answers only to "
                "localhost, 127.0.0.1 or [::1].",
                status_code=421,
            )
        elif (
            self.credentials.configured
            and not authorized
            and path not in OPEN_PATHS
            and not path.startswith(OPEN_PREFIXES)
        ):
            response = await self.unauthorized(request)
        elif request.method not in _SAFE_METHODS and not same_origin(request):
            response = PlainTextResponse(
                "Refused: this request came from another site (Origin/Referer check).",
                status_code=403,
            )

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
