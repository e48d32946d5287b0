"""The command line in an 80-column terminal (#33): ids in tables are shown whole, so
they can be copied into the next command, and an error is not wrapped mid-phrase."""

from __future__ import annotations

import os
import subprocess
import sys

from duetime import Queue


def run(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "COLUMNS": "80", "DUETIME_REDIS_URL": redis_url}
    return subprocess.run(
        [sys.executable, "-m", "duetime", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )


def test_ids_are_whole_and_errors_unwrapped_at_80_columns(redis_url: str, queue_name: str) -> None:
    long_ids = [f"cron:flaky-maintenance-job:18000000{n:05d}" for n in range(4)]
    with Queue(queue_name, redis_url) as queue:
        for task_id in long_ids:
            queue.schedule_in(3600, {"error": "x" * 200}, id=task_id, task="a_handler_name")
    listed = run(redis_url, "tasks", "-q", queue_name, "--state", "scheduled")
    assert listed.returncode == 0, listed.stderr
    assert max(len(line) for line in listed.stdout.splitlines()) <= 80
    shown = listed.stdout.split()
    assert all(task_id in shown for task_id in long_ids)
    refused = run(redis_url, "inspect", "-q", "no-such-queue-" + "q" * 30)
    assert refused.returncode == 4
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "(check the name, --shards and --redis)" in lines[0]
