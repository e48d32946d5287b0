"""OpenTelemetry for duetime: a span per schedule call and per attempt, and the task
counters and histograms, through the OpenTelemetry API.

This module owns ``OpenTelemetryHooks``, an ordinary ``Hooks``. It uses the API only;
the application installs the SDK, its exporters and providers, or passes providers in.
Importing duetime never imports OpenTelemetry: only ``import duetime.otel`` does, and
it raises ``MissingExtraError`` (an ImportError) when the API is not installed.

Spans follow the OpenTelemetry messaging conventions (status "development"): the
schedule call is a PRODUCER span ``schedule <queue>`` (operation type ``send``), each
attempt a CONSUMER span ``process <queue>`` (operation type ``process``) that is the
current span while the handler runs. duetime's envelope carries no trace context, so
the two are tied by ``messaging.message.id`` (the task id), not by a span link.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar, Token
from typing import Any

from duetime import __version__
from duetime.errors import ConfigurationError
from duetime.hooks import (
    AttemptInfo,
    AttemptOutcome,
    AttemptResult,
    DeadTaskInfo,
    Hooks,
    ScheduledTask,
)
from duetime.metrics import DEFAULT_TASK, DURATION_BUCKETS, LATENESS_BUCKETS, UNKNOWN_TASK


class MissingExtraError(ConfigurationError, ImportError):
    """An optional dependency of a duetime module is not installed."""


try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace
    from opentelemetry.context import Context
except ImportError as missing:  # pragma: no cover - exercised in a subprocess
    raise MissingExtraError(
        f"duetime.otel needs the OpenTelemetry API ({missing}): pip install 'duetime[otel]'"
    ) from missing

SYSTEM = "duetime"
#: Most task ids named on the span of one schedule call (schedule_many may store many).
MOST_IDS_ON_A_SPAN = 100

# The attempt's span and the token that made it current; set in before_attempt and read
# in after_attempt, which run in the attempt's own context.
_attempt_span: ContextVar[tuple[trace.Span, Token[Context]] | None] = ContextVar(
    "duetime_attempt_span", default=None
)


def _task_label(task: str | None) -> str:
    return UNKNOWN_TASK if task is None else task or DEFAULT_TASK


class OpenTelemetryHooks(Hooks):
    """Spans and metrics of schedule calls (add it to a ``Queue``) and attempts (add it
    to an ``App``). ``tracer_provider`` and ``meter_provider`` default to the global ones
    (``trace.set_tracer_provider``...), which do nothing until an SDK is installed."""

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: otel_metrics.MeterProvider | None = None,
    ) -> None:
        self._tracer = trace.get_tracer("duetime", __version__, tracer_provider)
        meter = otel_metrics.get_meter("duetime", __version__, meter_provider)
        self._scheduled = meter.create_counter(
            "duetime.tasks.scheduled", "{task}", "Tasks stored by schedule calls"
        )
        self._started = meter.create_counter(
            "duetime.tasks.started", "{attempt}", "Attempts whose handler started"
        )
        self._succeeded = meter.create_counter(
            "duetime.tasks.succeeded", "{attempt}", "Attempts whose handler returned"
        )
        self._failed = meter.create_counter(
            "duetime.tasks.failed", "{attempt}",
            "Attempts whose handler raised; duetime.attempt.outcome: retry or dead",
        )  # fmt: skip
        self._fenced = meter.create_counter(
            "duetime.tasks.fenced", "{attempt}", "Attempts whose lease was gone"
        )
        self._interrupted = meter.create_counter(
            "duetime.tasks.interrupted", "{attempt}", "Attempts cut off by a worker's shutdown"
        )
        self._snoozed = meter.create_counter(
            "duetime.tasks.snoozed", "{attempt}", "Attempts whose handler asked to run later"
        )
        self._cancelled = meter.create_counter(
            "duetime.tasks.cancelled_running", "{attempt}",
            "Attempts whose task was cancelled while they ran",
        )  # fmt: skip
        self._dead_unstarted = meter.create_counter(
            "duetime.tasks.dead_unstarted", "{task}", "Tasks sent to dead without running"
        )
        self._lateness = meter.create_histogram(
            "duetime.task.lateness",
            "s",
            "How long after it was due (its run-at, or the end of a retry's back-off, a "
            "requeue or re-entry) each attempt started",
            explicit_bucket_boundaries_advisory=LATENESS_BUCKETS,
        )  # fmt: skip
        self._duration = meter.create_histogram(
            "duetime.task.duration", "s", "How long each attempt's handler ran",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )  # fmt: skip
        self._labels: dict[tuple[str, str | None], dict[str, str]] = {}

    def _attributes(self, queue: str, task: str | None) -> dict[str, str]:
        """The metric attributes of one (queue, task), made once."""
        attributes = self._labels.get((queue, task))
        if attributes is None:
            attributes = {
                "messaging.destination.name": queue,
                "duetime.task.name": _task_label(task),
            }
            self._labels[queue, task] = attributes
        return attributes

    # --- producer ----------------------------------------------------------------------

    def on_schedule(self, queue: str, tasks: Sequence[ScheduledTask]) -> None:
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "schedule",
            "messaging.destination.name": queue,
        }
        if len(tasks) == 1:
            [task] = tasks
            attributes["messaging.message.id"] = task.id
            attributes["duetime.task.name"] = _task_label(task.task)
            attributes["duetime.task.run_at"] = task.run_at
        else:
            attributes["messaging.batch.message_count"] = len(tasks)
            attributes["duetime.task.ids"] = [task.id for task in tasks[:MOST_IDS_ON_A_SPAN]]
        # The hook is told after the write: the span marks the call's end, in the
        # caller's trace (the current span is its parent).
        span = self._tracer.start_span(
            f"schedule {queue}", kind=trace.SpanKind.PRODUCER, attributes=attributes
        )
        span.end()
        per_task: dict[str, int] = {}
        for task in tasks:
            per_task[task.task] = per_task.get(task.task, 0) + 1
        for name, count in per_task.items():
            self._scheduled.add(count, self._attributes(queue, name))

    # --- consumer ----------------------------------------------------------------------

    def before_attempt(self, attempt: AttemptInfo) -> None:
        span = self._tracer.start_span(
            f"process {attempt.queue}",
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": attempt.queue,
                "messaging.message.id": attempt.task_id,
                "messaging.client.id": attempt.worker_id,
                "duetime.task.name": _task_label(attempt.task),
                "duetime.task.run_at": attempt.run_at,
                "duetime.attempt": attempt.attempt,
                "duetime.max_attempts": attempt.max_attempts,
                "duetime.attempt.lateness": attempt.lateness,
            },
        )
        # Current while the handler runs (the handler's own spans are its children).
        token = otel_context.attach(trace.set_span_in_context(span))
        _attempt_span.set((span, token))
        attributes = self._attributes(attempt.queue, attempt.task)
        self._started.add(1, attributes)
        self._lateness.record(attempt.lateness, attributes)

    def after_attempt(self, attempt: AttemptInfo, result: AttemptResult) -> None:
        attributes = self._attributes(attempt.queue, attempt.task)
        self._duration.record(result.duration, attributes)
        outcome = result.outcome
        if outcome == AttemptOutcome.SUCCEEDED:
            self._succeeded.add(1, attributes)
        elif outcome in (AttemptOutcome.RETRY, AttemptOutcome.DEAD):
            self._failed.add(1, {**attributes, "duetime.attempt.outcome": outcome.value})
        elif outcome == AttemptOutcome.FENCED:
            self._fenced.add(1, attributes)
        elif outcome == AttemptOutcome.SNOOZED:
            self._snoozed.add(1, attributes)
        elif outcome == AttemptOutcome.CANCELLED:
            self._cancelled.add(1, attributes)
        else:
            self._interrupted.add(1, attributes)
        held = _attempt_span.get()
        if held is None:
            return
        span, token = held
        _attempt_span.set(None)
        try:
            span.set_attribute("duetime.attempt.outcome", outcome.value)
            error = result.error
            if error is not None:
                span.record_exception(error)
                span.set_attribute("error.type", type(error).__qualname__)
                description = f"{type(error).__name__}: {error}".removesuffix(": ")
                span.set_status(trace.Status(trace.StatusCode.ERROR, description))
            span.end()
        finally:
            otel_context.detach(token)

    def on_dead(self, dead: DeadTaskInfo) -> None:
        if dead.attempt is None:  # a dead attempt was counted by after_attempt
            self._dead_unstarted.add(1, self._attributes(dead.queue, dead.task))
