"""examples/fastapi_app.py under a real uvicorn, in this test's event loop: a reminder
scheduled over HTTP is run by the worker the app's lifespan started, and the app's
shutdown stops the worker and the dispatcher cleanly (no task left on the loop, no thread
left behind, the worker deregistered, the invariants whole)."""

from __future__ import annotations

import asyncio
import socket
import threading

import httpx
import pytest
import uvicorn

from duetime import Queue
from examples import fastapi_app
from tests.helpers import wait_until


def test_a_reminder_scheduled_through_the_app_runs_in_its_own_worker(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))  # a free port, held from here on: no race for it
    base_url = f"http://127.0.0.1:{listening.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(fastapi_app.app, lifespan="on", log_config=None))

    async def scenario() -> None:
        serving = asyncio.create_task(server.serve(sockets=[listening]))
        await wait_until(lambda: server.started or serving.done(), what="uvicorn to start")
        assert not serving.done(), "the app did not start"
        async with httpx.AsyncClient(base_url=base_url, trust_env=False) as client:
            with Queue(fastapi_app.QUEUE, redis_url) as queue:
                started = lambda: len(queue.stats().workers) == 1  # noqa: E731
                await wait_until(started, what="the worker the lifespan started")

            created = await client.post("/reminders", json={"to": "ada@example.com"})
            assert created.status_code == 201, created.text
            path = f"/reminders/{created.json()['id']}"

            async def finished() -> bool:
                return bool((await client.get(path)).json()["state"] == "finished")

            await wait_until(finished, what="the app's worker to run the reminder")
            shown = (await client.get(path)).json()
            assert shown["result"] == {"sent_to": "ada@example.com", "attempt": 1}

            # Bad input is refused by duetime with a message, and by the route's model.
            refused = await client.get("/reminders/not an id")
            assert refused.status_code == 422 and "task id" in refused.json()["detail"]
            negative = await client.post("/reminders", json={"to": "x", "in_seconds": -1})
            assert negative.status_code == 422
            assert (await client.get("/reminders/unknown")).status_code == 404
        server.should_exit = True
        await serving
        assert asyncio.all_tasks() == {asyncio.current_task()}  # the daemons' tasks ended

    threads = set(threading.enumerate())
    asyncio.run(scenario())
    # Only the process's one precise timer may stay (duetime.clock, started once, ever).
    assert {thread.name for thread in set(threading.enumerate()) - threads} <= {"duetime-timer"}
    with Queue(fastapi_app.QUEUE, redis_url) as queue:
        stats = queue.stats()
        assert (stats.workers, stats.running, stats.ready) == ({}, 0, 0)  # deregistered
        assert stats.counters.get("completed") == 1
        assert queue.check() == []
