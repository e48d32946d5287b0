"""The dashboard's Search page and its bulk actions, through the public ``AsyncQueue``
API: tasks found by id prefix, handler, error text and a field of their data in a
bounded walk (``SEARCH_BUDGET`` entries a view, and a link that goes on from there);
then run now, cancel or reschedule the tasks ticked that have not started (scheduled,
ready, or waiting under flow control), or every such task the search matches (after a
confirmation page that counts every match, those taken and those left alone, bounded
too); running ones, ticked or every running match, can be cancelled (their workers stop
them).

Each task is acted on in its own atomic step; the notice says what was done, what was
skipped (already running, dead, due or gone) and, for every match, what was not touched.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import Any
from urllib.parse import urlencode

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from duetime import AsyncQueue, BulkOutcome, TaskSearch, times
from duetime.client import select_matching_async
from duetime.client.matching import MatchSelection, states_for
from duetime.dashboard.inputs import form_text, local_path
from duetime.dashboard.security import verified_form
from duetime.dashboard.site import Dashboard, Notice
from duetime.errors import InvalidInputError, TaskStateError
from duetime.states import TaskState

#: Entries a search view asks the server to look at, and the matches it stops at.
SEARCH_BUDGET = 10_000
SEARCH_LIMIT = 200
#: Entries an "every match" confirmation or action looks at, at most: a request must
#: end in seconds, not minutes (``duetime bulk`` walks any number).
MATCHING_SCAN = 1_000_000
#: The criteria fields of the form, and the query string.
FIELDS = ("id", "task", "error", "field", "value", "key", "state")
ACTIONS = {"run_now": "Run now", "cancel": "Cancel", "reschedule": "Reschedule"}


@dataclass(frozen=True, slots=True)
class Asked:
    """The criteria as typed (to show them again and to link on), and what they mean."""

    fields: dict[str, str]
    criteria: TaskSearch | None  # None: nothing asked yet, or ``error`` says why not
    error: str | None = None

    @property
    def query(self) -> str:
        return urlencode({name: value for name, value in self.fields.items() if value})


def asked(params: Mapping[str, Any]) -> Asked:
    """The search a query string or form asks for."""
    fields = {name: str(params.get(name) or "").strip() for name in FIELDS}
    fields["value"] = str(params.get("value") or "")  # a value is matched exactly
    if not any(fields[name] for name in ("id", "task", "error", "field", "value", "key")):
        return Asked(fields, None)
    try:
        criteria = TaskSearch(
            id_prefix=fields["id"] or None,
            task=fields["task"] or None,
            error=fields["error"] or None,
            data_field=fields["field"] or None,
            data_value=fields["value"] or None,
            state=fields["state"] or None,
            limit_key=fields["key"] or None,
        )
    except InvalidInputError as error:
        return Asked(fields, None, str(error))
    return Asked(fields, criteria)


def new_run_at(text: str, now: float) -> float:
    """When a reschedule moves tasks to: a duration from now (``30m``, ``2h``) or a time
    with its zone (ISO 8601), or epoch seconds."""
    try:
        return now + times.parse_duration(text)
    except InvalidInputError:
        pass
    try:
        return times.parse_time(text)
    except InvalidInputError:
        raise InvalidInputError(
            f"reschedule to what? Give a delay from now (30m, 2h, 1d) or a time with its "
            f"zone (2026-12-01T09:00+01:00), not {text!r}"
        ) from None


async def act(
    queue: AsyncQueue,
    action: str,
    ids: list[str],
    run_at: float | None,
    stop_running: bool = True,
) -> BulkOutcome:
    """``action`` (run_now, cancel, or reschedule to ``run_at``) on ``ids``; a cancel
    asks the workers of running ones to stop them unless not ``stop_running``."""
    if action == "run_now":
        return await queue.run_now_many(ids)
    if action == "cancel":
        return await queue.cancel_many(ids, stop_running=stop_running)
    if action == "reschedule" and run_at is not None:
        return await queue.reschedule_many(ids, run_at)
    raise InvalidInputError("choose run now, cancel or reschedule")


def run_at_of(form: FormData) -> float | None:
    """The new run-at a reschedule form asks for (its ``to``); None for other actions."""
    if form_text(form, "action") != "reschedule":
        return None
    return new_run_at(form_text(form, "to"), time.time())


@dataclass(frozen=True, slots=True)
class Matching:
    """What an action on every match of a search takes: the search without its state
    (so that it finds every match, and the selection counts those it leaves alone), and
    the states chosen: the search's state, or every task that has not started."""

    asked: Asked
    states: tuple[str, ...]

    @property
    def stops_running(self) -> bool:
        return TaskState.RUNNING in self.states


def matching(action: str, params: Mapping[str, Any]) -> Matching:
    """The tasks an action on every match of the search ``params`` takes (a state that
    the action cannot take is refused with InvalidInputError)."""
    states = states_for(action, str(params.get("state") or "").strip() or None)
    return Matching(asked({name: params.get(name) for name in FIELDS if name != "state"}), states)


