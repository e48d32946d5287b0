"""Real daemon processes: kill -9 mid-task, forked workers, graceful SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import redis

from duetime import Queue
from duetime.states import TaskState
from duetime.store.plans.keys import QueueKeys
from tests.apps import RUNS
from tests.helpers import decoded, wait_until_sync

FAST_ENV = {
    "DUETIME_HEARTBEAT_INTERVAL": "0.2",
    "DUETIME_WORKER_TTL": "1.0",
    "DUETIME_LEASE_DURATION": "2.0",
    "DUETIME_RETRY_BASE": "0.05",
    "DUETIME_SHUTDOWN_GRACE": "5",
}


class Daemons:
    def __init__(self, redis_url: str) -> None:
        self.env = {**os.environ, **FAST_ENV, "DUETIME_REDIS_URL": redis_url,
                    "DUETIME_TEST_RECORD_URL": redis_url}  # fmt: skip
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, *arguments: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-m", "duetime", "--log-level", "warning", *arguments],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)
            if process.stderr:
                process.stderr.close()


@pytest.fixture
def daemons(redis_url: str) -> Iterator[Daemons]:
    group = Daemons(redis_url)
    yield group
    group.stop_all()


def runs(raw: redis.Redis) -> list[str]:
    return decoded(raw.lrange(RUNS, 0, -1))


def one_done_and_one_running(queue: Queue, raw: redis.Redis, seconds: float) -> tuple[str, str]:
    """A quick task run to the end, then a slow one (``seconds``) left running."""
    quick = queue.schedule_now({"n": 1})
    wait_until_sync(lambda: len(runs(raw)) == 1, timeout=20, what="a quick task")
    slow = queue.schedule_now({"seconds": seconds}, task="slow")

    def slow_is_running() -> bool:
        status = queue.status(slow)
        return status is not None and status.state == TaskState.RUNNING

    wait_until_sync(slow_is_running, timeout=20, what="the slow task running")
    return quick, slow


def test_kill_9_mid_task_the_task_runs_exactly_once_more(
    daemons: Daemons, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    daemons.start("dispatcher", "--queue", queue_name)
    victim = daemons.start("worker", "tests.apps:app", "--queue", queue_name)
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now({"a": 1}, task="stall_first_attempt", max_attempts=3)
        wait_until_sync(lambda: runs(raw) == [f"{task_id}:1"], timeout=20, what="the first attempt")
        victim.kill()  # SIGKILL while the handler runs
        victim.wait(10)
        daemons.start("worker", "tests.apps:app", "--queue", queue_name)
        wait_until_sync(lambda: queue.status(task_id) is None, timeout=20, what="the recovery")
        assert runs(raw) == [f"{task_id}:1", f"{task_id}:2"]
        assert queue.check() == []


def test_forked_workers_share_the_queue_and_stop_gracefully(
    daemons: Daemons, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    daemons.start("dispatcher", "--queue", queue_name)
    parent = daemons.start("worker", "tests.apps:app", "--queue", queue_name, "--processes", "2")
    wait_until_sync(lambda: raw.zcard(keys.workers) == 2, timeout=20, what="two worker processes")
    with Queue(queue_name, redis_url) as queue:
        ids = [queue.schedule_now({"n": n}, task="slow") for n in range(40)]
        wait_until_sync(lambda: len(runs(raw)) == 40, timeout=30, what="all tasks")
        assert sorted(entry.split(":")[0] for entry in runs(raw)) == sorted(ids)
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(20) == 0
        assert raw.zcard(keys.workers) == 0  # both children deregistered
        assert queue.check() == []


def test_sigterm_hands_back_running_tasks_and_exits_0(
    daemons: Daemons, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    daemons.env["DUETIME_SHUTDOWN_GRACE"] = "0.5"  # before the start, or it has no effect
    process = daemons.start("run", "tests.apps:app", "--queue", queue_name)
    with Queue(queue_name, redis_url) as queue:
        quick, stuck = one_done_and_one_running(queue, raw, seconds=30)
        process.send_signal(signal.SIGTERM)
        # Exited after the 0.5 s grace, long before the 30 s handler would have ended
        # (the default grace is 30 s, so a grace that did not apply fails this wait).
        assert process.wait(20) == 0
        assert len(runs(raw)) == 1  # the slow handler never finished
        assert queue.status(quick) is None
        status = queue.status(stuck)
        assert status is not None and status.state == "ready"
        assert raw.zcard(keys.workers) == 0
        assert queue.check() == []


def test_a_second_sigterm_hands_back_at_once_instead_of_waiting_out_the_grace(
    daemons: Daemons, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    daemons.env["DUETIME_SHUTDOWN_GRACE"] = "120"
    process = subprocess.Popen(
        [sys.executable, "-m", "duetime", "--log-level", "info", "run", "tests.apps:app",
         "--queue", queue_name],
        env=daemons.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    daemons.processes.append(process)
    said: list[str] = []
    assert process.stderr is not None
    stderr = process.stderr
    threading.Thread(target=lambda: said.extend(map(bytes.decode, stderr)), daemon=True).start()
    with Queue(queue_name, redis_url) as queue:
        quick, stuck = one_done_and_one_running(queue, raw, seconds=60)
        process.send_signal(signal.SIGTERM)
        # Signals of one kind do not queue: send the second once the first was taken.
        wait_until_sync(lambda: any("stopping gracefully" in line for line in said))
        process.send_signal(signal.SIGTERM)
        # Neither the 120 s grace nor the 60 s handler is waited for.
        assert process.wait(15) == 0
        assert queue.status(quick) is None
        status = queue.status(stuck)
        assert status is not None and status.state == "ready"  # handed back, not left to a reap
        assert raw.zcard(keys.workers) == 0
        assert queue.check() == []
