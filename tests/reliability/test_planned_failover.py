"""Planned Sentinel failovers under load (``make reliability`` only; the short version is
tests/integration/test_sentinel.py::test_a_planned_failover_loses_no_acknowledged_schedule).

A master, a replica and three sentinels; a dispatcher and two worker processes on a
redis+sentinel:// URL with the default settings; two producers (a ``Queue`` in a thread
and an ``AsyncQueue`` in another) schedule tasks due from now to 3 s ahead, one call at
a time, for at least 75 s (about 85 s), while ``SENTINEL FAILOVER`` is sent three
times, 3-6 s after the previous one is over (the new master named and the old one a
healthy replica of it in every sentinel's eyes, about 21 s after the command).
Then everything runs to completion and the ledger (scenario.py's machinery) counts
the acknowledged schedules, the lost ones, the duplicates and the early starts.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import pytest
import redis

from duetime import AsyncQueue, Job, Queue, Settings
from duetime.errors import RedisUnavailableError
from tests.helpers import wait_until_sync
from tests.reliability.ledger import Fault, Ledger, compare
from tests.reliability.scenario import (
    SEED,
    SOAK,
    Fleet,
    dump,
    fail_on,
    invariant_problems,
    leftovers,
    pause_until,
    report,
)
from tests.reliability.test_scale_out import (
    SENTINEL_QUEUE,
    Stream,
    drain,
    info,
    seen_as_replica,
    sentinel_shut_down,
    switches,
    unexplained_repeats,
)
from tests.servers import SERVICE, Sentinels, Server, command

#: Least seconds of load, and how many planned failovers happen during it.
DURATION = 75.0
FAILOVERS = 3


class AsyncStream(Stream):
    """A ``Stream`` whose calls go through an ``AsyncQueue`` on its own event loop."""

    def run(self) -> None:
        try:
            asyncio.run(self._produce())
        except Exception as error:  # opening or closing the queue
            self.failures.append(repr(error))

    async def _produce(self) -> None:
        count = 0
        pace = time.monotonic()
        async with AsyncQueue(self.queue, self.url, settings=self.settings) as queue:
            while not self._halt.is_set():
                [job] = self.make(count, time.time())
                count += 1
                assert job.at is not None
                started, outcome = time.time(), "acknowledged"
                try:
                    await queue.schedule_task(job.at, job.data, task=str(job.task), id=str(job.id))
                except RedisUnavailableError:
                    outcome = "unavailable"
                    with self.lock:
                        self.unavailable += 1
                        self.maybe.add(str(job.id))
                except Exception as error:  # the test owns the assertion
                    outcome = "failed"
                    with self.lock:
                        self.failures.append(repr(error))
                        self.maybe.add(str(job.id))
                else:
                    with self.lock:
                        self.acked[str(job.id)] = float(job.at)  # type: ignore[arg-type]
                self.calls += 1
                self.timeline.append((started, time.time(), outcome))
                pace += 1 / self.rate
                await asyncio.sleep(max(0.0, pace - time.monotonic()))


def planned_failover(sentinels: Sentinels) -> tuple[Fault, float, float]:
    """``SENTINEL FAILOVER`` once the replica is one every sentinel could promote; wait
    for the new master to be named, then for the old one to be a healthy replica of it
    in every sentinel's eyes (so the next failover can go back). Returns the failover as
    a fault (from the command to the old master's demotion) and the seconds until the
    switch and until the demotion."""
    assert sentinels.master is not None and sentinels.replica is not None
    old = sentinels.master_port()
    new = sentinels.replica.port if sentinels.master.port == old else sentinels.master.port
    wait_until_sync(
        lambda: seen_as_replica(sentinels, new, old), timeout=60, what="a promotable replica"
    )
    started = time.time()
    manager = redis.Redis(port=sentinels.ports[0])
    try:
        command(manager, "SENTINEL", "FAILOVER", SERVICE)
    finally:
        manager.close()
    wait_until_sync(lambda: sentinels.master_port() != old, timeout=30, what="the switch")
    switched = time.time()
    assert sentinels.master_port() == new

    def demoted() -> bool:
        mine = info(old, "replication")
        return (
            mine.get("role") == "slave"
            and mine.get("master_port") == new
            and mine.get("master_link_status") == "up"
            and seen_as_replica(sentinels, old, new)
        )

    wait_until_sync(demoted, timeout=60, what="the old master a replica of the new one")
    ended = time.time()
    return Fault("planned failover", started, ended), switched - started, ended - started


@pytest.mark.skipif(not SOAK, reason="long-only (DUETIME_SOAK=1)")
def test_planned_sentinel_failovers_under_load(
    fleet: Fleet,
    streams: list[Stream],
    sentinels: Sentinels,
    ledger_server: Server,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Three planned failovers while two producers (sync and asyncio) schedule and a
    dispatcher and two workers, all with the default settings, run the tasks. No
    acknowledged schedule is lost, none starts early, every duplicate is explained by a
    failover (a lease or worker lost to it), and the queue's invariants hold."""
    rng = random.Random(SEED)
    env = {"DUETIME_TEST_RECORD_URL": ledger_server.url}  # otherwise the defaults
    defaults = Settings()
    lease, ttl = defaults.lease_duration, defaults.worker_ttl
    url = sentinels.url
    dispatchers = [fleet.start("dispatcher", SENTINEL_QUEUE, url, env)]
    workers = [fleet.start("worker", SENTINEL_QUEUE, url, env, "-c", "10") for _ in range(2)]
    ledger_client = ledger_server.client()
    ledger = Ledger(ledger_client)

    def maker(prefix: str) -> Callable[[int, float], list[Job]]:
        tasks = random.Random(f"{SEED}{prefix}")

        def make(number: int, now: float) -> list[Job]:
            work = round(tasks.uniform(0.0, 0.05), 3)
            at = now + tasks.uniform(0.0, 3.0)
            return [Job({"work": work}, at=at, task="ledger", id=f"{prefix}{number}")]

        return make

    faults: list[Fault] = []
    switch_s: list[float] = []
    demote_s: list[float] = []
    with Queue(SENTINEL_QUEUE, url) as queue:
        try:
            wait_until_sync(
                lambda: len(queue.stats().workers) >= 2, timeout=30, what="2 workers registered"
            )
            producers = [
                Stream(url, SENTINEL_QUEUE, maker("s"), rate=40.0),
                AsyncStream(url, SENTINEL_QUEUE, maker("a"), rate=40.0),
            ]
            streams.extend(producers)
            for producer in producers:
                producer.start()
            began = time.time()
            moment = began + rng.uniform(5.0, 8.0)
            for _ in range(FAILOVERS):
                pause_until(moment)
                fault, switched, demoted = planned_failover(sentinels)
                faults.append(fault)
                switch_s.append(switched)
                demote_s.append(demoted)
                moment = time.time() + rng.uniform(3.0, 6.0)
            pause_until(max(moment, began + DURATION))
            for producer in producers:
                producer.halt()
            lost = [
                task_id
                for producer in producers
                for task_id in drain(ledger, queue, producer, fleet)
            ]
            master = redis.Redis(port=sentinels.master_port())
            try:
                sentinel_shut_down(fleet, master, workers, dispatchers)
                dump(fleet, ledger, faults)
                acked = {task_id: at for p in producers for task_id, at in p.acked.items()}
                maybe = {task_id for p in producers for task_id in p.maybe}
                # A run around a failover may have lost its lease, or its worker been
                # reaped: it may run again, and its attempt number may be given again.
                verdict = compare(
                    ledger, acked, maybe=maybe, faults=faults, before=lease, after=lease + ttl + 1.0
                )
                repeated = unexplained_repeats(ledger, faults, lease, lease + ttl + 1.0)
                left = leftovers(master, SENTINEL_QUEUE)
                problems = invariant_problems(verdict, queue, left, fleet, skip=("repeated",))
                problems += [f"ledger: repeated attempt number, no failover: {r}" for r in repeated]
                problems += [f"producer: {failure}" for p in producers for failure in p.failures]
                # Only the planned failovers: one the sentinels made on their own would be
                # a fault the verdict does not know of.
                if switches(sentinels) != [len(faults)] * len(sentinels.ports):
                    problems.append(f"sentinels switched {switches(sentinels)} times")
                counters = queue.stats().counters
            finally:
                master.close()
        finally:
            ledger_client.close()
    presumed_dead = sum(
        d.log.read_text(errors="replace").count("had been presumed dead") for d in workers
    )
    report(
        "sentinel: planned failovers under load",
        capsys,
        seconds=round(time.time() - began),
        failovers=len(faults),
        switch_s=[round(s, 1) for s in switch_s],
        demoted_s=[round(s, 1) for s in demote_s],
        calls={type(p).__name__: p.calls for p in producers},
        acknowledged=len(acked),
        acknowledged_lost=len(lost),
        lost_ids=lost[:20],
        unavailable_calls=sum(p.unavailable for p in producers),
        workers_presumed_dead=presumed_dead,
        repeated_attempt_numbers=len(verdict.repeated),
        counters=counters,
        **verdict.summary(),
    )
    fail_on(problems)
    assert len(faults) == FAILOVERS
