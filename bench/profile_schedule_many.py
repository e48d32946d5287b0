"""Where the time of one large ``schedule_many`` goes, per task.

Times the phases of ``Queue.schedule_many`` with wrappers around them: validation
(``prepare_all``), sorting the tasks into delayed buckets (``schedule_calls``, whose
calls are made later, while the first ones run on the server), and the round trip
(the runner sending the calls as it makes them, then reading the replies). The
server's own time comes from ``INFO commandstats`` (``EVALSHA`` usec), the garbage
collector's from ``gc.callbacks``. Best of ``--rounds`` rounds, each on a fresh queue::

    .venv/bin/python bench/profile_schedule_many.py [--tasks 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import gc
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from benchlib import Server

import duetime
from duetime.client import QueueCore
from duetime.store.plans.producing import ProducerPlans
from duetime.store.redis import runner

PAYLOAD = b"0123456789abcdef"


def timed(spent: dict[str, float], owner: Any, name: str) -> None:
    """Add the time of each call of ``owner.name`` to ``spent[name]``."""
    original: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - began

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--server", choices=("redis", "valkey"), default="redis")
    args = parser.parse_args()
    spent: dict[str, float] = {}
    timed(spent, QueueCore, "prepare_all")
    timed(spent, ProducerPlans, "schedule_calls")
    timed(spent, runner.SyncRunner, "_script_calls")
    collecting = {"began": 0.0}

    def on_collection(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collecting["began"] = time.perf_counter()
        else:
            spent["garbage collector"] = (
                spent.get("garbage collector", 0.0) + time.perf_counter() - collecting["began"]
            )

    workdir = Path(tempfile.mkdtemp(prefix="duetime-profile-"))
    server = Server(args.server, workdir)
    best: dict[str, float] = {}
    try:
        server.start()
        raw = redis.Redis.from_url(server.url)
        for round_number in range(args.rounds):
            queue = duetime.Queue(f"profile-{round_number}", server.url)
            queue.schedule_in(3600, PAYLOAD)  # connects, loads the script
            at = time.time() + 3600
            jobs = [(at + i / 1000, PAYLOAD) for i in range(args.tasks)]
            raw.config_resetstat()
            spent.clear()
            gc.collect()
            gc.callbacks.append(on_collection)
            began = time.perf_counter()
            queue.schedule_many(jobs)
            spent["all (wall)"] = time.perf_counter() - began
            gc.callbacks.remove(on_collection)
            stats = raw.info("commandstats")["cmdstat_evalsha"]
            spent["server (EVALSHA)"] = stats["usec"] / 1e6
            for name, seconds in spent.items():
                best[name] = min(best.get(name, seconds), seconds)
            queue.close()
        raw.close()
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"schedule_many of {args.tasks:,} delayed tasks, best of {args.rounds} rounds:")
    print(f"  {args.tasks / best['all (wall)']:,.0f} tasks/s")
    labels = {
        "prepare_all": "validation (prepare_all)",
        "schedule_calls": "sorting into buckets (schedule_calls)",
        "_script_calls": "calls made and sent, replies read (overlaps the server)",
    }
    for name, seconds in best.items():
        print(f"  {labels.get(name, name):58s} {seconds / args.tasks * 1e6:6.2f} µs a task")


if __name__ == "__main__":
    main()
