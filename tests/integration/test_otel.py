"""OpenTelemetry on a real server, with the SDK's in-memory span exporter and metric
reader: a PRODUCER span per schedule call in the caller's trace, a CONSUMER span per
attempt that the handler sees as current (async or plain), errors recorded on the
span, the counters and histograms by task; and duetime without OpenTelemetry."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from duetime import App, Dispatcher, Job, Queue, Worker
from duetime.metrics import DURATION_BUCKETS, LATENESS_BUCKETS
from duetime.otel import OpenTelemetryHooks
from tests.helpers import FAST, add_ok_flaky_broken, running, wait_until

RETRY_FAST = FAST.replace(retry_base=0.01, retry_max=0.02, max_attempts=2)
SRC = Path(__file__).resolve().parents[2] / "src" / "duetime"


def points(reader: InMemoryMetricReader) -> dict[str, dict[frozenset[tuple[str, Any]], Any]]:
    """Each metric's data points by their attributes."""
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: {frozenset((p.attributes or {}).items()): p for p in metric.data.data_points}
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }


def by_task(found: dict[frozenset[tuple[str, Any]], Any], **more: str) -> dict[str, Any]:
    wanted = set(more.items())
    return {
        dict(key)["duetime.task.name"]: point.value
        if not isinstance(point, HistogramDataPoint)
        else point
        for key, point in found.items()
        if wanted <= key
    }


