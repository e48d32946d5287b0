"""Who may use the dashboard and how a request proves it: the bind-address check, the
token and basic-auth credentials of its two roles (an operator may act, a viewer only
look), signed session cookies that carry the role, CSRF tokens, the same-origin check on
state-changing requests, and the security headers every response carries.

``guard.Guard`` is the ASGI middleware that applies all of it before a request reaches
a page; the pages only call ``verified_form`` on their POST bodies (the CSRF token lives
in the form, which a middleware should not consume).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from duetime import validation
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


class Role(StrEnum):
    """What a signed-in person may do: an operator everything the dashboard does, a
    viewer look at every page and call every GET of the API, and act on nothing."""

    OPERATOR = "operator"
    VIEWER = "viewer"


def _basic_pair(basic_auth: str | tuple[str, str] | None, what: str) -> tuple[str, str] | None:
    """A checked ``user:password`` (or pair); ConfigurationError says what to give."""
    if basic_auth is None:
        return None
    if isinstance(basic_auth, str):
        user, colon, password = basic_auth.partition(":")
        if not colon:
            raise ConfigurationError(f"{what} must be given as user:password")
    else:
        user, password = basic_auth
    if not user or not password or ":" in user:
        raise ConfigurationError(
            f"{what} needs a user name (without ':') and a non-empty password, as user:password"
        )
    return user, password


def _checked_token(token: str | None, what: str) -> str | None:
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"the dashboard {what} must be at least {MIN_TOKEN_LENGTH} characters; make one "
            'with: python -c "import secrets; print(secrets.token_urlsafe(32))"'
        )
    return token or None


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a request must show when any is set: a bearer token (also accepted by the
    sign-in form) and/or a basic-auth user and password, for each role."""

    token: str | None = None
    basic_user: str | None = None
    basic_password: str | None = None
    viewer_token: str | None = None
    viewer_user: str | None = None
    viewer_password: str | None = None

    @classmethod
    def of(
        cls,
        token: str | None,
        basic_auth: str | tuple[str, str] | None,
        viewer_token: str | None = None,
        viewer_basic_auth: str | tuple[str, str] | None = None,
    ) -> Credentials:
        """Checked credentials; ConfigurationError says what to give instead."""
        operator = _checked_token(token, "token")
        viewer = _checked_token(viewer_token, "viewer token")
        if operator is not None and viewer is not None and _same(operator, viewer):
            raise ConfigurationError("the viewer token must differ from the operator's token")
        basic = _basic_pair(basic_auth, "basic auth")
        viewer_basic = _basic_pair(viewer_basic_auth, "viewer basic auth")
        if basic and viewer_basic and basic[0] == viewer_basic[0]:
            raise ConfigurationError("the viewer's basic-auth user must differ from the operator's")
        user, password = basic or (None, None)
        viewer_user, viewer_password = viewer_basic or (None, None)
        return cls(operator, user, password, viewer, viewer_user, viewer_password)

    @property
    def configured(self) -> bool:
        return any((self.token, self.basic_user, self.viewer_token, self.viewer_user))

    @property
    def any_token(self) -> bool:
        """Whether a token signs in (then the sign-in form is offered)."""
        return self.token is not None or self.viewer_token is not None

    def token_role(self, given: str) -> Role | None:
        """The role whose token this is (both compared, always, in constant time)."""
        operator = self.token is not None and _same(given, self.token)
        viewer = self.viewer_token is not None and _same(given, self.viewer_token)
        return Role.OPERATOR if operator else Role.VIEWER if viewer else None

    def header_role(self, authorization: str | None) -> Role | None:
        """The role an ``Authorization`` header's credentials give, if any."""
        if not authorization:
            return None
        scheme, _, value = authorization.partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == "bearer":
            return self.token_role(value)
        if scheme != "basic":
            return None
        try:
            decoded = base64.b64decode(value, validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            return None
        user, _, password = decoded.partition(":")
        pairs = (
            (Role.OPERATOR, self.basic_user, self.basic_password),
            (Role.VIEWER, self.viewer_user, self.viewer_password),
        )
        found = None
        for role, expected_user, expected_password in pairs:
            if expected_user is None or not expected_password:
                continue
            # Both compared, always: no early exit that would time the user name.
            user_ok = _same(user, expected_user)
            if _same(password, expected_password) and user_ok:
                found = role
        return found


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


#: How a session cookie spells its role (``a``: an operator, as before roles came).
_ROLE_FLAGS = {Role.OPERATOR: "a", Role.VIEWER: "v", None: "-"}
_FLAG_ROLES = {flag: role for role, flag in _ROLE_FLAGS.items()}


@dataclass(frozen=True, slots=True)
class Session:
    """One browser's session: a random nonce (its CSRF token is derived from it) and
    the role whose token was given on the sign-in form (None: not signed in)."""

    nonce: str
    role: Role | None
    issued: int  # epoch seconds
    cookie: str  # the signed value of the cookie

    @property
    def authenticated(self) -> bool:
        return self.role is not None


class Sessions:
    """Signs and checks session cookies and CSRF tokens with a key of this process
    (sessions end when the dashboard restarts: nothing to store, nothing to leak)."""

    def __init__(self, key: bytes | None = None, lifetime: float = SESSION_LIFETIME) -> None:
        self.key = key or secrets.token_bytes(32)
        self.lifetime = lifetime

    def _sign(self, text: str) -> str:
        digest = hmac.new(self.key, text.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def issue(self, role: Role | None) -> Session:
        nonce = secrets.token_urlsafe(18)
        issued = int(time.time())
        body = f"{nonce}.{_ROLE_FLAGS[role]}.{issued}"
        return Session(nonce, role, issued, f"{body}.{self._sign(body)}")

    def read(self, cookie: str | None) -> Session | None:
        """The session of a cookie, or None if it is missing, forged or expired."""
        if not cookie or cookie.count(".") != 3:
            return None
        body, _, signature = cookie.rpartition(".")
        if not hmac.compare_digest(signature, self._sign(body)):
            return None
        nonce, flag, issued_text = body.split(".")
        if not validation.is_whole(issued_text) or flag not in _FLAG_ROLES:
            return None
        issued = int(issued_text)
        role = _FLAG_ROLES[flag]
        if role is not None and time.time() - issued > self.lifetime:
            return None
        return Session(nonce, role, issued, cookie)

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
