"""Signing in to the dashboard with a token (the operator's or the viewer's: the session
takes that role), and signing out: each issues a new session."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from duetime.dashboard.inputs import form_text, local_path
from duetime.dashboard.security import set_session_cookie, verified_form
from duetime.dashboard.site import Dashboard


class SignIn:
    """The sign-in page and form, and signing out, with what ``site`` shares."""

    def __init__(self, site: Dashboard) -> None:
        self.site = site

    async def login(self, request: Request) -> Response:
        next_page = local_path(request.query_params.get("next"), "/")
        if not self.site.credentials.any_token:
            return RedirectResponse(next_page, status_code=303)
        if request.method == "GET":
            return self.site.render(request, "login.html", {"next": next_page, "error": None})
        form = await verified_form(request, self.site.sessions)
        next_page = local_path(form_text(form, "next"), "/")
        role = self.site.credentials.token_role(form_text(form, "token"))
        if role is None:
            context = {"next": next_page, "error": "That token is not right."}
            return self.site.render(request, "login.html", context, status=401)
        response = RedirectResponse(next_page, status_code=303)
        # A new session on sign-in: a nonce planted before it is worth nothing after.
        set_session_cookie(response, request, self.site.sessions.issue(role))
        return response

    async def logout(self, request: Request) -> Response:
        await verified_form(request, self.site.sessions)
        response = RedirectResponse("/login", status_code=303)
        set_session_cookie(response, request, self.site.sessions.issue(role=None))
        return response
