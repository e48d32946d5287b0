"""A frozen worker on a real server: a worker process stopped with SIGSTOP is shown late,
then silent (with since when and the tasks it holds), and once a dispatcher takes it for
dead and reaps it, gone (with the tasks taken back), at the default settings, on the
Workers page and the overview; and the reap script's record of gone workers, which
those read, is exact and bounded."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner
from starlette.exceptions import StarletteDeprecationWarning

with warnings.catch_warnings():  # as in test_dashboard.py: the TestClient's httpx warning
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

from duetime import Dispatcher, ManualClock, Queue, Settings, WorkerState
from duetime.cli import main
from duetime.dashboard import create_app
from duetime.states import worker_state
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operating import GONE_KEPT
from tests.helpers import running, wait_until_sync

NOW_MS = 1_800_000_000_000
LEASE_MS = 60_000
TTL_MS = 5_000

#: A worker whose tasks sleep for a minute: it holds them when it is frozen.
SLEEPING_WORKER = """
import asyncio, sys, time
import duetime

app = duetime.App(default=lambda data: time.sleep(60))
worker = duetime.Worker(app, sys.argv[2], sys.argv[1], concurrency=2)
asyncio.run(worker.run())
"""


@pytest.fixture
def sleeping_worker(redis_url: str, queue_name: str) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [sys.executable, "-c", SLEEPING_WORKER, redis_url, queue_name],
        env={**os.environ},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield process
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait(timeout=30)


def states_on_page(html: str) -> list[str]:
    return re.findall(r'<tr data-worker="[^"]*" data-state="(\w+)"', html)


def test_a_frozen_worker_is_late_then_silent_then_gone_at_the_default_settings(
    redis_url: str, queue_name: str, sleeping_worker: subprocess.Popen[bytes]
) -> None:
    """The worker process takes two tasks, is stopped (SIGSTOP), and a dispatcher with the
    default settings runs throughout. The Workers page, read again and again, shows the
    worker alive, late, silent and gone in that order (late lasts a second at the
    defaults: a read may miss it), each with what an operator needs; the overview
    highlights it. It used to say "No worker is registered" once the worker was reaped."""
    settings = Settings()
    with Queue(queue_name, redis_url) as queue:
        ids = {queue.schedule_now({"n": n}) for n in range(2)}
        wait_until_sync(
            lambda: queue.stats().running == 2, timeout=60, what="the worker to take both tasks"
        )
        [worker_id] = queue.stats().workers
        app = create_app([queue_name], redis_url, settings=settings)
        pages: dict[str, tuple[str, str]] = {}  # state -> (Workers page, overview)
        seen: list[str] = []

        async def scenario(client: TestClient) -> None:
            sleeping_worker.send_signal(signal.SIGSTOP)
            async with running(Dispatcher([queue_name], redis_url, settings=settings)):
                deadline = time.monotonic() + 60
                while "gone" not in seen:
                    assert time.monotonic() < deadline, f"states seen: {seen}"
                    workers_page = (await asyncio.to_thread(client.get, "/workers")).text
                    overview = (await asyncio.to_thread(client.get, "/")).text
                    [state] = states_on_page(workers_page) or ["none"]
                    if not seen or seen[-1] != state:
                        seen.append(state)
                        pages[state] = (workers_page, overview)
                    await asyncio.sleep(0.05)

        with TestClient(app, base_url="http://127.0.0.1") as client:
            asyncio.run(scenario(client))
        assert "none" not in seen, f"the worker vanished from the page: {seen}"
        assert seen in (["alive", "late", "silent", "gone"], ["alive", "silent", "gone"]), seen

        silent_page, silent_overview = pages["silent"]
        assert "silent since" in silent_page and "row-bad" in silent_page
        assert all(f"task?id={task_id}" in silent_page for task_id in ids)  # what it holds
        assert '<span class="badge bad">1 silent</span>' in silent_overview
        assert '<dd class="warn-text"><a href="/workers">0</a>' in silent_overview  # no one alive

        gone_page, gone_overview = pages["gone"]
        assert "No worker is registered now: the last ones were taken for dead" in gone_page
        assert 'id="gone-workers"' in gone_page and worker_id in gone_page
        assert all(f"task?id={task_id}" in gone_page for task_id in ids)  # taken back
        assert "1 gone</a>" in gone_overview

        [gone] = queue.stats().gone_workers
        assert gone.id == worker_id and gone.taken_back == 2 and set(gone.task_ids) == ids
        assert gone.last_heartbeat is not None and gone.last_heartbeat < gone.reaped_at
        inspected = CliRunner().invoke(main, ["inspect", "-q", queue_name, "--redis", redis_url])
        assert f"{worker_id} (gone: taken for dead" in inspected.stdout
        assert "2 task(s) taken back" in inspected.stdout


def test_the_thresholds_come_before_the_reap() -> None:
    """At the defaults (heartbeats 1 s apart, reaped at 5 s): late after 2 s, silent
    after 3 s; with a TTL as short as allowed, silent at the TTL and never late first."""
    at = Settings()
    states = [worker_state(age, at.heartbeat_interval, at.worker_ttl) for age in (1.9, 2.1, 3.1)]
    assert states == [WorkerState.ALIVE, WorkerState.LATE, WorkerState.SILENT]
    assert worker_state(4.9, 1.0, 5.0) == WorkerState.SILENT
    assert worker_state(2.1, 1.0, 2.0) == WorkerState.SILENT


def test_the_reap_records_a_gone_worker_once_and_keeps_the_last_ones(
    redis_url: str, queue_name: str, raw: redis.Redis
) -> None:
    """Store and client level, with a test clock: a reap writes one entry (last heartbeat,
    when, the tasks taken back); a second dispatcher's reap of the same worker writes
    none; the record keeps the newest GONE_KEPT entries."""
    clock = ManualClock(NOW_MS)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        ops, run = queue.core.queue.operations, queue.runner.run
        ids = {queue.schedule_now({}, id=f"t{n}") for n in range(3)}
        run(ops.worker.heartbeat("w1", LEASE_MS, []))
        assert len(run(ops.worker.claim("w1", LEASE_MS, 10)) or []) == 3
        clock.advance(10)
        assert run(ops.dispatcher.reap_dead_workers(TTL_MS, 0)) == 3
        assert (
            run(ops.dispatcher.reap_dead_workers(TTL_MS, 0)) == 0
        )  # another dispatcher: nothing left
        assert run(ops.dispatcher.reap_worker("w1", NOW_MS + 10_000)) == 0
        [gone] = queue.stats().gone_workers
        assert (gone.id, gone.last_heartbeat, gone.reaped_at) == (
            "w1",
            NOW_MS / 1000,
            NOW_MS / 1000 + 10,
        )
        assert gone.taken_back == 3 and set(gone.task_ids) == ids
        assert queue.stats().workers == {}
        for n in range(GONE_KEPT + 5):
            run(ops.worker.heartbeat(f"idle{n}", LEASE_MS, []))
        clock.advance(10)
        run(ops.dispatcher.reap_dead_workers(TTL_MS, 0))
        kept = queue.stats().gone_workers
        assert len(kept) == GONE_KEPT and "w1" not in {g.id for g in kept}
        assert all(g.taken_back == 0 and g.task_ids == () for g in kept)
        assert raw.llen(QueueKeys(queue_name).gone_workers) == GONE_KEPT  # trimmed
        assert queue.check() == []
        # A record damaged by hand (another type) never fails a reap: it is left as it is.
        raw.delete(QueueKeys(queue_name).gone_workers)
        raw.set(QueueKeys(queue_name).gone_workers, "hand-written")
        run(ops.worker.heartbeat("w2", LEASE_MS, []))
        clock.advance(10)
        assert run(ops.dispatcher.reap_dead_workers(TTL_MS, 0)) == 0
        assert raw.zcard(QueueKeys(queue_name).workers) == 0  # reaped all the same
        assert raw.get(QueueKeys(queue_name).gone_workers) == b"hand-written"
