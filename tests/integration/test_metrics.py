"""Prometheus metrics on a real server, scraped over HTTP: after a scripted scenario
every exported series has the value it must have; the Redis-derived counters are the
same from any number of exporters; a queue that cannot be read is reported, not fatal;
cron ticks are counted per job; one endpoint serves all the daemons of a process."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from duetime import App, Dispatcher, ManualClock, Queue, Settings, Worker, metrics
from duetime.dispatcher import QueueDispatcher
from duetime.errors import ConfigurationError
from duetime.metrics import (
    CRON_OUTCOMES,
    DURATION_BUCKETS,
    LATENESS_BUCKETS,
    QUEUE_EVENTS,
    CronCollector,
    MetricsEndpoint,
    PrometheusHooks,
)
from duetime.store.plans.layout import shard_tag
from duetime.store.redis.runner import AsyncRunner
from tests.helpers import FAST, add_ok_flaky_broken, running, wait_until, wait_until_sync
from tests.servers import free_port

RETRY_FAST = FAST.replace(retry_base=0.01, retry_max=0.02, max_attempts=2)
LUA = Path(__file__).resolve().parents[2] / "src" / "duetime" / "store" / "plans" / "lua"

Labels = frozenset[tuple[str, str]]
Samples = dict[tuple[str, Labels], float]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        return str(reply.read().decode())


def samples(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def of(found: Samples, name: str, **labels: str) -> float:
    return found[name, frozenset(labels.items())]


def series(found: Samples, name: str, **labels: str) -> dict[Labels, float]:
    """The series of ``name`` that carry ``labels`` (and any others), by their labels."""
    wanted = set(labels.items())
    return {key: value for (n, key), value in found.items() if n == name and wanted <= key}


def by(found: dict[Labels, float], label: str) -> dict[str, float]:
    return {dict(key)[label]: value for key, value in found.items()}


def assert_ok_flaky_broken_attempts(found: Samples, labels: dict[str, str], ok_runs: int) -> None:
    """The per-attempt families after ``ok_runs`` runs of ``ok`` and one each of
    ``flaky`` (fails once, then succeeds) and ``broken`` (fails twice, then dead)."""
    assert by(series(found, "duetime_tasks_started_total", **labels), "task") == {
        "ok": ok_runs, "flaky": 2, "broken": 2,
    }  # fmt: skip
    assert by(series(found, "duetime_tasks_succeeded_total", **labels), "task") == {
        "ok": ok_runs, "flaky": 1, "broken": 0,
    }  # fmt: skip
    failed = "duetime_tasks_failed_total"
    assert by(series(found, failed, **labels, outcome="retry"), "task") == {
        "ok": 0, "flaky": 1, "broken": 1,
    }  # fmt: skip
    assert by(series(found, failed, **labels, outcome="dead"), "task") == {
        "ok": 0, "flaky": 0, "broken": 1,
    }  # fmt: skip
    for name in ("duetime_tasks_fenced_total", "duetime_tasks_interrupted_total"):
        assert by(series(found, name, **labels), "task") == {"ok": 0, "flaky": 0, "broken": 0}


def assert_histogram(found: Samples, name: str, bounds: tuple[float, ...], **labels: str) -> float:
    """Checks the buckets of one histogram series and returns its count."""
    buckets = {
        float(dict(key)["le"]): value
        for key, value in series(found, f"{name}_bucket", **labels).items()
    }
    assert sorted(buckets) == [*bounds, float("inf")]
    cumulative = [buckets[bound] for bound in sorted(buckets)]
    assert cumulative == sorted(cumulative)
    count = of(found, f"{name}_count", **labels)
    assert buckets[float("inf")] == count
    return count


def test_the_endpoint_exports_what_happened_and_what_redis_holds(
    redis_url: str, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    settings = RETRY_FAST.replace(metrics_port=port)
    paused_name = f"{queue_name}-paused"
    # An app that brings its own PrometheusHooks on duetime's registry: the worker must
    # not add a second one (each attempt counted once).
    app = App(hooks=[PrometheusHooks()])
    ok, flaky, broken = add_ok_flaky_broken(app)

    with (
        Queue(queue_name, redis_url, settings=settings, hooks=[PrometheusHooks()]) as queue,
        Queue(paused_name, redis_url, settings=settings) as paused,
    ):
        for task in (ok, ok, flaky, broken, "nobody"):
            queue.schedule_now({}, task=task)
        queue.schedule_in(3600, {}, task=ok)
        paused.pause()
        # Dated a day back: ready, and owed its start from now on, not for a day.
        paused.schedule_task(time.time() - 86400, {}, task=ok)
        paused.schedule_in(0.01, {}, task=ok)  # due soon; no dispatcher serves this queue

        async def scenario() -> tuple[str, Any, Any]:
            worker = Worker(app, queue_name, redis_url, settings=settings)
            idle = Worker(app, paused_name, redis_url, settings=settings)
            # Three daemons of one process, one endpoint.
            async with running(
                Dispatcher([queue_name], redis_url, settings=settings), worker, idle
            ):
                await wait_until(
                    lambda: (worker.counters.succeeded, worker.counters.dead) == (3, 2),
                    what="three tasks done and two dead",
                )
                await wait_until(lambda: paused.stats().oldest_due_age > 0, what="a due task")
                await wait_until(lambda: len(paused.stats().workers) == 1, what="idle worker")
                text = await asyncio.to_thread(scrape, port)
                return text, queue.stats(), paused.stats()

        with caplog.at_level(logging.INFO, logger="duetime.metrics"):
            text, truth, paused_truth = asyncio.run(scenario())

    said = [r for r in caplog.records if r.name == "duetime.metrics"]
    assert [r.message for r in said] == [f"serving metrics on http://127.0.0.1:{port}/metrics"]
    found = samples(text)
    mine = {"queue": queue_name}

    # What the hooks saw, by task.
    assert by(series(found, "duetime_tasks_scheduled_total", **mine), "task") == {
        "ok": 3, "flaky": 1, "broken": 1, "nobody": 1,
    }  # fmt: skip
    assert_ok_flaky_broken_attempts(found, mine, ok_runs=2)
    assert by(series(found, "duetime_tasks_dead_unstarted_total", **mine), "task") == {"nobody": 1}
    for task, attempts in (("ok", 2), ("flaky", 2), ("broken", 2)):
        lateness = assert_histogram(
            found, "duetime_task_lateness_seconds", LATENESS_BUCKETS, **mine, task=task
        )
        duration = assert_histogram(
            found, "duetime_task_duration_seconds", DURATION_BUCKETS, **mine, task=task
        )
        assert lateness == duration == attempts
        assert of(found, "duetime_task_duration_seconds_sum", **mine, task=task) >= 0

    # What Redis holds: the served queue, all done but the task for later.
    assert of(found, "duetime_queue_up", **mine) == 1
    assert by(series(found, "duetime_queue_tasks", **mine), "state") == {
        "scheduled": 1, "ready": 0, "running": 0, "dead": 2,
    }  # fmt: skip
    assert of(found, "duetime_queue_paused", **mine) == 0
    assert of(found, "duetime_queue_promotion_lag_seconds", **mine) == 0
    assert of(found, "duetime_queue_claim_lag_seconds", **mine) == 0
    workers = by(series(found, "duetime_queue_workers", **mine), "state")
    assert workers == {"alive": 1, "late": 0, "silent": 0, "gone": 0}
    events = by(series(found, "duetime_queue_events_total", **mine), "event")
    assert set(events) == set(QUEUE_EVENTS)
    assert events == {event: truth.counters.get(event, 0) for event in QUEUE_EVENTS}
    assert (events["scheduled"], events["completed"], events["retried"]) == (6, 3, 2)
    assert (events["dead"], events["failed"], events["fenced"]) == (2, 4, 0)

    # The paused queue: one task ready since it was scheduled, one due and not promoted.
    theirs = {"queue": paused_name}
    assert of(found, "duetime_queue_up", **theirs) == 1
    assert of(found, "duetime_queue_paused", **theirs) == 1
    assert by(series(found, "duetime_queue_tasks", **theirs), "state") == {
        "scheduled": 1, "ready": 1, "running": 0, "dead": 0,
    }  # fmt: skip
    claim_lag = of(found, "duetime_queue_claim_lag_seconds", **theirs)
    assert 0 < claim_lag <= paused_truth.oldest_ready_age < 3600
    promotion_lag = of(found, "duetime_queue_promotion_lag_seconds", **theirs)
    assert 0 < promotion_lag <= paused_truth.oldest_due_age
    assert by(series(found, "duetime_queue_workers", **theirs), "state") == {
        "alive": 1, "late": 0, "silent": 0, "gone": 0,
    }  # fmt: skip
    assert not series(found, "duetime_tasks_scheduled_total", **theirs)  # no hooks there
    assert not series(found, "duetime_cron_ticks_total", **mine)  # no cron job


def test_every_exporter_gives_the_same_redis_counters(redis_url: str, queue_name: str) -> None:
    """Two processes' endpoints export one queue: each shows the counters once, the same.
    One has a durable app's settings, whose wait would not fit the scrape's shorter
    socket timeout: the exporter only reads, so it is not durable."""
    with Queue(queue_name, redis_url) as queue:
        ids = queue.schedule_many([(time.time() + 3600, i) for i in range(3)])
        assert queue.cancel(ids[0])
    endpoints = [MetricsEndpoint().start(0) for _ in range(2)]
    durable = Settings(durable_replicas=1, durable_timeout=3.0)
    try:
        for endpoint, settings in zip(endpoints, (durable, Settings()), strict=True):
            endpoint.queues.add(queue_name, redis_url, settings=settings)
        scraped = [samples(scrape(e.port or 0)) for e in endpoints]
    finally:
        for endpoint in endpoints:
            endpoint.close()
    first, second = (by(series(s, "duetime_queue_events_total"), "event") for s in scraped)
    assert first == second
    assert (first["scheduled"], first["cancelled"]) == (3, 1)
    assert of(scraped[0], "duetime_queue_tasks", queue=queue_name, state="scheduled") == 2


def test_a_queue_that_cannot_be_read_exports_up_0_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    endpoint = MetricsEndpoint().start(0)
    try:
        endpoint.queues.add("gone", nowhere)
        with caplog.at_level(logging.DEBUG, logger="duetime.metrics"):
            scraped = [samples(scrape(endpoint.port or 0)) for _ in range(2)]
    finally:
        endpoint.close()
    for found in scraped:
        assert of(found, "duetime_queue_up", queue="gone") == 0
        assert not series(found, "duetime_queue_tasks", queue="gone")
    said = [r for r in caplog.records if "cannot read queue gone" in r.message]
    assert [r.levelno for r in said] == [logging.WARNING, logging.DEBUG]


T0 = 1_800_000_000_000  # a whole minute
MINUTE = 60_000


def test_cron_ticks_are_counted_per_job(redis_url: str, queue_name: str) -> None:
    clock = ManualClock(T0 - 500)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.add_cron("allow", "* * * * *", {})
        queue.add_cron("skip", "* * * * *", {}, overlap="skip")
        queue.add_cron("delay", "* * * * *", {}, overlap="delay")
    endpoint = MetricsEndpoint().start(0)

    async def scenario() -> None:
        runner = AsyncRunner(redis_url, Settings())
        dispatcher = QueueDispatcher(queue_name, runner, Settings(), clock)
        endpoint.cron.add([dispatcher])
        try:
            clock.set(T0 + 100)  # each fires its tick at T0; no worker runs them
            await dispatcher.step()
            # Every dispatcher down for ten minutes: ticks T0+1..T0+9 min were missed.
            clock.set(T0 + 10 * MINUTE + 100)
            await dispatcher.step()
            clock.set(T0 + 10 * MINUTE + 1600)  # the held tick is looked at again
            await dispatcher.step()
        finally:
            await runner.close()

    try:
        asyncio.run(scenario())
        endpoint.queues.add(queue_name, redis_url)
        found = samples(scrape(endpoint.port or 0))
    finally:
        endpoint.close()
    ticks = series(found, "duetime_cron_ticks_total", queue=queue_name)
    counted = {(dict(key)["job"], dict(key)["outcome"]): value for key, value in ticks.items()}
    assert counted == {
        ("allow", "fired"): 2, ("allow", "skipped"): 0, ("allow", "delayed"): 0,
        ("allow", "missed"): 9,
        ("skip", "fired"): 1, ("skip", "skipped"): 1, ("skip", "delayed"): 0,
        ("skip", "missed"): 9,
        ("delay", "fired"): 1, ("delay", "skipped"): 0, ("delay", "delayed"): 1,
        ("delay", "missed"): 0,
        **{(job, outcome): 0 for job in ("allow", "skip", "delay")
           for outcome in ("outside_window", "backfilled")},
    }  # fmt: skip
    assert set(CRON_OUTCOMES) == {outcome for _, outcome in counted}
    events = by(series(found, "duetime_queue_events_total", queue=queue_name), "event")
    assert (events["cron_fired"], events["cron_skipped"]) == (4, 1)


@dataclass
class CountedTicks:
    """What CronCollector reads of a dispatcher (a CronTickSource)."""

    queue: str
    cron_ticks: dict[tuple[str, str], int]


def test_the_cron_ticks_of_a_sharded_queue_are_summed_under_its_name() -> None:
    collector = CronCollector()
    shards = [
        CountedTicks("emails", {("daily", "fired"): 2}),
        CountedTicks(shard_tag("emails", 3), {("daily", "fired"): 1, ("hourly", "missed"): 4}),
    ]
    collector.add(shards)
    [family] = collector.collect()
    labels = ("queue", "job", "outcome")
    counted = {
        tuple(sample.labels[label] for label in labels): sample.value
        for sample in family.samples
        if sample.value
    }
    assert counted == {("emails", "daily", "fired"): 3, ("emails", "hourly", "missed"): 4}
    collector.remove(shards)
    [family] = collector.collect()
    assert family.samples == []


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_a_port_that_is_taken_is_logged_not_fatal(
    taken_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="duetime.metrics"):
        unexport = metrics.export(Settings(metrics_port=taken_port), None, [])
    unexport()
    unexport()  # a second call changes nothing
    [error] = caplog.records
    assert f"cannot serve metrics on 127.0.0.1:{taken_port}" in error.message
    assert "this process exports no metrics" in error.message
    with pytest.raises(ConfigurationError, match="Give each process a free port"):
        MetricsEndpoint().start(taken_port)


def test_the_port_setting_is_validated() -> None:
    assert Settings().metrics_port == 0
    assert Settings.from_env({"DUETIME_METRICS_PORT": "9464"}).metrics_port == 9464
    for wrong in (-1, 65536, 1.5):
        with pytest.raises(ConfigurationError, match="metrics_port must be an integer"):
            Settings(metrics_port=wrong)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="DUETIME_METRICS_PORT"):
        Settings.from_env({"DUETIME_METRICS_PORT": "http"})


def test_every_counter_the_scripts_keep_is_exported() -> None:
    kept = set()
    for script in LUA.glob("*.lua"):
        source = script.read_text()
        # The counters are the fields of the stats hash, whichever KEYS index it has here.
        for index in re.findall(r"^-- KEYS\[(\d+)\] +stats ", source, re.MULTILINE):
            kept |= set(re.findall(rf"'HINCRBY', KEYS\[{index}\], '(\w+)'", source))
    assert kept == set(QUEUE_EVENTS)


def test_the_worker_tally_counts_as_the_hooks_do() -> None:
    """A worker with metrics_port counts attempts in bulk (AttemptTally) rather than
    through PrometheusHooks: the series must come out the same, bucket for bucket."""
    import random

    from prometheus_client import CollectorRegistry

    from duetime.hooks import AttemptInfo, AttemptOutcome, AttemptResult

    rng = random.Random(7)
    attempts = []
    for n in range(3_000):
        task = rng.choice(["a", "b", ""])
        lateness = rng.choice([0.0, 0.0001, 0.001, 0.5, 60.0, 100.0, rng.uniform(-0.01, 2)])
        duration = rng.choice([0.0005, 1.0, 3600.0, 7200.0, rng.uniform(0, 5)])
        outcome = rng.choice(list(AttemptOutcome))
        attempts.append((n, task, lateness, duration, outcome))
    hooks = PrometheusHooks(CollectorRegistry())
    tally = metrics.AttemptTally(metrics.task_metrics(CollectorRegistry()), "q")
    for n, task, lateness, duration, outcome in attempts:
        info = AttemptInfo("q", f"id{n}", task, 1, 3, 100.0, 100.0 + lateness, "w")
        hooks.before_attempt(info)
        hooks.after_attempt(info, AttemptResult(outcome, duration))
        tally.started_tasks.append(task)
        tally.started.append(info.started_at - info.run_at)  # the very float hooks see
        tally.ended_tasks.append(task)
        tally.ended.append((outcome, duration))
        if n % 700 == 0:
            tally.flush()  # flushes of several sizes add up
    tally.flush()
    tally.flush()  # nothing new: changes nothing

    def families(registry_metrics: Any) -> dict[str, list[Any]]:
        found = {}
        for family in registry_metrics.collect():
            found[family.name] = sorted(
                (s.name, sorted(s.labels.items()), s.value) for s in family.samples
            )
        return found

    expected = families(hooks._metrics)
    got = families(tally._metrics)
    for name, samples_ in expected.items():
        assert len(samples_) == len(got[name]), name
        for (e_name, e_labels, e_value), (g_name, g_labels, g_value) in zip(
            samples_, got[name], strict=True
        ):
            assert (e_name, e_labels) == (g_name, g_labels)
            assert g_value == pytest.approx(e_value), (name, e_labels)


def test_a_metrics_port_worker_counts_tasks_dead_without_running(
    redis_url: str, queue_name: str
) -> None:
    """A worker with metrics_port and no PrometheusHooks of its app's own counts with its
    built-in tally. Before, only PrometheusHooks.on_dead counted tasks sent to dead
    unstarted, so the DuetimeUnknownHandler alert could never fire for such a worker.
    The other per-attempt families come from the tally too."""
    port = free_port()
    settings = RETRY_FAST.replace(metrics_port=port)
    app = App()
    ok, flaky, broken = add_ok_flaky_broken(app)

    with Queue(queue_name, redis_url, settings=settings) as queue:
        for task in (ok, flaky, broken, "nobody", "nobody", "nobody"):
            queue.schedule_now({}, task=task)

        async def scenario() -> str:
            worker = Worker(app, queue_name, redis_url, settings=settings)
            # The dispatcher promotes the retries.
            async with running(Dispatcher([queue_name], redis_url, settings=settings), worker):
                await wait_until(
                    lambda: (worker.counters.succeeded, worker.counters.dead) == (2, 4),
                    what="two tasks done and four dead",
                )
                # The tally is flushed with each batch of acks and at each heartbeat.
                return await asyncio.to_thread(
                    wait_for_sample, port, "duetime_tasks_dead_unstarted_total", queue_name
                )

        found = samples(asyncio.run(scenario()))
    mine = {"queue": queue_name}
    assert by(series(found, "duetime_tasks_dead_unstarted_total", **mine), "task") == {"nobody": 3}
    # The other per-attempt families, as documented, from the tally alone.
    assert_ok_flaky_broken_attempts(found, mine, ok_runs=1)
    for task, attempts in (("ok", 1), ("flaky", 2), ("broken", 2)):
        lateness = assert_histogram(
            found, "duetime_task_lateness_seconds", LATENESS_BUCKETS, **mine, task=task
        )
        duration = assert_histogram(
            found, "duetime_task_duration_seconds", DURATION_BUCKETS, **mine, task=task
        )
        assert lateness == duration == attempts
    assert of(found, "duetime_queue_up", **mine) == 1
    assert by(series(found, "duetime_queue_tasks", **mine), "state")["dead"] == 4


def wait_for_sample(port: int, name: str, queue: str) -> str:
    """A scrape that has a sample of ``name`` for ``queue``."""
    scraped: list[str] = []

    def has_it() -> bool:
        scraped.append(scrape(port))
        return bool(series(samples(scraped[-1]), name, queue=queue))

    wait_until_sync(has_it, what=f"a sample of {name}")
    return scraped[-1]
