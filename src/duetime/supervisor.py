"""Supervision of the daemons' long-running loops.

Every loop of a worker (claimer, acker, heartbeater) and of a dispatcher (one per
queue) runs under a ``Supervisor``. Expected trouble (Redis unreachable, a command
refused) is handled inside each loop with its own back-off; anything else is a bug or
a surprise, and must not end the loop silently: it is logged with its traceback,
counted, and the loop is started again after a back-off. A loop that keeps failing
(more than ``max_crashes`` within ``window`` seconds) cannot recover by itself: the
supervisor then gives up, the daemon shuts down (a worker stops claiming and
heartbeating) and ``run()`` raises ``DaemonFailedError``, so the process exits
non-zero and its own supervisor (systemd, Kubernetes, ...) starts a fresh one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from duetime.backoff import Backoff
from duetime.errors import DaemonFailedError

log = logging.getLogger("duetime.supervisor")

#: Seconds between cancellations of a task that has not ended yet (see ``cancel_and_wait``).
CANCEL_AGAIN = 0.05

#: Crashes of one loop within WINDOW seconds after which it is not restarted again.
MAX_CRASHES = 5
WINDOW = 60.0


class Supervisor:
    """Keeps the loops of one daemon running, and says when one cannot be."""

    def __init__(self, owner: str, *, max_crashes: int = MAX_CRASHES, window: float = WINDOW):
        self.owner = owner
        self.crashes = 0  # every unexpected exception caught, in any loop
        self.failure: DaemonFailedError | None = None
        self.failed = asyncio.Event()
        self._max_crashes = max_crashes
        self._window = window

    async def keep_running(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run ``loop`` until it returns (it does when its daemon stops), restarting it
        after unexpected exceptions. Cancellation passes through."""
        backoff = Backoff()
        recent: deque[float] = deque()
        while True:
            try:
                await loop()
                return
            except Exception as error:
                now = time.monotonic()
                if recent and now - recent[-1] > self._window:
                    backoff.reset()  # it ran well for a while: start the pauses over
                recent.append(now)
                while recent[0] < now - self._window:
                    recent.popleft()
                self.crashes += 1
                if len(recent) > self._max_crashes:
                    log.critical(
                        "%s: %s failed %d times within %.0fs; giving up",
                        self.owner, name, len(recent), self._window, exc_info=True,
                    )  # fmt: skip
                    self.give_up(
                        f"{name} failed {len(recent)} times within {self._window:.0f}s "
                        f"(last: {type(error).__name__}: {error})"
                    )
                    return
                pause = backoff.next()
                log.error(
                    "%s: %s failed unexpectedly; restarting it in %.2fs",
                    self.owner, name, pause, exc_info=True,
                )  # fmt: skip
                await asyncio.sleep(pause)

    def give_up(self, reason: str) -> None:
        if self.failure is None:
            self.failure = DaemonFailedError(f"{self.owner}: {reason}")
        self.failed.set()

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise self.failure

    def watch(self, task: asyncio.Task[object], what: str) -> None:
        """Log (and count) an unexpected exception that ends a one-off task, which
        would otherwise only be reported when the task is garbage collected."""

        def report(done: asyncio.Task[object]) -> None:
            if done.cancelled() or done.exception() is None:
                return
            self.crashes += 1
            log.error("%s: %s failed unexpectedly", self.owner, what, exc_info=done.exception())

        task.add_done_callback(report)


async def cancel_and_wait(task: asyncio.Task[Any], timeout: float) -> bool:
    """Cancel ``task`` and wait up to ``timeout`` seconds for it to end; True if it did.
    A cancellation can get lost inside the Redis client (Python 3.11's asyncio.wait_for,
    which redis-py sends commands with, drops one that arrives as its wait ends), and
    the task would then block in its next command for a whole block_timeout: so it is
    cancelled again every CANCEL_AGAIN seconds until it ends."""
    deadline = time.monotonic() + timeout
    while not task.done() and (remaining := deadline - time.monotonic()) > 0:
        task.cancel()
        await asyncio.wait([task], timeout=min(remaining, CANCEL_AGAIN))
    return task.done()
