"""What a handler can ask of the worker beyond succeeding or failing (``Snooze``), and
the worker's connection as it lends it to its handlers (``LentConnection``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from duetime import validation
from duetime.clock import Clock
from duetime.hooks import Hooks
from duetime.settings import Settings
from duetime.store.redis.bridge import LoopRunner
from duetime.store.redis.runner import AsyncRunner

#: The longest a handler may snooze its task: past that, schedule a new one.
LONGEST_SNOOZE_SECONDS = 30 * 24 * 3600


class Snooze(Exception):
    """Raise it from a handler to run the task again ``seconds`` from now without
    spending an attempt or recording an error: the remote side said "slow down" or
    "try again in N s". ``whole_key=True`` makes every task of the task's limit key
    wait as long (a Retry-After that applies to the whole API, say)."""

    def __init__(self, seconds: float, *, whole_key: bool = False) -> None:
        self.seconds = validation.positive_seconds(seconds, "a snooze") if seconds else 0.0
        if self.seconds > LONGEST_SNOOZE_SECONDS:
            raise ValueError(f"a snooze is at most 30 days, got {seconds}s; schedule a new task")
        self.whole_key = bool(whole_key)
        super().__init__(f"snoozed for {self.seconds:g}s" + (" (whole key)" if whole_key else ""))


class LentConnection:
    """The worker's connection as its handlers use it: its asyncio runner on its event
    loop for async handlers, ``bridge`` (the same runner, reached from other threads)
    for plain functions, and what a queue client on them must know of the queue. The
    worker makes one when it starts and closes it when it ends.

    The worker knows nothing of queue clients (the layers below ``duetime`` do not
    import each other): ``duetime.task_context`` makes the clients a handler gets, once
    per worker, and keeps them in ``clients``."""

    def __init__(
        self,
        queue: str,
        shards: int,
        settings: Settings,
        clock: Clock | None,
        hooks: Sequence[Hooks],
        runner: AsyncRunner,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.queue = queue
        self.shards = shards
        self.settings = settings
        self.clock = clock  # the worker's own when it was given one (a test's ManualClock)
        self.hooks = hooks
        self.runner = runner
        self.loop = loop
        self.bridge = LoopRunner(runner, loop)
        self.clients: Any = None  # (Queue, AsyncQueue), made on first use
        self.making = threading.Lock()  # handler threads may ask for them at once

    def close(self) -> None:
        """The worker has stopped: a plain function's queue refuses what comes later."""
        self.bridge.close()