def test_spans_and_metrics_of_schedule_calls_and_attempts(redis_url: str, queue_name: str) -> None:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    hooks = OpenTelemetryHooks(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader])
    )
    app = App(hooks=[hooks])
    current: dict[str, list[int]] = {}  # task -> span id current in its handler, per attempt

    def seen(task: str) -> None:
        current.setdefault(task, []).append(trace.get_current_span().get_span_context().span_id)

    ok, flaky, broken = add_ok_flaky_broken(app, seen)

    with Queue(queue_name, redis_url, settings=RETRY_FAST, hooks=[hooks]) as queue:
        with tracer_provider.get_tracer("test").start_as_current_span("request") as request:
            ok_id = queue.schedule_now({}, task=ok)
        flaky_id = queue.schedule_now({}, task=flaky)
        broken_id = queue.schedule_now({}, task=broken)
        queue.schedule_now({}, task="nobody")
        later = queue.schedule_many([Job({}, delay=3600, task=ok) for _ in range(3)])

        async def scenario() -> None:
            worker = Worker(app, queue_name, redis_url, settings=RETRY_FAST)
            async with running(Dispatcher([queue_name], redis_url, settings=FAST), worker):
                await wait_until(
                    lambda: (worker.counters.succeeded, worker.counters.dead) == (2, 2),
                    what="two tasks done and two dead",
                )

        asyncio.run(scenario())

    finished = spans.get_finished_spans()
    sent = [s for s in finished if s.kind == SpanKind.PRODUCER]
    assert [s.name for s in sent] == [f"schedule {queue_name}"] * 5
    first = sent[0]
    assert first.parent is not None
    assert first.parent.span_id == request.get_span_context().span_id  # the caller's trace
    assert dict(first.attributes or {}) == {
        "messaging.system": "duetime",
        "messaging.operation.type": "send",
        "messaging.operation.name": "schedule",
        "messaging.destination.name": queue_name,
        "messaging.message.id": ok_id,
        "duetime.task.name": "ok",
        "duetime.task.run_at": (first.attributes or {})["duetime.task.run_at"],
    }
    batch = dict(sent[-1].attributes or {})
    assert batch["messaging.batch.message_count"] == 3
    assert list(batch["duetime.task.ids"]) == later  # type: ignore[arg-type]
    assert "messaging.message.id" not in batch

    processed: dict[str, list[ReadableSpan]] = {}
    for span in finished:
        if span.kind == SpanKind.CONSUMER:
            processed.setdefault(str((span.attributes or {})["messaging.message.id"]), []).append(
                span
            )
    assert set(processed) == {ok_id, flaky_id, broken_id}  # "nobody" never started
    [ok_span] = processed[ok_id]
    attributes = dict(ok_span.attributes or {})
    assert ok_span.name == f"process {queue_name}"
    assert {key: attributes[key] for key in attributes if key.startswith("messaging.")} == {
        "messaging.system": "duetime",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": queue_name,
        "messaging.message.id": ok_id,
        "messaging.client.id": attributes["messaging.client.id"],
    }
    assert attributes["duetime.attempt"] == 1 and attributes["duetime.max_attempts"] == 2
    assert attributes["duetime.attempt.outcome"] == "succeeded"
    assert ok_span.status.status_code == StatusCode.UNSET and not ok_span.events
    # The attempt's span is current in the handler, async and plain alike.
    assert current["ok"] == [ok_span.context.span_id]
    assert current["flaky"] == [s.context.span_id for s in processed[flaky_id]]

    def ends(task_id: str) -> list[tuple[Any, ...]]:
        return [
            (
                (s.attributes or {})["duetime.attempt"],
                (s.attributes or {})["duetime.attempt.outcome"],
                s.status.status_code,
                [dict(e.attributes or {}).get("exception.type") for e in s.events],
            )
            for s in processed[task_id]
        ]

    assert ends(flaky_id) == [
        (1, "retry", StatusCode.ERROR, ["ValueError"]),
        (2, "succeeded", StatusCode.UNSET, []),
    ]
    assert ends(broken_id) == [
        (1, "retry", StatusCode.ERROR, ["RuntimeError"]),
        (2, "dead", StatusCode.ERROR, ["RuntimeError"]),
    ]
    assert processed[broken_id][1].status.description == "RuntimeError: always"

    found = points(reader)
    assert by_task(found["duetime.tasks.scheduled"]) == {
        "ok": 4, "flaky": 1, "broken": 1, "nobody": 1,
    }  # fmt: skip
    assert by_task(found["duetime.tasks.started"]) == {"ok": 1, "flaky": 2, "broken": 2}
    assert by_task(found["duetime.tasks.succeeded"]) == {"ok": 1, "flaky": 1}
    failed = found["duetime.tasks.failed"]
    assert by_task(failed, **{"duetime.attempt.outcome": "retry"}) == {"flaky": 1, "broken": 1}
    assert by_task(failed, **{"duetime.attempt.outcome": "dead"}) == {"broken": 1}
    assert by_task(found["duetime.tasks.dead_unstarted"]) == {"nobody": 1}
    assert "duetime.tasks.fenced" not in found and "duetime.tasks.interrupted" not in found
    for name, bounds in (
        ("duetime.task.lateness", LATENESS_BUCKETS),
        ("duetime.task.duration", DURATION_BUCKETS),
    ):
        histograms = by_task(found[name])
        assert {task: h.count for task, h in histograms.items()} == {
            "ok": 1, "flaky": 2, "broken": 2,
        }  # fmt: skip
        assert all(tuple(h.explicit_bounds) == bounds for h in histograms.values())
    every = {name for metric in found.values() for point in metric for name, _ in point}
    assert every <= {"messaging.destination.name", "duetime.task.name", "duetime.attempt.outcome"}


def test_duetime_runs_without_opentelemetry_and_says_how_to_get_it() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if it were not installed
        import duetime, duetime.metrics
        from duetime.errors import ConfigurationError
        try:
            import duetime.otel
        except ImportError as error:
            assert isinstance(error, ConfigurationError), type(error)
            print(error)
        else:
            raise SystemExit("duetime.otel imported without OpenTelemetry")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pip install 'duetime[otel]'" in done.stdout
    # Only duetime.otel imports OpenTelemetry (redis-py may import it on its own).
    importers = [
        path.name
        for path in SRC.rglob("*.py")
        if "import opentelemetry" in path.read_text() or "from opentelemetry" in path.read_text()
    ]
    assert importers == ["otel.py"]
