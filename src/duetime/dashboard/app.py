"""The dashboard's Starlette application: its routes, the pages they render and the
actions they take, each through the public ``AsyncQueue`` API.

Pages are GET and never change anything; actions are POST only (a GET on one is a 405),
carry the session's CSRF token, and answer with a redirect back to a page and a one-shot
notice (post/redirect/get, so a reload never repeats an action). A page asked for with
the header ``X-Duetime-Fragment: live`` answers with only its ``live`` block, which the
page's script swaps in every few seconds.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from duetime import AsyncQueue, __version__, validation
from duetime.client import DeadFilter
from duetime.dashboard import views
from duetime.dashboard.formatting import FILTERS, relative
from duetime.dashboard.security import (
    Credentials,
    Guard,
    Sessions,
    session_of,
    set_session_cookie,
    verified_form,
)
from duetime.errors import (
    ConfigurationError,
    DecodeError,
    DuetimeError,
    InvalidInputError,
    RedisUnavailableError,
    TaskNotFoundError,
    TaskStateError,
)
from duetime.settings import DEFAULT_SETTINGS, Settings
from duetime.states import TaskState
from duetime.store.connections import mask_urls_in
from duetime.store.runner import RedisSpec
from duetime.times import parse_moment

HERE = Path(__file__).parent
NOTICE_COOKIE = "duetime_notice"
FRAGMENT_HEADER = "x-duetime-fragment"

DEAD_FILTER_FIELDS = ("task", "error", "since", "until")


@dataclass(frozen=True, slots=True)
class Notice:
    """The one-shot message shown after an action."""

    text: str
    kind: str = "ok"  # ok | error
    link: str | None = None  # a local path to follow up (e.g. the task just made)


def local_path(candidate: str | None, default: str) -> str:
    """``candidate`` if it is a path on this site, else ``default`` (no open redirect)."""
    if (
        candidate
        and candidate.startswith("/")
        and not candidate.startswith("//")
        and "\\" not in candidate
        and not any(ord(c) < 32 for c in candidate)
    ):
        return candidate
    return default


def _text(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


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
            "authorized": bool(request.scope["state"].get("dashboard_authorized"))
            or not self.credentials.configured,
            "token_login": self.credentials.token is not None,
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
            NOTICE_COOKIE, self.sessions.sign_note(note), max_age=60, path="/",
            httponly=True, samesite="strict", secure=request.url.scheme == "https",
        )  # fmt: skip
        return response

    async def unauthorized(self, request: Request) -> Response:
        """The answer to a request without valid credentials: 401, with the sign-in form
        when a token is configured, or the basic-auth challenge."""
        if request.headers.get(FRAGMENT_HEADER):
            return PlainTextResponse("Sign-in needed.", status_code=401)
        if self.credentials.token is not None:
            asked = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return self.render(
                request, "login.html", {"next": local_path(asked, "/"), "error": None},
                status=401, headers={"www-authenticate": 'Bearer realm="duetime"'},
            )  # fmt: skip
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
        if request.headers.get(FRAGMENT_HEADER):
            return PlainTextResponse(message, status_code=status, headers=headers)
        return self.render(
            request, "error.html", {"status": status, "message": message}, status, headers
        )

    # --- pages ---------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        cards = await asyncio.gather(*(views.queue_card(q) for q in self.queues.values()))
        context = {"cards": cards, "page": "overview", "settings": self.settings}
        return self.render(request, "overview.html", context)

    async def timeline(self, request: Request) -> Response:
        name, queue = self.queue(request)
        window = views.WINDOWS.get(request.query_params.get("window", ""), views.WINDOWS["hour"])
        found = await views.timeline(queue, window, time.time())
        return self.render(
            request,
            "timeline.html",
            {"queue": name, "page": "timeline", "timeline": found, "windows": views.WINDOWS},
        )

    async def tasks(self, request: Request) -> Response:
        name, queue = self.queue(request)
        params = request.query_params
        state = params.get("state", "scheduled")
        error = None
        if state not in views.STATES:
            error, state = f"There is no state {state!r}: showing scheduled tasks.", "scheduled"
        query = views.TaskQuery(
            state=state,
            task=params.get("task", "").strip(),
            id_prefix=params.get("id", "").strip(),
            error=params.get("error", "").strip(),
            page=_page_number(params.get("page")),
        )
        found = await views.browse(queue, query)
        return self.render(
            request,
            "tasks.html",
            {
                "queue": name, "page": "tasks", "query": query, "found": found,
                "states": views.STATES, "page_size": views.PAGE_SIZE, "error": error,
                "scan_limit": views.SEARCH_SCAN,
            },
        )  # fmt: skip

    async def task(self, request: Request) -> Response:
        name, queue = self.queue(request)
        task_id = request.query_params.get("id", "").strip()
        try:
            validation.task_id(task_id)
        except InvalidInputError as error:
            raise HTTPException(400, f"Not a task id: {error}") from None
        status = await queue.status(task_id)
        if status is None:
            raise HTTPException(
                404,
                f"Nothing is known of task {task_id!r} in {name}: it never existed, or it "
                "finished or was cancelled and kept no result (it was scheduled without "
                "result_ttl, or its result expired).",
            )
        entry = None
        heartbeat = None
        if status.state == TaskState.RUNNING:
            entry = await views.running_entry(queue, task_id)
            if entry is not None and entry.worker is not None:
                heartbeat = (await queue.stats()).workers.get(entry.worker)
        return self.render(
            request,
            "task.html",
            {
                "queue": name, "page": "tasks", "status": status, "entry": entry,
                "heartbeat": heartbeat,
            },
        )  # fmt: skip

    async def running(self, request: Request) -> Response:
        name, queue = self.queue(request)
        found = await views.running(queue)
        return self.render(
            request,
            "running.html",
            {
                "queue": name, "page": "running", "found": found, "settings": self.settings,
                "scan_limit": views.RUNNING_SCAN,
            },
        )  # fmt: skip

    async def dead(self, request: Request) -> Response:
        name, queue = self.queue(request)
        chosen, fields, error = _dead_filter(request.query_params)
        page_number = _page_number(request.query_params.get("page"))
        found = None if error is not None else await views.dead_page(queue, chosen, page_number)
        return self.render(
            request,
            "dead.html",
            {
                "queue": name, "page": "dead", "found": found, "fields": fields,
                "error": error, "filtered": not chosen.selects_everything,
                "scan_limit": views.SEARCH_SCAN, "page_size": views.PAGE_SIZE,
                "page_number": page_number,
            },
        )  # fmt: skip

    async def dead_confirm(self, request: Request) -> Response:
        """What "requeue/delete all matching" would act on, and the button that does it."""
        name, queue = self.queue(request)
        action = request.query_params.get("action", "")
        if action not in ("requeue", "delete"):
            raise HTTPException(400, "The action must be requeue or delete.")
        chosen, fields, error = _dead_filter(request.query_params)
        if error is not None:
            raise HTTPException(400, error)
        picked = await views.dead_ids(queue, chosen)
        # Relative times ("2h") made absolute, so the action takes what was counted here.
        for key, moment in (("since", chosen.since), ("until", chosen.until)):
            if moment is not None:
                fields[key] = datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")
        return self.render(
            request,
            "dead_confirm.html",
            {
                "queue": name, "page": "dead", "action": action, "fields": fields,
                "picked": picked, "everything": chosen.selects_everything,
            },
        )  # fmt: skip

    async def cron(self, request: Request) -> Response:
        name, queue = self.queue(request)
        jobs = await queue.list_cron(upcoming=3)
        return self.render(request, "cron.html", {"queue": name, "page": "cron", "jobs": jobs})

    async def workers(self, request: Request) -> Response:
        rows = await views.workers(self.queues)
        return self.render(
            request,
            "workers.html",
            {"page": "workers", "rows": rows, "settings": self.settings},
        )

    # --- actions -------------------------------------------------------------------------

    async def _act(
        self,
        request: Request,
        default_back: str,
        action: Callable[[AsyncQueue, FormData], Awaitable[Notice]],
    ) -> Response:
        """Check the form, run ``action``, and go back with its notice (or its error)."""
        _, queue = self.queue(request)
        form = await verified_form(request, self.sessions)
        back = local_path(_text(form, "back"), default_back)
        try:
            notice = await action(queue, form)
        except (InvalidInputError, TaskNotFoundError, TaskStateError) as error:
            notice = Notice(str(error), "error")
        except DecodeError as error:
            notice = Notice(f"Cannot read what Redis holds: {error}", "error")
        return self.redirect(request, back, notice)

    def _task_id(self, form: FormData) -> str:
        return validation.task_id(_text(form, "id"))

    async def pause_queue(self, request: Request) -> Response:
        async def pause(queue: AsyncQueue, form: FormData) -> Notice:
            changed = await queue.pause()
            return Notice(f"Paused {queue.name}: workers claim nothing until it is resumed."
                          if changed else f"{queue.name} was already paused.")  # fmt: skip

        return await self._act(request, "/", pause)

    async def resume_queue(self, request: Request) -> Response:
        async def resume(queue: AsyncQueue, form: FormData) -> Notice:
            changed = await queue.resume()
            return Notice(f"Resumed {queue.name}." if changed else f"{queue.name} was not paused.")

        return await self._act(request, "/", resume)

    async def run_now(self, request: Request) -> Response:
        async def run(queue: AsyncQueue, form: FormData) -> Notice:
            task_id = self._task_id(form)
            await queue.run_now(task_id)
            return Notice(f"Task {task_id} is due now.")

        return await self._act(request, f"/q/{self.queue(request)[0]}/tasks", run)

    async def cancel(self, request: Request) -> Response:
        async def cancel(queue: AsyncQueue, form: FormData) -> Notice:
            task_id = self._task_id(form)
            if await queue.cancel(task_id):
                return Notice(f"Cancelled task {task_id}.")
            return Notice(f"Task {task_id} was no longer waiting: nothing cancelled.", "error")

        return await self._act(request, f"/q/{self.queue(request)[0]}/tasks", cancel)

    async def dead_action(self, request: Request) -> Response:
        """Requeue or delete one dead task (a row's button) or the checked ones."""

        async def act(queue: AsyncQueue, form: FormData) -> Notice:
            for action in ("requeue", "delete"):
                one = _text(form, f"{action}_one")
                if one:
                    return _dead_notice(action, await views.act_on_dead(queue, action, [one]))
            action = _text(form, "selected")
            if action not in ("requeue", "delete"):
                return Notice("Choose requeue or delete.", "error")
            ids = [value for value in form.getlist("ids") if isinstance(value, str) and value]
            if not ids:
                return Notice("No task selected: tick the boxes of the tasks first.", "error")
            return _dead_notice(action, await views.act_on_dead(queue, action, ids))

        return await self._act(request, f"/q/{self.queue(request)[0]}/dead", act)

    async def dead_matching(self, request: Request) -> Response:
        """Requeue or delete every dead task a filter matches (after dead_confirm)."""

        async def act(queue: AsyncQueue, form: FormData) -> Notice:
            action = _text(form, "action")
            if action not in ("requeue", "delete"):
                return Notice("Choose requeue or delete.", "error")
            chosen, _, error = _dead_filter(form)
            if error is not None:
                return Notice(error, "error")
            if chosen.selects_everything:
                return _dead_notice(action, await views.act_on_dead(queue, action, None))
            picked = await views.dead_ids(queue, chosen)
            return _dead_notice(action, await views.act_on_dead(queue, action, picked.ids))

        return await self._act(request, f"/q/{self.queue(request)[0]}/dead", act)

    async def cron_pause(self, request: Request) -> Response:
        return await self._cron_switch(request, AsyncQueue.pause_cron, "Paused cron job {}.")

    async def cron_resume(self, request: Request) -> Response:
        said = "Resumed cron job {} from its next tick."
        return await self._cron_switch(request, AsyncQueue.resume_cron, said)

    async def _cron_switch(
        self,
        request: Request,
        switch: Callable[[AsyncQueue, str], Awaitable[object]],
        said: str,
    ) -> Response:
        """Pause or resume the cron job the form names."""

        async def act(queue: AsyncQueue, form: FormData) -> Notice:
            name = _text(form, "name")
            await switch(queue, name)
            return Notice(said.format(name))

        return await self._act(request, f"/q/{self.queue(request)[0]}/cron", act)

    async def cron_trigger(self, request: Request) -> Response:
        """Run a cron job's task with its data now, as a task of its own (its ticks go on)."""

        async def trigger(queue: AsyncQueue, form: FormData) -> Notice:
            name = _text(form, "name")
            job = await views.cron_job(queue, name)
            if job is None:
                return Notice(f"No cron job {name!r} in {queue.name}.", "error")
            if job.problem is not None:
                return Notice(f"Cron job {name} cannot be used here: {job.problem}", "error")
            task_id = await queue.trigger_cron(name)
            return Notice(
                f"Triggered {name}: task {task_id} is due now.",
                link=f"/q/{queue.name}/task?id={task_id}",
            )

        return await self._act(request, f"/q/{self.queue(request)[0]}/cron", trigger)

    # --- signing in ----------------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        next_page = local_path(request.query_params.get("next"), "/")
        if self.credentials.token is None:
            return RedirectResponse(next_page, status_code=303)
        if request.method == "GET":
            return self.render(request, "login.html", {"next": next_page, "error": None})
        form = await verified_form(request, self.sessions)
        next_page = local_path(_text(form, "next"), "/")
        if not self.credentials.token_matches(_text(form, "token")):
            return self.render(
                request, "login.html", {"next": next_page, "error": "That token is not right."},
                status=401,
            )  # fmt: skip
        response = RedirectResponse(next_page, status_code=303)
        # A new session on sign-in: a nonce planted before it is worth nothing after.
        set_session_cookie(response, request, self.sessions.issue(authenticated=True))
        return response

    async def logout(self, request: Request) -> Response:
        await verified_form(request, self.sessions)
        response = RedirectResponse("/login", status_code=303)
        set_session_cookie(response, request, self.sessions.issue(authenticated=False))
        return response

    # --- the application -----------------------------------------------------------------

    def routes(self) -> list[BaseRoute]:
        q = "/q/{queue}"
        return [
            Route("/", self.overview),
            Route("/workers", self.workers),
            Route(f"{q}/timeline", self.timeline),
            Route(f"{q}/tasks", self.tasks),
            Route(f"{q}/task", self.task),
            Route(f"{q}/running", self.running),
            Route(f"{q}/dead", self.dead),
            Route(f"{q}/dead/confirm", self.dead_confirm),
            Route(f"{q}/cron", self.cron),
            Route(f"{q}/pause", self.pause_queue, methods=["POST"]),
            Route(f"{q}/resume", self.resume_queue, methods=["POST"]),
            Route(f"{q}/task/run-now", self.run_now, methods=["POST"]),
            Route(f"{q}/task/cancel", self.cancel, methods=["POST"]),
            Route(f"{q}/dead", self.dead_action, methods=["POST"]),
            Route(f"{q}/dead/matching", self.dead_matching, methods=["POST"]),
            Route(f"{q}/cron/pause", self.cron_pause, methods=["POST"]),
            Route(f"{q}/cron/resume", self.cron_resume, methods=["POST"]),
            Route(f"{q}/cron/trigger", self.cron_trigger, methods=["POST"]),
            Route("/login", self.login, methods=["GET", "POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]


def _page_number(text: str | None) -> int:
    try:
        return max(0, min(int(text or 0), 10_000))
    except ValueError:
        return 0


def _dead_notice(action: str, count: int) -> Notice:
    verb = "Requeued" if action == "requeue" else "Deleted"
    plural = "" if count == 1 else "s"
    if count == 0:
        return Notice(f"{verb} nothing: no such dead task (any more).", "error")
    return Notice(f"{verb} {count:,} dead task{plural}.")


def _dead_filter(params: Any) -> tuple[DeadFilter, dict[str, str], str | None]:
    """The dead-task filter of a query string or form (task, error, since, until), the
    fields as typed (to show them again), and what is wrong with them, if anything."""
    fields = {key: str(params.get(key) or "").strip() for key in DEAD_FILTER_FIELDS}
    now = time.time()
    try:
        since = parse_moment(fields["since"], now) if fields["since"] else None
        until = parse_moment(fields["until"], now) if fields["until"] else None
        chosen = DeadFilter(
            task=fields["task"] or None, error=fields["error"] or None, since=since, until=until
        )
    except InvalidInputError as error:
        return DeadFilter(), fields, str(error)
    return chosen, fields, None


def create_app(
    queues: Sequence[str],
    redis: RedisSpec = None,
    *,
    shards: int = 1,
    settings: Settings = DEFAULT_SETTINGS,
    token: str | None = None,
    basic_auth: str | tuple[str, str] | None = None,
    refresh_seconds: float = 5.0,
) -> Starlette:
    """The dashboard as an ASGI app for ``queues`` (names) on ``redis`` (a URL, a client,
    or None as for ``Queue``). With ``token`` and/or ``basic_auth`` ("user:password")
    every request needs credentials; without, it answers only to loopback host names.
    Raises ConfigurationError for an unusable token, basic auth or queue list."""
    credentials = Credentials.of(token, basic_auth)
    if not 0.5 <= refresh_seconds <= 3600:
        raise ConfigurationError(
            f"refresh_seconds must be from 0.5 to 3600, got {refresh_seconds!r}"
        )
    sessions = Sessions()
    dashboard = Dashboard(
        queues, redis, shards=shards, settings=settings, credentials=credentials,
        sessions=sessions, refresh_seconds=refresh_seconds,
    )  # fmt: skip
    app = Starlette(
        routes=dashboard.routes(),
        middleware=[Middleware(Guard, credentials, sessions, dashboard.unauthorized)],
        exception_handlers={HTTPException: dashboard.failed, DuetimeError: dashboard.failed},
        lifespan=dashboard.lifespan,
    )
    app.state.dashboard = dashboard
    return app
