"""The JSON API's actions: POST routes under ``/api/q/<queue>/`` that do what the pages'
buttons do, through the public ``AsyncQueue`` API, each with a JSON body (``api``
checks it first, with the CSRF or bearer token) and a JSON answer; and the table of
every API route. docs/dashboard.md describes each body and answer."""

from __future__ import annotations

import time
from datetime import UTC
from typing import Any

from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from duetime import AsyncQueue, BulkOutcome, KeyLimits, validation
from duetime.client import in_batches_async
from duetime.dashboard import views
from duetime.dashboard.api import ApiReads, answer, json_errors
from duetime.dashboard.inputs import dead_filter, key_limits, limit_key_field, queue_limits
from duetime.dashboard.search_view import act, act_on_matches, matching, new_run_at
from duetime.dashboard.site import Dashboard
from duetime.errors import InvalidInputError
from duetime.times import parse_time


def _as_form(body: dict[str, Any], names: tuple[str, ...]) -> FormData:
    """The fields ``names`` of a JSON body as the pages' forms carry them (text), so
    that they are read and checked by the very same code."""
    fields: list[tuple[str, str | UploadFile]] = []
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise InvalidInputError(f"{name} must be text or a number, got {value!r}")
        fields.append((name, str(value)))
    return FormData(fields)


def _ids(body: dict[str, Any]) -> list[str]:
    ids = body.get("ids")
    if not isinstance(ids, list) or not ids:
        raise InvalidInputError('give "ids": a list of task ids, or "search"')
    return validation.task_ids(ids)


class ApiActions(ApiReads):
    """The POST routes of the API (and, by inheritance, its GET routes)."""

    async def pause(self, request: Request) -> Response:
        queue = self.queue(request)[1]
        await self.body(request)
        return answer({"changed": await queue.pause()})

    async def resume(self, request: Request) -> Response:
        queue = self.queue(request)[1]
        await self.body(request)
        return answer({"changed": await queue.resume()})

    async def run_now(self, request: Request) -> Response:
        return await self._bulk(request, "run_now")

    async def cancel(self, request: Request) -> Response:
        return await self._bulk(request, "cancel")

    async def reschedule(self, request: Request) -> Response:
        return await self._bulk(request, "reschedule")

    async def _bulk(self, request: Request, action: str) -> Response:
        """A bulk action on the body's ``ids``, or on every task its ``search`` (the
        Search page's fields) matches that has not started (scheduled, ready, or waiting
        under flow control; the search's ``state`` narrows it, and a cancel's ``"state":
        "running"`` takes the running ones), walked up to MATCHING_SCAN. The answer counts
        every match: ``matched``, ``selected``, ``not_touched`` by state."""
        queue = self.queue(request)[1]
        body = await self.body(request)
        run_at = self._run_at(body) if action == "reschedule" else None
        if "search" not in body:
            outcome = await act(queue, action, _ids(body), run_at)
            return answer(_outcome(outcome, outcome.summary))
        search = body["search"] if isinstance(body["search"], dict) else {}
        picked, outcome = await act_on_matches(queue, action, matching(action, search), run_at)
        report: dict[str, Any] = {"matched": picked.matched, "selected": len(picked.ids)}
        report |= {"chosen": picked.chosen, "not_touched": picked.left_alone}
        report |= {"unnameable": picked.unnameable, "complete": picked.complete}
        return answer({**report, **_outcome(outcome, outcome.of_matches(picked, UTC))})

    @staticmethod
    def _run_at(body: dict[str, Any]) -> float:
        """The new run-at of a reschedule: ``at`` (epoch seconds, or ISO 8601 with a
        zone) or ``in`` (seconds from now, or a duration such as "2h")."""
        at, delay = body.get("at"), body.get("in")
        if (at is None) == (delay is None):
            raise InvalidInputError('give one of "at" (a time) or "in" (a delay from now)')
        if isinstance(at, int | float) and not isinstance(at, bool):
            return float(at)
        if isinstance(at, str):
            return parse_time(at)
        if isinstance(delay, int | float) and not isinstance(delay, bool) and delay >= 0:
            return time.time() + delay
        if isinstance(delay, str):
            return new_run_at(delay, time.time())
        raise InvalidInputError(
            f'"at" or "in" of the wrong kind: {at if delay is None else delay!r}'
        )

    async def requeue_dead(self, request: Request) -> Response:
        return await self._dead(request, "requeue")

    async def purge_dead(self, request: Request) -> Response:
        return await self._dead(request, "delete")

    async def _dead(self, request: Request, action: str) -> Response:
        """Dead tasks by ``ids``, by ``filter`` (task, error, since, until, as the Dead
        page reads them), or ``"all": true``."""
        queue = self.queue(request)[1]
        body = await self.body(request)
        name = "requeued" if action == "requeue" else "purged"
        if body.get("all") is True:
            return answer({name: await views.act_on_dead(queue, action, None)})
        if "filter" in body:
            given = body["filter"]
            chosen, _, error = dead_filter(given if isinstance(given, dict) else {})
            if error is not None:
                raise InvalidInputError(error)
            picked = await views.dead_ids(queue, chosen)
            done = await views.act_on_dead(queue, action, picked.ids)
            return answer({"selected": len(picked.ids), name: done})
        return answer({name: await in_batches_async(_ids(body), _dead_step(queue, action))})

    async def cron_pause(self, request: Request) -> Response:
        queue, name = await self._cron_name(request)
        return answer({"changed": await queue.pause_cron(name)})

    async def cron_resume(self, request: Request) -> Response:
        queue, name = await self._cron_name(request)
        return answer({"changed": await queue.resume_cron(name)})

    async def cron_trigger(self, request: Request) -> Response:
        queue, name = await self._cron_name(request)
        return answer({"task_id": await queue.trigger_cron(name)})

    async def _cron_name(self, request: Request) -> tuple[AsyncQueue, str]:
        queue = self.queue(request)[1]
        name = (await self.body(request)).get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInputError('give "name": the cron job\'s name')
        return queue, name

    async def set_queue_limits(self, request: Request) -> Response:
        """The queue-wide limits (fields as the Flow page's form); named keys keep
        theirs."""
        queue = self.queue(request)[1]
        names = ("cap", "rate", "burst", "each_concurrency", "each_rate", "each_burst")
        form = _as_form(await self.body(request), names)
        current = await queue.limits()
        limits = queue_limits(form, current.keys if current is not None else {})
        await queue.set_queue_limits(limits)
        return answer({"limits": await queue.limits()})

    async def set_key_limits(self, request: Request) -> Response:
        """One limit key's own limits (``key``, ``concurrency``, ``rate``, ``burst``),
        or none (``"clear": true``, or no limit given)."""
        queue = self.queue(request)[1]
        body = await self.body(request)
        form = _as_form(body, ("key", "concurrency", "rate", "burst"))
        if body.get("clear") is True:
            key, limits = limit_key_field(form), KeyLimits()
        else:
            key, limits = key_limits(form)
        await queue.set_key_limits(key, None if limits == KeyLimits() else limits)
        return answer({"key": key, "limits": await queue.limits()})