async def act_on_matches(
    queue: AsyncQueue, action: str, chosen: Matching, run_at: float | None
) -> tuple[MatchSelection, BulkOutcome]:
    """Select every match (up to ``MATCHING_SCAN`` entries) and act on those chosen:
    the selection and the outcome (``outcome.of_matches(selection, ...)`` says both)."""
    if chosen.asked.criteria is None:
        raise InvalidInputError(chosen.asked.error or "search by something first")
    picked = await select_matching_async(
        queue, chosen.asked.criteria, most_scanned=MATCHING_SCAN, states=chosen.states
    )
    return picked, await act(queue, action, picked.ids, run_at, chosen.stops_running)


def outcome_notice(
    outcome: BulkOutcome, picked: MatchSelection | None = None, link: str | None = None
) -> Notice:
    summary = outcome.summary if picked is None else outcome.of_matches(picked, UTC)
    return Notice(summary[0].upper() + summary[1:] + ".", "ok" if outcome.done else "error", link)


class SearchPages:
    """The Search page, its confirmation page and its two actions."""

    def __init__(self, site: Dashboard) -> None:
        self.site = site

    async def search(self, request: Request) -> Response:
        name, queue = self.site.queue(request)
        wanted = asked(request.query_params)
        page, seconds = None, None
        if wanted.criteria is not None:
            started = time.monotonic()
            cursor = request.query_params.get("cursor") or None
            try:
                page = await queue.search(
                    wanted.criteria, cursor=cursor, budget=SEARCH_BUDGET, limit=SEARCH_LIMIT
                )
            except InvalidInputError as error:
                wanted = Asked(wanted.fields, None, str(error))
            seconds = time.monotonic() - started
        context = {
            "queue": name,
            "page": "search",
            "asked": wanted,
            "found": page,
            "seconds": seconds,
            "further": request.query_params.get("cursor") is not None,
            "budget": SEARCH_BUDGET,
            "actions": ACTIONS,
            "search_url": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
        }
        return self.site.render(request, "search.html", context)

    async def confirm(self, request: Request) -> Response:
        """What acting on every match would take (those that have not started, or those
        in the search's state), what it leaves alone, and the button that does it."""
        name, queue = self.site.queue(request)
        action = request.query_params.get("action", "")
        if action not in ACTIONS:
            raise HTTPException(400, "The action must be run_now, cancel or reschedule.")
        try:
            chosen = matching(action, request.query_params)
        except InvalidInputError as error:
            raise HTTPException(400, str(error)) from None
        wanted = asked(request.query_params)
        if chosen.asked.criteria is None:
            raise HTTPException(400, chosen.asked.error or "Search by something first.")
        picked = await select_matching_async(
            queue, chosen.asked.criteria, most_scanned=MATCHING_SCAN, states=chosen.states
        )
        context = {
            "queue": name,
            "page": "search",
            "action": action,
            "asked": wanted,
            "picked": picked,
            "states": chosen.states,
            "actions": ACTIONS,
            "bound": MATCHING_SCAN,
            "to": request.query_params.get("to", ""),
        }
        return self.site.render(request, "search_confirm.html", context)

    async def act_on_selected(self, request: Request) -> Response:
        """The action a button of the results names, on the ids ticked."""
        name, queue = self.site.queue(request)
        form = await verified_form(request, self.site.sessions)
        back = local_path(form_text(form, "back"), f"/q/{name}/search")
        ids = [value for value in form.getlist("ids") if isinstance(value, str) and value]
        if not ids:
            notice = Notice("No task selected: tick the boxes of the tasks first.", "error")
            return self.site.redirect(request, back, notice)
        try:
            outcome = await act(queue, form_text(form, "action"), ids, run_at_of(form))
        except (InvalidInputError, TaskStateError) as error:
            return self.site.redirect(request, back, Notice(str(error), "error"))
        return self.site.redirect(request, back, outcome_notice(outcome))

    async def act_on_matching(self, request: Request) -> Response:
        """The action on every task the search matches that has not started (or in the
        search's state), after ``confirm``; the notice counts every match."""
        name, queue = self.site.queue(request)
        form = await verified_form(request, self.site.sessions)
        back = f"/q/{name}/search?{asked(form).query}"
        action = form_text(form, "action")
        try:
            chosen = matching(action, form)
            picked, outcome = await act_on_matches(queue, action, chosen, run_at_of(form))
        except (InvalidInputError, TaskStateError) as error:
            return self.site.redirect(request, back, Notice(str(error), "error"))
        return self.site.redirect(request, back, outcome_notice(outcome, picked))


def search_routes(site: Dashboard) -> list[BaseRoute]:
    """The routes of the Search page and its actions."""
    pages, q = SearchPages(site), "/q/{queue}"
    return [
        Route(f"{q}/search", pages.search),
        Route(f"{q}/search/confirm", pages.confirm),
        Route(f"{q}/search/act", pages.act_on_selected, methods=["POST"]),
        Route(f"{q}/search/matching", pages.act_on_matching, methods=["POST"]),
    ]
