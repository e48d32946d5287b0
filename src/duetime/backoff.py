"""Back-off arithmetic: task retry delays and daemon reconnect pauses."""

from __future__ import annotations

import random


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