def _dead_step(queue: AsyncQueue, action: str) -> Any:
    return queue.requeue_dead if action == "requeue" else queue.purge_dead


def _outcome(outcome: BulkOutcome, summary: str) -> dict[str, Any]:
    return {
        "action": outcome.action,
        "done": outcome.done,
        "skipped": outcome.skipped,
        "run_at": outcome.run_at,
        "summary": summary,
    }


def api_routes(site: Dashboard) -> list[BaseRoute]:
    """Every route of the JSON API."""
    api, q = ApiActions(site), "/api/q/{queue}"
    reads = {
        "/api/session": api.session,
        "/api/queues": api.queues,
        "/api/workers": api.workers,
        f"{q}/stats": api.stats,
        f"{q}/throughput": api.throughput,
        f"{q}/tasks": api.tasks,
        f"{q}/task": api.task,
        f"{q}/dead": api.dead,
        f"{q}/flow": api.flow,
        f"{q}/cron": api.cron,
        f"{q}/search": api.search,
    }
    actions = {
        f"{q}/pause": api.pause,
        f"{q}/resume": api.resume,
        f"{q}/tasks/run-now": api.run_now,
        f"{q}/tasks/cancel": api.cancel,
        f"{q}/tasks/reschedule": api.reschedule,
        f"{q}/dead/requeue": api.requeue_dead,
        f"{q}/dead/purge": api.purge_dead,
        f"{q}/cron/pause": api.cron_pause,
        f"{q}/cron/resume": api.cron_resume,
        f"{q}/cron/trigger": api.cron_trigger,
        f"{q}/limits/queue": api.set_queue_limits,
        f"{q}/limits/key": api.set_key_limits,
    }
    return [
        *(Route(path, json_errors(endpoint)) for path, endpoint in reads.items()),
        *(
            Route(path, json_errors(endpoint), methods=["POST"])
            for path, endpoint in actions.items()
        ),
    ]
