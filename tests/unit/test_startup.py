"""DaemonStartup: the start-up and close the worker and the dispatcher share, in order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from duetime import ManualClock, metrics, startup
from duetime.settings import Settings
from duetime.store.plans.layout import QueueLayout
from duetime.store.plans.operations import QueueOperations
from duetime.store.plans.requests import Durability


def test_a_daemon_starts_and_closes_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Metrics exported first, then the server checked, the daemon registered and the
    start-up objects frozen; on the way out the runner is closed before the steps that
    wait for it, and the metrics export is taken back last."""
    done: list[str] = []

    def export(settings: Settings, redis: Any, queues: Any, shards: int, dispatchers: Any) -> Any:
        done.append(f"export {list(queues)} {shards}")
        return lambda: done.append("unexport")

    async def note(what: str, *_: Any) -> None:
        done.append(what)

    monkeypatch.setattr(metrics, "export", export)
    monkeypatch.setattr(startup, "warn_if_evicting", lambda *a: note("evicting", *a))
    monkeypatch.setattr(startup, "warn_if_beyond", lambda _, layout: note(f"beyond {layout.queue}"))
    monkeypatch.setattr(startup, "check_durability", lambda *a: note("durability", *a))
    monkeypatch.setattr(startup, "freeze_startup_objects", lambda _: done.append("freeze"))
    layouts = [QueueLayout("a", 2), QueueLayout("b", 2)]
    operations = QueueOperations(layouts[0].shards[0], ManualClock(0))

    async def scenario() -> None:
        settings = Settings(metrics_port=9999)
        async with startup.DaemonStartup("redis://127.0.0.1:1/0", settings) as started:
            closed = started.runner.close

            async def close() -> None:
                done.append("runner closed")
                await closed()

            monkeypatch.setattr(started.runner, "close", close)
            started.after_runner_closed(lambda: note("after the runner"))
            await started.prepare(
                layouts,
                operations,
                lambda: note("register"),
                durability=Durability(0, 0, fsync=True),
            )
            done.append("work")

    asyncio.run(scenario())
    assert done == [
        "export ['a', 'b'] 2",
        "evicting",
        "beyond a",
        "beyond b",
        "durability",
        "register",
        "freeze",
        "work",
        "runner closed",
        "after the runner",
        "unexport",
    ]
