"""Every exception duetime raises, in one hierarchy.

Redis client errors are converted to these at the Redis layer's boundary, so
callers catch ``duetime.errors.DuetimeError`` and nothing from redis-py.
"""

from __future__ import annotations

from typing import Any


class DuetimeError(Exception):
    """Base class of every duetime error."""


class InvalidInputError(DuetimeError, ValueError):
    """Input refused at the door; nothing was written to Redis."""


class InvalidTimestampError(InvalidInputError):
    """A run-at time that is naive, not finite, negative or of the wrong type."""


class InvalidPayloadError(InvalidInputError):
    """Task data that is empty, too large or cannot be encoded with msgpack."""


class InvalidOptionError(InvalidInputError):
    """A delay, timeout, result TTL or attempt count that is out of range."""


class InvalidNameError(InvalidInputError):
    """A queue name, task id, task name or worker id with forbidden characters."""


class ConfigurationError(DuetimeError):
    """Settings or command-line options that cannot work together."""


class DecodeError(DuetimeError):
    """An envelope in Redis that this version cannot read (corrupt, or newer format)."""


class TaskNotFoundError(DuetimeError, KeyError):
    """No live task with this id in the queue."""

    def __str__(self) -> str:  # KeyError would print the repr of the argument
        return str(self.args[0]) if self.args else "task not found"


class TaskStateError(DuetimeError):
    """The operation does not apply to the task in its current state (e.g. it is running)."""


class ConcurrentChangeError(DuetimeError):
    """What a call was working out changed under it each time it looked again (try again)."""


class TaskTimeoutError(DuetimeError, TimeoutError):
    """An attempt ran longer than its task's timeout (recorded as the attempt's error)."""


class ResultTimeoutError(DuetimeError, TimeoutError):
    """No result arrived within the wait."""


class TaskFailedError(DuetimeError):
    """The task ended in the dead-letter set; ``error`` holds its last error text."""

    def __init__(self, task_id: str, error: str) -> None:
        super().__init__(f"task {task_id} failed: {error}")
        self.task_id = task_id
        self.error = error


class TaskCancelledError(TaskFailedError):
    """The task was cancelled: ``Queue.result()`` raises it for a task cancelled while it
    waited or ran, and a handler may raise it (``current_task().raise_if_cancelled()``)
    to stop once its task was cancelled."""

    def __init__(self, task_id: str) -> None:
        DuetimeError.__init__(self, f"task {task_id} was cancelled")
        self.task_id = task_id
        self.error = "cancelled"


class TaskExpiredError(TaskFailedError):
    """The task was dropped unstarted: it had not started ``expires`` after its run-at.
    Raised by ``Queue.result()``; recorded as the error of such a task's attempt."""

    def __init__(self, task_id: str) -> None:
        DuetimeError.__init__(self, f"task {task_id} expired before it could start")
        self.task_id = task_id
        self.error = "expired"


class SnoozeLimitError(DuetimeError):
    """A handler snoozed its task past the task's limit (``Settings.max_snoozes``, or its
    handler's ``@app.task(max_snoozes=...)``): the task goes to the dead-letter set with
    this as its error, rather than snoozing for ever."""

    def __init__(self, task_id: str, snoozes: int, limit: int, where: str) -> None:
        super().__init__(
            f"task {task_id} snoozed {snoozes} times, its limit ({where} = {limit}); a "
            "handler that snoozes on every run loops for ever: fix the handler (it can "
            "read current_task().snoozes) or raise the limit, then requeue the task (a "
            "requeue counts its snoozes afresh)"
        )
        self.task_id = task_id
        self.snoozes = snoozes
        self.limit = limit


class UnknownHandlerError(DuetimeError, LookupError):
    """A task names a handler that the worker's app does not register."""


class RedisUnavailableError(DuetimeError, ConnectionError):
    """Redis could not be reached or did not answer in time (the URL's password is masked)."""


class EmbeddedServerError(DuetimeError):
    """The embedded Valkey server could not be started or attached to."""


class RedisCommandError(DuetimeError):
    """Redis refused a command (wrong key type, ACL denial, script error, ...)."""


class RedisOutOfMemoryError(RedisCommandError):
    """Redis is over its ``maxmemory`` and refuses writes (policy noeviction); reads work."""


class DamagedKeyError(RedisCommandError):
    """A key of the queue holds another type than duetime keeps there (written by hand or
    by another program), so Redis refused a script with WRONGTYPE; the script checks
    what can fail before its first write, so the refused call changed nothing.
    ``keys`` maps each such key to the type it holds."""

    def __init__(self, message: str, keys: dict[str, str]) -> None:
        super().__init__(message)
        self.keys = keys

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy for each caller of a shared round trip (coalescing) keeps the keys.
        return (type(self), (str(self), self.keys))


class CorruptStateError(DuetimeError):
    """A duetime key in Redis holds a value duetime never writes there (edited by hand,
    or written by another program); ``duetime inspect --check`` reports where."""


class DaemonFailedError(DuetimeError):
    """A part of a dispatcher or worker kept failing after restarts; the process should
    exit non-zero so that its supervisor (systemd, Kubernetes, ...) restarts it."""


class QueueNotLentError(DuetimeError, RuntimeError):
    """``current_task().queue`` cannot serve this caller: the worker that lends it has
    stopped, the caller runs on an event loop other than the worker's, or the
    ``TaskContext`` was not made by a worker. Open a ``Queue`` of your own there."""


class NotDurableError(DuetimeError):
    """Durable mode: a write was applied on the master, but its confirmation fell short
    in time (fewer replicas than asked, or, with durable_fsync, no fsync), so a failover
    or a crash may or may not keep it. A task so scheduled may be stored, and runs if it
    is: schedule it again with the same id (an id that is live changes nothing), never
    with a new one, which would run it twice. ``task_ids`` names the tasks."""

    def __init__(
        self,
        confirmed: int,
        wanted: int,
        shortfall: str,
        reply: object = None,
        task_ids: tuple[str, ...] = (),
    ) -> None:
        if task_ids:
            shown = ", ".join(task_ids[:10]) + ("..." if len(task_ids) > 10 else "")
            one = len(task_ids) == 1
            outcome = (
                f"{'task' if one else f'{len(task_ids)} tasks'} {shown} may be stored, and "
                f"{'runs if it is' if one else 'run if they are'} (a failover or a crash "
                f"may or may not keep the write): schedule {'it' if one else 'them'} again "
                f"with the same {'id, never a new one' if one else 'ids, never new ones'}, "
                f"which would run {'it' if one else 'them'} twice"
            )
        else:
            outcome = "it may or may not survive a failover or a crash"
        super().__init__(f"the write was applied on the master, but {shortfall}: {outcome}")
        self.confirmed = confirmed
        self.wanted = wanted
        self.shortfall = shortfall
        self.reply = reply
        self.task_ids = task_ids
