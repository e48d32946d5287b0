"""A scheduling client for test_clock_skew.py, run as its own process under the
wall-clock shim: ``python -m tests.reliability.skewed_client <redis url> <queue>``.

It speaks JSON lines on stdin/stdout:

1. prints ``{"wall_minus_server_us": N}``: its own wall clock (``time.time()``, which
   the shim moves) minus the server's TIME, so the test can see the shim is active;
2. reads one plan line, a list of ``{"delay_ms": D}`` (``schedule_in``) and
   ``{"at_ms": A}`` (``schedule_task`` at that server epoch) items, schedules them in
   order with the ``server_clock`` handler;
3. prints one line: per item, its task id, the server's TIME read just before the
   scheduling call and just after it (µs), which bound the moment it was scheduled, and
   in between, right after the call, the run-at stored as the task's score where it
   waits (ms; null if the task was not waiting, i.e. already due).
"""

from __future__ import annotations

import json
import sys
import time

import redis

from duetime import Queue
from duetime.store.plans.keys import QueueKeys
from tests.helpers import scheduled_score


def server_us(probe: redis.Redis) -> int:
    seconds, micros = probe.time()
    return int(seconds) * 1_000_000 + int(micros)


def main(url: str, queue_name: str) -> None:
    probe = redis.Redis.from_url(url)
    server_us(probe)  # connect first, so the reading below is one round trip
    wall_before = time.time_ns() // 1000
    server = server_us(probe)
    wall_after = time.time_ns() // 1000
    wall_minus_server = (wall_before + wall_after) // 2 - server
    print(json.dumps({"wall_minus_server_us": wall_minus_server}), flush=True)

    plan: list[dict[str, int]] = json.loads(sys.stdin.readline())
    done: list[dict[str, object]] = []
    with Queue(queue_name, url) as queue:
        for number, item in enumerate(plan):
            data = {"n": number}
            before = server_us(probe)
            if "delay_ms" in item:
                task_id = queue.schedule_in(item["delay_ms"] / 1000, data, task="server_clock")
            else:
                task_id = queue.schedule_task(item["at_ms"] / 1000, data, task="server_clock")
            stored = scheduled_score(probe, QueueKeys(queue_name), task_id)
            after = server_us(probe)
            done.append(
                {**item, "id": task_id, "before_us": before, "after_us": after, "stored_ms": stored}
            )
    print(json.dumps(done), flush=True)
    probe.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
