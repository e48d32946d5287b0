"""The worker's one timer, which enforces the timeout of every running attempt."""

from __future__ import annotations

import asyncio
import time

from duetime.worker.state import Attempt


class TimeoutTimer:
    """Cancels the attempts whose handler ran past its timeout. An asyncio.timeout per
    attempt would cost a timer handle in the loop's heap per attempt; attempts of a task
    mostly share one timeout, so their deadlines arrive in the order they started, and
    the one timer rarely needs moving."""

    def __init__(self, held: dict[tuple[int, str], Attempt]) -> None:
        self._held = held
        self.handle: asyncio.TimerHandle | None = None
        self.at = 0.0  # monotonic time the timer fires at

    def arm(self, deadline: float) -> None:
        """Set the timer to fire at ``deadline`` (monotonic)."""
        if self.handle is not None:
            self.handle.cancel()
        self.at = deadline
        self.handle = asyncio.get_running_loop().call_later(
            max(0.0, deadline - time.monotonic()), self._enforce
        )

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()

    def _enforce(self) -> None:
        """Cancel the attempts whose handler ran past its timeout (each then fails with
        TaskTimeoutError), and set the timer for the next deadline."""
        self.handle = None
        now = time.monotonic()
        earliest = 0.0
        for attempt in self._held.values():
            deadline = attempt.deadline
            if not deadline or attempt.timed_out:
                continue
            if deadline <= now:
                attempt.timed_out = True
                if attempt.runner is not None:
                    attempt.runner.cancel()
            elif not earliest or deadline < earliest:
                earliest = deadline
        if earliest:
            self.arm(earliest)

    @staticmethod
    def timed_out(attempt: Attempt) -> bool:
        """Whether the cancellation being handled is the attempt's timeout alone: a stop
        or a lost lease may have cancelled the attempt too, and then wins (as with
        asyncio.timeout, which this timer replaces)."""
        if not attempt.timed_out or attempt.runner is None:
            return False
        return attempt.runner.uncancel() == 0
