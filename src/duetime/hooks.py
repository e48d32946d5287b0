"""Hooks: how duetime tells code outside it what happens to tasks.

A ``Hooks`` subclass overrides the methods it needs: ``on_schedule`` when tasks are
stored, ``before_attempt`` and ``after_attempt`` around each run of a handler, then
``on_retry`` or ``on_dead`` once a failure is recorded. Register hooks on an ``App``
(worker events) and on a ``Queue`` (schedule events). duetime's own attempt logging
and Prometheus metrics are hooks too, so Sentry, OpenTelemetry, structured logs or a
team's own metrics plug in the same way, without patching duetime.

Hooks run on the worker's event loop (or the scheduling caller's thread), so they must
be quick and must not block. ``before_attempt`` runs in the attempt's own context just
before the handler, so a context variable it sets (a tracing span, say) is seen by the
handler, async or plain, and ``after_attempt`` runs in that same context. A hook that
raises is logged and skipped: it never changes what happens to the task.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from duetime.errors import ConfigurationError

log = logging.getLogger("duetime")


@dataclass(frozen=True, slots=True)
class ScheduledTask:
    """One task a schedule call stored (or found already stored under its id)."""

    id: str
    task: str  # the handler name; "" for the default handler
    run_at: float  # epoch seconds


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """One attempt of a task, as a worker starts it. ``started_at``, ``run_at`` and
    ``due_at`` are by the server's clock. ``due_at`` is when the queue owed the attempt
    its start: the run-at, or later when the attempt is a retry (when its back-off
    ended), or the task was requeued from dead or re-entered after its worker lost it
    or stopped (then), or, under flow control, once its limits let it go (``held`` is
    how long they held it after it was due: a rate, a cap, a concurrency limit, a snooze
    of its key). ``lateness`` is how long after ``due_at`` it started: the queue's own
    delay, never the caller's date, a back-off nor a wait its limits imposed."""

    queue: str
    task_id: str
    task: str
    attempt: int
    max_attempts: int
    run_at: float
    started_at: float
    worker_id: str
    due_at: float = 0.0  # 0 (made by hand): the run-at
    held: float = 0.0  # seconds flow control's limits held it before due_at

    @property
    def lateness(self) -> float:
        return self.started_at - max(self.run_at, self.due_at)


class AttemptOutcome(StrEnum):
    """How an attempt ended, as ``after_attempt`` reports it."""

    SUCCEEDED = "succeeded"
    RETRY = "retry"  # failed; another attempt follows
    DEAD = "dead"  # failed with no attempt left (or could not run at all)
    FENCED = "fenced"  # its lease was gone: the outcome is dropped, another attempt owns it
    INTERRUPTED = "interrupted"  # cut off by the worker's shutdown; the task is handed back
    SNOOZED = "snoozed"  # the handler raised Snooze: run again later, the attempt given back
    CANCELLED = "cancelled"  # its task was cancelled while it ran: it ends as cancelled


@dataclass(frozen=True, slots=True)
class AttemptResult:
    outcome: AttemptOutcome
    duration: float  # seconds the handler ran
    error: BaseException | None = None
    traceback: str = ""


@dataclass(frozen=True, slots=True)
class DeadTaskInfo:
    """A task that went to the dead-letter set. ``attempt`` is None when it could not
    even start (an envelope that does not decode, an unknown handler)."""

    queue: str
    task_id: str
    task: str | None
    attempt: AttemptInfo | None
    error: str


class Hooks:
    """Override any of these; each does nothing by default."""

    def on_schedule(self, queue: str, tasks: Sequence[ScheduledTask]) -> None:
        """Tasks were stored by one schedule call (given ids already live included)."""

    def before_attempt(self, attempt: AttemptInfo) -> None:
        """A handler is about to run."""

    def after_attempt(self, attempt: AttemptInfo, result: AttemptResult) -> None:
        """A handler returned or raised (before the outcome is written to Redis)."""

    def on_retry(self, attempt: AttemptInfo, error: str, delay: float) -> None:
        """A failed attempt was recorded; the next one runs in ``delay`` seconds."""

    def on_dead(self, dead: DeadTaskInfo) -> None:
        """A task was moved to the dead-letter set."""


