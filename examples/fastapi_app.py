"""A FastAPI app that runs duetime's dispatcher and worker in its own process, on its own
event loop: they start with the app (its lifespan) and stop with it, gracefully.

Run it from the checkout (FastAPI and uvicorn are in duetime's `dev` extra, which
`make demo` installs; elsewhere `pip install duetime fastapi uvicorn`):

    .venv/bin/uvicorn examples.fastapi_app:app

then schedule a reminder two seconds from now, and look at it:

    curl -X POST localhost:8000/reminders -H 'content-type: application/json' \
         -d '{"to": "ada@example.com", "in_seconds": 2}'
    curl localhost:8000/reminders/<the id it printed>

With $DUETIME_REDIS_URL unset, duetime uses the embedded server (started off the event
loop on first use). Every uvicorn worker process (`--workers N`) runs a dispatcher and a
worker of its own, which is fine: dispatchers keep no state, and workers share the
queue. See docs/embedding.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypedDict

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

import duetime
from duetime.errors import InvalidInputError

QUEUE = "reminders"
# The daemons' default is to freeze, once started, every object made so far, so that
# the garbage collector skips them: right for `duetime worker`, wrong inside an app that
# goes on making and dropping objects of its own.
SETTINGS = duetime.Settings(freeze_startup_objects=False)

log = logging.getLogger(__name__)
tasks = duetime.App()


@tasks.task
async def send_reminder(data: dict[str, Any]) -> dict[str, Any]:
    # A real app sends the mail here. The return value is kept for an hour (result_ttl).
    return {"sent_to": data["to"], "attempt": duetime.current_task().attempt}


class Daemon(Protocol):
    async def run(self) -> None: ...
    def stop(self) -> None: ...


def _ended(task: asyncio.Task[None]) -> None:
    # A daemon ends on its own only when a loop of it kept failing: say so at once,
    # rather than let the app go on taking work that nothing runs.
    if not task.cancelled() and task.exception() is not None:
        log.critical("%s stopped: %s", task.get_name(), task.exception())


@asynccontextmanager
async def running(*daemons: Daemon) -> AsyncIterator[None]:
    """Run duetime daemons on this event loop for the body of the ``async with``; then
    stop them gracefully and wait for them to finish (a worker lets running tasks end
    and hands the others back)."""
    started = []
    for daemon in daemons:
        task = asyncio.create_task(daemon.run(), name=f"duetime {type(daemon).__name__}")
        task.add_done_callback(_ended)
        started.append(task)
    try:
        yield
    finally:
        for daemon in daemons:
            daemon.stop()
        await asyncio.gather(*started, return_exceptions=True)


class State(TypedDict):
    queue: duetime.AsyncQueue


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[State]:
    # No URL given: $DUETIME_REDIS_URL, else the embedded server.
    async with duetime.AsyncQueue(QUEUE, settings=SETTINGS) as queue:
        dispatcher = duetime.Dispatcher(QUEUE, settings=SETTINGS)
        worker = duetime.Worker(tasks, QUEUE, concurrency=10, settings=SETTINGS)
        async with running(dispatcher, worker):
            yield {"queue": queue}  # request.state.queue in the routes


app = FastAPI(title="reminders", lifespan=lifespan)


@app.exception_handler(InvalidInputError)
async def refused(request: Request, error: InvalidInputError) -> JSONResponse:
    # duetime checks every input before it writes anything; its message says what to fix.
    return JSONResponse({"detail": str(error)}, status_code=422)


class Reminder(BaseModel):
    to: str = Field(min_length=1, max_length=200)
    in_seconds: float = Field(default=0, ge=0)


@app.post("/reminders", status_code=201)
async def schedule_reminder(reminder: Reminder, request: Request) -> dict[str, str]:
    queue: duetime.AsyncQueue = request.state.queue
    task_id = await queue.schedule_in(
        reminder.in_seconds, {"to": reminder.to}, task=send_reminder, result_ttl=3600
    )
    return {"id": task_id}


@app.get("/reminders/{task_id}")
async def show_reminder(task_id: str, request: Request) -> dict[str, Any]:
    queue: duetime.AsyncQueue = request.state.queue
    status = await queue.status(task_id)
    if status is None:
        raise HTTPException(404, f"no reminder {task_id!r} (or its result has expired)")
    return {"id": task_id, "state": str(status.state), "result": status.result}
