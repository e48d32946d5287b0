"""Handlers for tests that run workers as separate processes. They record each run
in the server named by $DUETIME_TEST_RECORD_URL, so the test can watch them."""

from __future__ import annotations

import os
import time

import redis

import duetime

app = duetime.App()
_record = redis.Redis.from_url(os.environ.get("DUETIME_TEST_RECORD_URL", "redis://127.0.0.1:1/0"))
RUNS = "test:runs"


@app.default
def record(data: dict[str, object]) -> None:
    context = duetime.current_task()
    _record.rpush(RUNS, f"{context.id}:{context.attempt}")


@app.task
def stall_first_attempt(data: dict[str, object]) -> None:
    """Records the run; the first attempt then hangs so the test can kill the process."""
    context = duetime.current_task()
    _record.rpush(RUNS, f"{context.id}:{context.attempt}")
    if context.attempt == 1:
        time.sleep(60)


@app.task
async def slow(data: dict[str, float]) -> None:
    import asyncio

    context = duetime.current_task()
    await asyncio.sleep(float(data.get("seconds", 0.5)))
    _record.rpush(RUNS, f"{context.id}:{context.attempt}")
