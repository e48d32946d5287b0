"""The cron ticks a dispatcher handled, by job and outcome, for metrics: bounded in
jobs, so that a queue of a million jobs (one per user) gives metrics a bounded number of
series and the dispatcher a bounded table."""

from __future__ import annotations

#: Jobs tallied under their own name: the first ones seen. The ticks of any more are
#: tallied together under ``OTHER_JOBS``.
JOBS_NAMED = 1000
OTHER_JOBS = "(other jobs)"


class TickTally:
    """Ticks by (cron job, outcome): fired, skipped, delayed, missed, outside_window,
    backfilled. Only this process's; written by the dispatcher's loop, never reset."""

    def __init__(self) -> None:
        #: Read by metrics from another thread (copied, which is atomic).
        self.counts: dict[tuple[str, str], int] = {}
        self._named: set[str] = set()

    def add(self, job: str, outcome: str, ticks: int = 1) -> None:
        if job not in self._named:
            if len(self._named) >= JOBS_NAMED:
                job = OTHER_JOBS
            else:
                self._named.add(job)
        key = (job, outcome)
        self.counts[key] = self.counts.get(key, 0) + ticks
