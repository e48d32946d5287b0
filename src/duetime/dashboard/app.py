"""The dashboard's Starlette application, assembled: its routes to the pages (pages.py,
search_view.py), the actions (actions.py), the JSON API (api.py, api_actions.py) and
signing in (sign_in.py), each through the public ``AsyncQueue`` API, with what they share
(site.py) and the guard in front of them (guard.py, security.py).

Pages are GET and never change anything; actions are POST only (a GET on one is a 405),
carry the session's CSRF token, and answer with a redirect back to a page and a one-shot
notice (post/redirect/get, so a reload never repeats an action). A page asked for with
the header ``X-Duetime-Fragment: live`` answers with only its ``live`` block, which the
page's script swaps in every few seconds.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from duetime.dashboard.actions import Actions
from duetime.dashboard.api_actions import api_routes
from duetime.dashboard.guard import Guard
from duetime.dashboard.pages import Pages
from duetime.dashboard.search_view import search_routes
from duetime.dashboard.security import Credentials, Sessions
from duetime.dashboard.sign_in import SignIn
from duetime.dashboard.site import HERE, Dashboard
from duetime.errors import ConfigurationError, DuetimeError
from duetime.settings import DEFAULT_SETTINGS, Settings
from duetime.store.redis.runner import RedisSpec


def routes(dashboard: Dashboard) -> list[BaseRoute]:
    """Every route of the dashboard: its pages, actions, signing in and static files."""
    pages, actions, sign_in = Pages(dashboard), Actions(dashboard), SignIn(dashboard)
    q = "/q/{queue}"
    return [
        Route("/", pages.overview),
        Route("/workers", pages.workers),
        Route(f"{q}/timeline", pages.timeline),
        Route(f"{q}/tasks", pages.tasks),
        Route(f"{q}/task", pages.task),
        Route(f"{q}/running", pages.running),
        Route(f"{q}/finished", pages.finished),
        Route(f"{q}/dead", pages.dead),
        Route(f"{q}/dead/confirm", pages.dead_confirm),
        Route(f"{q}/cron", pages.cron),
        Route(f"{q}/flow", pages.flow),
        Route(f"{q}/pause", actions.pause_queue, methods=["POST"]),
        Route(f"{q}/resume", actions.resume_queue, methods=["POST"]),
        Route(f"{q}/task/run-now", actions.run_now, methods=["POST"]),
        Route(f"{q}/task/cancel", actions.cancel, methods=["POST"]),
        Route(f"{q}/dead", actions.dead_action, methods=["POST"]),
        Route(f"{q}/dead/matching", actions.dead_matching, methods=["POST"]),
        Route(f"{q}/cron/pause", actions.cron_pause, methods=["POST"]),
        Route(f"{q}/cron/resume", actions.cron_resume, methods=["POST"]),
        Route(f"{q}/cron/trigger", actions.cron_trigger, methods=["POST"]),
        Route(f"{q}/flow/queue", actions.set_queue_limits, methods=["POST"]),
        Route(f"{q}/flow/key", actions.set_key_limits, methods=["POST"]),
        *search_routes(dashboard),
        *api_routes(dashboard),
        Route("/login", sign_in.login, methods=["GET", "POST"]),
        Route("/logout", sign_in.logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]


def create_app(
    queues: Sequence[str],
    redis: RedisSpec = None,
    *,
    shards: int = 1,
    settings: Settings = DEFAULT_SETTINGS,
    token: str | None = None,
    basic_auth: str | tuple[str, str] | None = None,
    refresh_seconds: float = 5.0,
    viewer_token: str | None = None,
    viewer_basic_auth: str | tuple[str, str] | None = None,
) -> Starlette:
    """The dashboard as an ASGI app for ``queues`` (names) on ``redis`` (a URL, a client,
    or None as for ``Queue``). With ``token`` and/or ``basic_auth`` ("user:password")
    every request needs credentials; without, it answers only to loopback host names.
    ``viewer_token`` and ``viewer_basic_auth`` let in viewers, who see everything and
    may act on nothing. Raises ConfigurationError for an unusable token, basic auth or
    queue list."""
    credentials = Credentials.of(token, basic_auth, viewer_token, viewer_basic_auth)
    if not 0.5 <= refresh_seconds <= 3600:
        raise ConfigurationError(
            f"refresh_seconds must be from 0.5 to 3600, got {refresh_seconds!r}"
        )
    sessions = Sessions()
    dashboard = Dashboard(
        queues,
        redis,
        shards=shards,
        settings=settings,
        credentials=credentials,
        sessions=sessions,
        refresh_seconds=refresh_seconds,
    )
    app = Starlette(
        routes=routes(dashboard),
        middleware=[Middleware(Guard, credentials, sessions, dashboard.unauthorized)],
        exception_handlers={HTTPException: dashboard.failed, DuetimeError: dashboard.failed},
        lifespan=dashboard.lifespan,
    )
    app.state.dashboard = dashboard
    return app