#: The methods a hook may override, in the order events happen.
HOOK_METHODS = ("on_schedule", "before_attempt", "after_attempt", "on_retry", "on_dead")


class HookChain:
    """The hooks of one App or Queue, called in order; a failing hook is logged (once
    per hook and method, then at debug) and the others still run. Only the methods a
    hook overrides are called: a worker calls two per attempt, so a hook that leaves
    ``before_attempt`` alone costs nothing there, and where no hook wants either (see
    ``around_attempts``) the worker does not even describe the attempt."""

    def __init__(self, hooks: Iterable[Hooks] = ()) -> None:
        self.hooks: list[Hooks] = []
        self._complained: set[tuple[int, str]] = set()
        self._overrides: dict[str, list[tuple[Hooks, Callable[..., None]]]] = {
            method: [] for method in HOOK_METHODS
        }
        self._around = False  # a hook other than plain LogHooks overrides an attempt method
        self._logs_attempts = False  # a plain LogHooks is in the chain
        for hook in hooks:
            self.add(hook)

    def add(self, hook: Hooks) -> None:
        if not isinstance(hook, Hooks):
            raise ConfigurationError(
                f"hooks must be duetime.Hooks instances, got {type(hook).__name__}"
            )
        self.hooks.append(hook)
        for method in HOOK_METHODS:
            if getattr(type(hook), method) is not getattr(Hooks, method):
                self._overrides[method].append((hook, getattr(hook, method)))
                if method in ("before_attempt", "after_attempt"):
                    if type(hook) is LogHooks:
                        self._logs_attempts = True
                    else:
                        self._around = True

    def __bool__(self) -> bool:
        return bool(self.hooks)

    @property
    def around_attempts(self) -> bool:
        """Whether ``before_attempt``/``after_attempt`` would do anything now: some hook
        overrides them, other than duetime's own LogHooks while its debug lines are off.
        A worker asks before each attempt, and skips describing it (AttemptInfo,
        AttemptResult) when the answer is no: that is most of what hooks cost."""
        return self._around or (self._logs_attempts and log.isEnabledFor(logging.DEBUG))

    def on_schedule(self, queue: str, tasks: Sequence[ScheduledTask]) -> None:
        self._each("on_schedule", queue, tasks)

    def before_attempt(self, attempt: AttemptInfo) -> None:
        self._each("before_attempt", attempt)

    def after_attempt(self, attempt: AttemptInfo, result: AttemptResult) -> None:
        self._each("after_attempt", attempt, result)

    def on_retry(self, attempt: AttemptInfo, error: str, delay: float) -> None:
        self._each("on_retry", attempt, error, delay)

    def on_dead(self, dead: DeadTaskInfo) -> None:
        self._each("on_dead", dead)

    def _each(self, method: str, *arguments: Any) -> None:
        for hook, call in self._overrides[method]:
            try:
                call(*arguments)
            except Exception:
                key = (id(hook), method)
                level = logging.DEBUG if key in self._complained else logging.ERROR
                self._complained.add(key)
                log.log(
                    level, "hook %s.%s raised; the task is not affected",
                    type(hook).__name__, method, exc_info=True,
                )  # fmt: skip


class LogHooks(Hooks):
    """duetime's own log lines about attempts: one per attempt at debug, retries as
    warnings, dead tasks as errors."""

    def after_attempt(self, attempt: AttemptInfo, result: AttemptResult) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "task %s (%s) attempt %d %s in %.1f ms, started %.1f ms after its run-at",
                attempt.task_id, attempt.task or "default", attempt.attempt,
                result.outcome.value, result.duration * 1000, attempt.lateness * 1000,
            )  # fmt: skip

    def on_retry(self, attempt: AttemptInfo, error: str, delay: float) -> None:
        log.warning(
            "task %s attempt %d failed (%s); retrying in %.3g s",
            attempt.task_id, attempt.attempt, error, delay,
        )  # fmt: skip

    def on_dead(self, dead: DeadTaskInfo) -> None:
        after = f" after attempt {dead.attempt.attempt}" if dead.attempt else ""
        log.error("task %s is dead%s: %s", dead.task_id, after, dead.error)
