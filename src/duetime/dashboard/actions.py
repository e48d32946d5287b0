"""The dashboard's actions: POST routes that change a queue through the public
``AsyncQueue`` API (pause, resume, run now, cancel, requeue or delete dead tasks, pause,
resume or trigger cron jobs, change the flow control limits).

An action is POST only (a GET on one is a 405), carries the session's CSRF token, and
answers with a redirect back to a page and a one-shot notice (post/redirect/get, so a
reload never repeats an action).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from duetime import AsyncQueue, KeyLimits, Limits, validation
from duetime.dashboard import views
from duetime.dashboard.flow_view import queue_wide
from duetime.dashboard.formatting import rate_shown
from duetime.dashboard.inputs import (
    dead_filter,
    form_text,
    key_limits,
    limit_key_field,
    local_path,
    queue_limits,
)
from duetime.dashboard.security import verified_form
from duetime.dashboard.site import Dashboard, Notice
from duetime.errors import DecodeError, InvalidInputError, TaskNotFoundError, TaskStateError
from duetime.validation import shown

#: Why a queue form is refused when the limits it was shown have changed since.
STALE_LIMITS = (
    "Nothing changed: the queue's limits changed after this page was loaded (from another "
    "dashboard, a command or the program's own set_limits). Look at them again and resend."
)


class Actions:
    """Each action of the dashboard, answered with what ``site`` shares."""

    def __init__(self, site: Dashboard) -> None:
        self.site = site

    async def _act(
        self,
        request: Request,
        default_back: str,
        action: Callable[[AsyncQueue, FormData], Awaitable[Notice]],
    ) -> Response:
        """Check the form, run ``action``, and go back with its notice (or its error)."""
        _, queue = self.site.queue(request)
        form = await verified_form(request, self.site.sessions)
        back = local_path(form_text(form, "back"), default_back)
        try:
            notice = await action(queue, form)
        except (InvalidInputError, TaskNotFoundError, TaskStateError) as error:
            notice = Notice(str(error), "error")
        except DecodeError as error:
            notice = Notice(f"Cannot read what Redis holds: {error}", "error")
        return self.site.redirect(request, back, notice)

    def _task_id(self, form: FormData) -> str:
        return validation.task_id(form_text(form, "id"))

    async def pause_queue(self, request: Request) -> Response:
        async def pause(queue: AsyncQueue, form: FormData) -> Notice:
            changed = await queue.pause()
            if changed:
                return Notice(f"Paused {queue.name}: workers claim nothing until it is resumed.")
            return Notice(f"{queue.name} was already paused.")

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

        return await self._act(request, f"/q/{self.site.queue(request)[0]}/tasks", run)

    async def cancel(self, request: Request) -> Response:
        async def cancel(queue: AsyncQueue, form: FormData) -> Notice:
            task_id = self._task_id(form)
            if not await queue.cancel(task_id):
                return Notice(f"Task {task_id} is gone: nothing cancelled.", "error")
            after = await queue.status(task_id)
            if after is not None and after.cancel_asked_at is not None:
                return Notice(f"Task {task_id} is running: its worker was asked to stop it.")
            return Notice(f"Cancelled task {task_id}.")

        return await self._act(request, f"/q/{self.site.queue(request)[0]}/tasks", cancel)

    async def dead_action(self, request: Request) -> Response:
        """Requeue or delete one dead task (a row's button) or the checked ones."""

        async def act(queue: AsyncQueue, form: FormData) -> Notice:
            for action in ("requeue", "delete"):
                one = form_text(form, f"{action}_one")
                if one:
                    return _dead_notice(action, await views.act_on_dead(queue, action, [one]))
            action = form_text(form, "selected")
            if action not in ("requeue", "delete"):
                return Notice("Choose requeue or delete.", "error")
            ids = [value for value in form.getlist("ids") if isinstance(value, str) and value]
            if not ids:
                return Notice("No task selected: tick the boxes of the tasks first.", "error")
            return _dead_notice(action, await views.act_on_dead(queue, action, ids))

        return await self._act(request, f"/q/{self.site.queue(request)[0]}/dead", act)

    async def dead_matching(self, request: Request) -> Response:
        """Requeue or delete every dead task a filter matches (after dead_confirm)."""

        async def act(queue: AsyncQueue, form: FormData) -> Notice:
            action = form_text(form, "action")
            if action not in ("requeue", "delete"):
                return Notice("Choose requeue or delete.", "error")
            chosen, _, error = dead_filter(form)
            if error is not None:
                return Notice(error, "error")
            if chosen.selects_everything:
                return _dead_notice(action, await views.act_on_dead(queue, action, None))
            picked = await views.dead_ids(queue, chosen)
            return _dead_notice(action, await views.act_on_dead(queue, action, picked.ids))

        return await self._act(request, f"/q/{self.site.queue(request)[0]}/dead", act)

    async def cron_pause(self, request: Request) -> Response:
        said = ("Paused cron job {}.", "Cron job {} was paused already.")
        return await self._cron_switch(request, AsyncQueue.pause_cron, said)

    async def cron_resume(self, request: Request) -> Response:
        said = ("Resumed cron job {} from its next tick.", "Cron job {} was not paused.")
        return await self._cron_switch(request, AsyncQueue.resume_cron, said)

    async def _cron_switch(
        self,
        request: Request,
        switch: Callable[[AsyncQueue, str], Awaitable[bool]],
        said: tuple[str, str],
    ) -> Response:
        """Pause or resume the cron job the form names (``said``: the notice when that
        changed it, and when it was so already)."""

        async def act(queue: AsyncQueue, form: FormData) -> Notice:
            name = form_text(form, "name")
            changed = await switch(queue, name)
            return Notice((said[0] if changed else said[1]).format(name))

        return await self._act(request, f"/q/{self.site.queue(request)[0]}/cron", act)

    async def cron_trigger(self, request: Request) -> Response:
        """Run a cron job's task with its data now, as a task of its own (its ticks go on)."""

        async def trigger(queue: AsyncQueue, form: FormData) -> Notice:
            name = form_text(form, "name")
            job = await queue.cron_info(name, upcoming=1)
            if job is None:
                return Notice(f"No cron job {name!r} in {queue.name}.", "error")
            if job.problem is not None:
                return Notice(f"Cron job {name} cannot be used here: {job.problem}", "error")
            task_id = await queue.trigger_cron(name)
            return Notice(
                f"Triggered {name}: task {task_id} is due now.",
                link=f"/q/{queue.name}/task?id={task_id}",
            )

        return await self._act(request, f"/q/{self.site.queue(request)[0]}/cron", trigger)

    async def set_queue_limits(self, request: Request) -> Response:
        """Set the queue-wide limits (cap, rate, each key's); named keys keep their own.
        Refused when the queue's limits are no longer those the form was shown with."""

        async def act(queue: AsyncQueue, form: FormData) -> Notice:
            current = await queue.limits()
            if form_text(form, "seen") != queue_wide(current):
                return Notice(STALE_LIMITS, "error")
            try:
                limits = queue_limits(form, current.keys if current is not None else {})
            except InvalidInputError as error:
                return Notice(f"Nothing changed: {error}", "error")
            await queue.set_queue_limits(limits)  # named keys' own limits are kept as they are
            return Notice(f"The limits of {queue.name} are now: {_queue_described(limits)}.")

        return await self._act(request, f"/q/{self.site.queue(request)[0]}/flow", act)

    async def set_key_limits(self, request: Request) -> Response:
        """Set one limit key's own limits, or clear them (then each key's apply)."""

        async def act(queue: AsyncQueue, form: FormData) -> Notice:
            clearing = form_text(form, "do") == "clear"
            try:
                key, limits = (limit_key_field(form), KeyLimits()) if clearing else key_limits(form)
            except InvalidInputError as error:
                return Notice(f"Nothing changed: {error}", "error")
            if limits == KeyLimits():
                await queue.set_key_limits(key, None)
                return Notice(
                    f"Limit key {shown(key, 60)} has no limits of its own now: each key's apply."
                )
            await queue.set_key_limits(key, limits)
            return Notice(f"Limit key {shown(key, 60)} now has {_described(limits)}.")

        return await self._act(request, f"/q/{self.site.queue(request)[0]}/flow", act)


def _described(limits: KeyLimits) -> str:
    concurrency = "none" if limits.concurrency is None else f"{limits.concurrency:,}"
    return f"concurrency {concurrency}, rate {rate_shown(limits.rate)}"


def _queue_described(limits: Limits) -> str:
    cap = "none" if limits.cap is None else f"{limits.cap:,}"
    each = _described(limits.each_key)
    return f"cap {cap}, rate {rate_shown(limits.rate)}; each key: {each}"


def _dead_notice(action: str, count: int) -> Notice:
    verb = "Requeued" if action == "requeue" else "Deleted"
    plural = "" if count == 1 else "s"
    if count == 0:
        return Notice(f"{verb} nothing: no such dead task (any more).", "error")
    return Notice(f"{verb} {count:,} dead task{plural}.")
