"""Back-off arithmetic (task retry delays, daemon reconnect pauses) and the logging of
an outage: once when it starts, once when it ends, never a line per retry."""

from __future__ import annotations

import logging
import random
import time


def retry_delay(attempt: int, base: float, cap: float) -> float:
    """Seconds before retrying after failed attempt ``attempt`` (1-based): exponential,
    capped, with jitter over the upper half so a burst of failures spreads out."""
    delay = min(cap, base * 2.0 ** min(attempt - 1, 62))
    return delay * random.uniform(0.5, 1.0)


class Backoff:
    """Reconnect pauses for a daemon loop: 0.05 s doubling up to ``cap``, reset on success."""

    def __init__(self, cap: float = 5.0) -> None:
        self._cap = cap
        self._failures = 0

    def next(self) -> float:
        self._failures += 1
        return retry_delay(self._failures, 0.05, self._cap)

    def reset(self) -> None:
        self._failures = 0


class Outage:
    """A stretch of failed calls of one loop, logged as a warning at the first failure
    and one line when a call succeeds again; the retries in between go to debug, so a
    long outage (or a demoted master answering READONLY) never floods the log."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self._what = what
        self._since: float | None = None
        self._failures = 0

    def failed(self, error: BaseException, pause: float) -> None:
        self._failures += 1
        if self._since is None:
            self._since = time.monotonic()
            self._log.warning(
                "%s: %s; retrying (every %.2fs at first, backing off)", self._what, error, pause
            )
        else:
            self._log.debug("%s: still failing (%s); retrying in %.2fs", self._what, error, pause)

    def succeeded(self) -> None:
        if self._since is not None:
            self._log.warning(
                "%s: working again after %.1fs (%d failed attempt(s))",
                self._what, time.monotonic() - self._since, self._failures,
            )  # fmt: skip
            self._since = None
            self._failures = 0
