"""The worker daemon: claim, run under a lease, renew, ack / retry / dead-letter.

One asyncio loop per process runs four small parts of one worker (``worker.py`` starts
them, and stops them in the order its ``Worker`` gives):
- the claimer (``claimer.py``) takes ids with BLMOVE from ``ready`` into the worker's
  own processing list and leases them (a backlog is claimed in batches by one script
  call);
- each claimed attempt (``attempt.py``) runs its handler, async ones on the loop, plain
  functions on the worker's own threads (see ``ThreadRunner`` in ``threads.py``), under
  the task's timeout (one timer for the whole worker, see ``TimeoutTimer`` in
  ``timeouts.py``);
- the acker (``reporter.py``) sends finished attempts in batches (one script call per
  batch);
- the heartbeater (``heartbeater.py``) proves the worker alive, renews the leases of
  running attempts, learns which attempts were fenced, and finds ids whose BLMOVE reply
  was lost.
They share one ``SharedState`` (``state.py``). Each loop runs under a ``Supervisor``:
an unexpected exception is logged, counted and the loop restarted; a loop that keeps
failing shuts the worker down, and ``run()`` raises ``DaemonFailedError``. A handler's
own exceptions, ``SystemExit`` and ``KeyboardInterrupt`` included, are the attempt's
failure, never the worker's.

Shutdown (``stop``): stop claiming, let running attempts finish within the grace
period, ack what finished, hand back the rest atomically and deregister.
``stop(now=True)`` (or a second ``stop()``) skips the grace period: running attempts
are abandoned at once, finished ones still acked, and the rest handed back, within
about a second while Redis answers.
"""

from duetime.worker.attempt import EARLY_NOTE_SLACK, FURTHEST_NOTE_MS
from duetime.worker.reporter import ACK_BATCH, MAX_ERROR_CHARS, MAX_TRACEBACK_CHARS
from duetime.worker.state import WorkerCounters
from duetime.worker.worker import DEFAULT_CONCURRENCY, HURRY, Worker, new_worker_id

__all__ = [
    "ACK_BATCH",
    "DEFAULT_CONCURRENCY",
    "EARLY_NOTE_SLACK",
    "FURTHEST_NOTE_MS",
    "HURRY",
    "MAX_ERROR_CHARS",
    "MAX_TRACEBACK_CHARS",
    "Worker",
    "WorkerCounters",
    "new_worker_id",
]
