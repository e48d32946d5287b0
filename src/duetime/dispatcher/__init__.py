"""The dispatcher daemon: promote due tasks, reap expired leases and dead workers, fire
cron ticks and keep each queue clean.

Stateless; run as many as you like: every move is one atomic script, so two
dispatchers never promote the same task twice. It never polls on a fixed interval:
after each promotion it sleeps on a local timer until the earliest of the next due
time, the next lease deadline and the moment the oldest worker heartbeat goes
stale, and a long-lived BLPOP on the queue's wake list cuts the sleep short when a
new earliest task is scheduled. (Server-side blocking timeouts tick at the server's
``hz``, 100 ms by default, too coarse for punctuality; the local timer is exact.)
Tasks are promoted ``promote_ahead`` (5 ms) before their run-at, with the run-at
noted beside them; the claiming worker waits for it on a precise timer, so the
promote and claim round trips happen before the task is due, not after.

Each queue's loop runs under a ``Supervisor``: an unexpected exception is logged and
the loop restarted; one that keeps failing stops the dispatcher with
``DaemonFailedError``. A cron definition this host cannot use is a poison record:
that job is paused and logged once, and every other job and queue goes on.

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
