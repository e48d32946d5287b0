"""The dispatcher daemon: promote due tasks, reap expired leases and dead workers, fire
cron ticks and keep each queue clean.

Stateless; run as many as you like: every move is one atomic script, so two
dispatchers never promote the same task twice.

``dispatcher`` holds the daemon and each queue's loop (sleep, wake, promote);
``recoverer`` reaps expired leases and silent workers; ``cron`` fires cron jobs;
``janitor`` does the housekeeping.
"""

from duetime.dispatcher.cron import CRON_BATCH, CRON_OVERLAP_RECHECK_MS, CronFirer, CronFiring
from duetime.dispatcher.dispatcher import (
    IDLE_ENOUGH,
    STOP_GRACE,
    TIMER_SLACK,
    Dispatcher,
    QueueDispatcher,
)
from duetime.dispatcher.janitor import Janitor
from duetime.dispatcher.recoverer import REAP_BATCH, Recoverer

__all__ = [
    "CRON_BATCH",
    "CRON_OVERLAP_RECHECK_MS",
    "IDLE_ENOUGH",
    "REAP_BATCH",
    "STOP_GRACE",
    "TIMER_SLACK",
    "CronFirer",
    "CronFiring",
    "Dispatcher",
    "Janitor",
    "QueueDispatcher",
    "Recoverer",
]
