"""Cancels of running tasks heard as they are asked, on a real server: the cancel
publishes the task's id on its queue's channel and the worker holding it stops it then,
long before a heartbeat could have told it; with listening off, the heartbeat does."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import redis

from duetime import App, AsyncQueue, Worker, current_task
from duetime.store.plans.keys import QueueKeys
from tests.helpers import SLOW_HEARTBEAT, subscribers, wait_until
from tests.integration.test_cancel_running import none_completed, run_worker_until


def stoppable_app(started: threading.Semaphore, stopped: list[str]) -> App:
    """An async handler that waits forever and a plain function that looks at the flag."""
    app = App()

    @app.task
    async def waits(data: object) -> None:
        started.release()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.append("waits")
            raise

    @app.task
    def looks(data: object) -> None:
        started.release()
        while not current_task().cancelled:
            time.sleep(0.005)
        stopped.append("looks")
        current_task().raise_if_cancelled()

    return app


def cancel_both(listening: redis.Redis | None) -> Any:
    """A scenario: start one task of each handler, cancel both (once the worker listens
    on ``listening``, when given), wait for both to stop."""
    started = threading.Semaphore(0)
    stopped: list[str] = []

    async def scenario(client: AsyncQueue, worker: Worker) -> None:
        ids = [await client.schedule_now({}, task=name) for name in ("waits", "looks")]
        for _ in ids:
            assert await asyncio.to_thread(started.acquire, True, 10)
        if listening is not None:  # it subscribes beside its claimers: a cancel before is
            channel = QueueKeys(client.name).cancel_channel  # heard at the heartbeat only
            await wait_until(lambda: subscribers([listening], channel) == 1, what="listening")
        for task_id in ids:
            assert await client.cancel(task_id)
        await wait_until(lambda: sorted(stopped) == ["looks", "waits"], timeout=10)
        await wait_until(lambda: worker.counters.cancelled == 2, what="both ended")
        for task_id in ids:
            assert await client.status(task_id) is None

    return stoppable_app(started, stopped), scenario


def test_a_running_tasks_cancel_reaches_its_worker_before_any_heartbeat(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    app, scenario = cancel_both(raw)
    run_worker_until(queue_name, redis_url, app, scenario, **SLOW_HEARTBEAT)
    none_completed(queue_name, redis_url, cancelled=2)
    # The worker left its queue's channel when it stopped.
    assert subscribers([raw], QueueKeys(queue_name).cancel_channel) == 0


def test_with_listening_off_the_heartbeat_stops_it(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    app, scenario = cancel_both(None)
    run_worker_until(queue_name, redis_url, app, scenario, listen_for_cancels=False)
    none_completed(queue_name, redis_url, cancelled=2)
