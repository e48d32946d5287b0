"""``LoopRunner``: the synchronous face of an ``AsyncRunner`` whose event loop runs in
another thread. Each plan is handed to that loop and waited for, so it travels on the
asyncio runner's connections: a worker lends its own connection this way to the
plain-function handlers it runs on its threads (``current_task().queue``), and opens
none for them.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from duetime.errors import QueueNotLentError
from duetime.store.plans.requests import Plan
from duetime.store.redis.runner import AsyncRunner

T = TypeVar("T")

#: Why a plan is refused once the worker is gone.
STOPPED = "the worker that lent this queue has stopped; open a Queue of your own"


class LoopRunner:
    """Runs plans, from any thread but the loop's own, on ``runner`` on ``loop``. It
    owns neither: ``close()`` only refuses later plans (the worker has stopped)."""

    def __init__(self, runner: AsyncRunner, loop: asyncio.AbstractEventLoop) -> None:
        self._runner = runner
        self._loop = loop
        self._closed = False

    def run(self, plan: Plan[T]) -> T:
        if self._closed:
            raise QueueNotLentError(STOPPED)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            # Waiting here for the loop would stop the loop that has to do the work.
            raise QueueNotLentError(
                "a synchronous Queue was called on the worker's own event loop, which it "
                "would block for good; an async handler gets an AsyncQueue: await it"
            )
        coroutine = self._runner.run(plan)
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        except RuntimeError:  # the loop is closed
            coroutine.close()
            raise QueueNotLentError(STOPPED) from None
        return future.result()

    def close(self) -> None:
        self._closed = True
