"""The dashboard's pages: GET routes that read a queue through the public ``AsyncQueue``
API and render a template; they never change anything."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from duetime import validation
from duetime.dashboard import views, workers_view
from duetime.dashboard.flow_view import read_flow
from duetime.dashboard.history_view import OUTCOMES, FinishedQuery, finished_page, task_attempts
from duetime.dashboard.inputs import dead_filter, page_number
from duetime.dashboard.site import Dashboard
from duetime.errors import InvalidInputError
from duetime.flow import KeyLimits, limit_key
from duetime.states import TaskState


class Pages:
    """Each page of the dashboard, rendered with what ``site`` shares."""

    def __init__(self, site: Dashboard) -> None:
        self.site = site

    async def overview(self, request: Request) -> Response:
        cards = await asyncio.gather(*(views.queue_card(q) for q in self.site.queues.values()))
        context = {
            "cards": cards,
            "page": "overview",
            "settings": self.site.settings,
            "worker_tally": workers_view.worker_tally,
        }
        return self.site.render(request, "overview.html", context)

    async def timeline(self, request: Request) -> Response:
        name, queue = self.site.queue(request)
        window = views.WINDOWS.get(request.query_params.get("window", ""), views.WINDOWS["hour"])
        found = await views.timeline(queue, window, time.time())
        return self.site.render(
            request,
            "timeline.html",
            {"queue": name, "page": "timeline", "timeline": found, "windows": views.WINDOWS},
        )

    async def tasks(self, request: Request) -> Response:
        name, queue = self.site.queue(request)
        params = request.query_params
        state = params.get("state", "scheduled")
        if state not in views.STATES:
            raise HTTPException(
                400,
                f"There is no state {validation.shown(state, 40)}: choose one of "
                f"{', '.join(views.STATES)}.",
            )
        query = views.TaskQuery(
            state=state,
            task=params.get("task", "").strip(),
            id_prefix=params.get("id", "").strip(),
            error=params.get("error", "").strip(),
            page=page_number(params.get("page")),
        )
        found = await views.browse(queue, query)
        context = {
            "queue": name,
            "page": "tasks",
            "query": query,
            "found": found,
            "states": views.STATES,
            "page_size": views.PAGE_SIZE,
            "error": None,
            "scan_limit": views.SEARCH_SCAN,
        }
        return self.site.render(request, "tasks.html", context)

    async def task(self, request: Request) -> Response:
        name, queue = self.site.queue(request)
        task_id = request.query_params.get("id", "").strip()
        try:
            validation.task_id(task_id)
        except InvalidInputError as error:
            raise HTTPException(400, f"Not a task id: {error}") from None
        status, (attempts, history_size) = await asyncio.gather(
            queue.status(task_id), task_attempts(queue, task_id)
        )
        if status is None and not attempts:
            raise HTTPException(
                404,
                f"Nothing is known of task {task_id!r} in {name}: it never existed, or it "
                "finished or was cancelled so long ago that the queue's history no longer "
                "holds it, and it kept no result (it was scheduled without result_ttl, or "
                "its result expired).",
            )
        entry = None
        heartbeat = None
        if status is not None and status.state == TaskState.RUNNING:
            entry = await views.running_entry(queue, task_id)
            if entry is not None and entry.worker is not None:
                heartbeat = (await queue.stats()).workers.get(entry.worker)
        context = {
            "queue": name,
            "page": "tasks",
            "task_id": task_id,
            "status": status,
            "entry": entry,
            "heartbeat": heartbeat,
            "attempts": attempts,
            "history_size": history_size,
        }
        return self.site.render(request, "task.html", context)

    async def finished(self, request: Request) -> Response:
        """The queue's history of finished attempts, newest first, by handler and outcome."""
        name, queue = self.site.queue(request)
        params = request.query_params
        query = FinishedQuery(
            task=params.get("task", "").strip(),
            outcome=params.get("outcome", "").strip(),
            page=page_number(params.get("page")),
        )
        found = await finished_page(queue, query)
        context = {
            "queue": name,
            "page": "finished",
            "query": query,
            "found": found,
            "outcomes": OUTCOMES,
            "shards": self.site.shards,
        }
        return self.site.render(request, "finished.html", context)

    async def running(self, request: Request) -> Response:
        name, queue = self.site.queue(request)
        found = await views.running(queue)
        context = {
            "queue": name,
            "page": "running",
            "found": found,
            "settings": self.site.settings,
            "scan_limit": views.RUNNING_SCAN,
        }
        return self.site.render(request, "running.html", context)

    async def flow(self, request: Request) -> Response:
        """The queue's flow control: its limits, what holds its due tasks per limit key,
        and the forms that change the limits (``?key=`` fills the key form in)."""
        name, queue = self.site.queue(request)
        found = await read_flow(queue)
        key = request.query_params.get("key", "")
        try:
            editing = (limit_key(key), found.limits.keys.get(key, KeyLimits()))
        except InvalidInputError:
            editing = ("", KeyLimits())
        context = {
            "queue": name,
            "page": "flow",
            "flow": found,
            "editing": editing,
            "shards": self.site.shards,
        }
        return self.site.render(request, "flow.html", context)

    async def dead(self, request: Request) -> Response:
        name, queue = self.site.queue(request)
        chosen, fields, error = dead_filter(request.query_params)
        number = page_number(request.query_params.get("page"))
        found = None if error is not None else await views.dead_page(queue, chosen, number)
        context = {
            "queue": name,
            "page": "dead",
            "found": found,
            "fields": fields,
            "error": error,
            "filtered": not chosen.selects_everything,
            "scan_limit": views.SEARCH_SCAN,
            "page_size": views.PAGE_SIZE,
            "page_number": number,
        }
        return self.site.render(request, "dead.html", context)

    async def dead_confirm(self, request: Request) -> Response:
        """What "requeue/delete all matching" would act on, and the button that does it."""
        name, queue = self.site.queue(request)
        action = request.query_params.get("action", "")
        if action not in ("requeue", "delete"):
            raise HTTPException(400, "The action must be requeue or delete.")
        chosen, fields, error = dead_filter(request.query_params)
        if error is not None:
            raise HTTPException(400, error)
        picked = await views.dead_ids(queue, chosen)
        # Relative times ("2h") made absolute, so the action takes what was counted here.
        for key, moment in (("since", chosen.since), ("until", chosen.until)):
            if moment is not None:
                fields[key] = datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")
        context = {
            "queue": name,
            "page": "dead",
            "action": action,
            "fields": fields,
            "picked": picked,
            "everything": chosen.selects_everything,
        }
        return self.site.render(request, "dead_confirm.html", context)

    async def cron(self, request: Request) -> Response:
        name, queue = self.site.queue(request)
        jobs = await queue.list_cron(upcoming=3)
        context = {"queue": name, "page": "cron", "jobs": jobs}
        return self.site.render(request, "cron.html", context)

    async def workers(self, request: Request) -> Response:
        found = await workers_view.workers(self.site.queues, self.site.settings, time.time())
        context = {
            "page": "workers",
            "rows": found.rows,
            "gone": found.gone,
            "settings": self.site.settings,
        }
        return self.site.render(request, "workers.html", context)
