"""A worker kill -9 storm with debounced, throttled and unique tasks and cancelled ones
mixed in among plain ones, on real processes (the machinery of scenario.py):
producers keep calling a handful of keys, and a canceller cancels tasks before and
while they run, while workers are killed and restarted. Verdict: every call is carried
by a task that completed (0 lost), none started before its final run-at (0 early), a
task ran twice only where a kill explains it, a task whose cancel said yes never
completed (its history ends with the cancel, and holds no success), the checker finds
nothing, and once the dispatcher's sweep has run no record of a key is left behind."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import pytest

from duetime import Debounce, Job, Queue, Throttle, Unique
from duetime.keyed import KeyedMode, Scheduled
from duetime.states import HistoryOutcome
from duetime.store.plans.keys import QueueKeys
from tests.helpers import wait_until_sync
from tests.reliability.ledger import Fault, Ledger
from tests.reliability.scenario import (
    KINDS_IN_SOAK,
    SEED,
    STORM_ENV,
    Scenario,
    pause_until,
    pick,
)

#: Records of spent keys are swept at each maintenance pass: often, so that the verdict's
#: "nothing left behind" can wait for it.
KEYED_ENV = {
    **STORM_ENV,
    "DUETIME_MAINTENANCE_INTERVAL": "0.5",
    "DUETIME_CANCEL_GRACE": "2",
}


class Canceller(threading.Thread):
    """Cancels each task it is given at its moment (some before they start, most while
    they run), and keeps what each cancel said and when it was called."""

    def __init__(self, url: str, queue: str, moments: dict[str, float]) -> None:
        super().__init__(name="canceller", daemon=True)
        self.url, self.queue, self.moments = url, queue, moments
        self.said: dict[str, tuple[bool, float]] = {}  # id -> (cancel's reply, called at)
        self.failures: list[str] = []

    def run(self) -> None:
        try:
            with Queue(self.queue, self.url) as queue:
                for task_id, moment in sorted(self.moments.items(), key=lambda item: item[1]):
                    pause_until(moment)
                    called = time.time()
                    self.said[task_id] = (queue.cancel(task_id), called)
        except Exception as error:  # reported by the test, which owns the assertion
            self.failures.append(repr(error))

    def yes(self) -> dict[str, float]:
        """The tasks whose cancel said yes, with when it was called."""
        return {task_id: at for task_id, (said, at) in self.said.items() if said}


class KeyedCaller(threading.Thread):
    """Calls a few keys of each mode from a thread, each every 20 to 200 ms, and keeps
    every reply: the task that carries each call and its run-at as the reply gives it."""

    def __init__(self, url: str, queue: str, seed: int) -> None:
        super().__init__(name="keyed-caller", daemon=True)
        self.url, self.queue = url, queue
        self.random = random.Random(seed)
        self.replies: list[Scheduled] = []
        self.failures: list[str] = []
        self._halt = threading.Event()

    def modes(self) -> list[KeyedMode]:
        pick_one = self.random.choice
        return [
            pick_one([Debounce(f"d{n}", 0.3, max_wait=1.2) for n in range(4)]),
            pick_one([Throttle(f"t{n}", 0.5, trailing=n % 2 == 0) for n in range(2)]),
            pick_one([Unique(f"u{n}", until=("started", "finished")[n]) for n in range(2)]),
        ]

    def run(self) -> None:
        try:
            with Queue(self.queue, self.url) as queue:
                while not self._halt.is_set():
                    for mode in self.modes():
                        work = round(self.random.uniform(0.02, 0.2), 3)
                        reply = queue.schedule_keyed(
                            {"work": work},
                            task="ledger",
                            debounce=mode if isinstance(mode, Debounce) else None,
                            throttle=mode if isinstance(mode, Throttle) else None,
                            unique=mode if isinstance(mode, Unique) else None,
                        )
                        self.replies.append(reply)
                    self._halt.wait(self.random.uniform(0.02, 0.2))
        except Exception as error:  # reported by the test, which owns the assertion
            self.failures.append(repr(error))

    def halt(self) -> None:
        self._halt.set()
        self.join(60)
        assert not self.is_alive(), "the keyed caller did not stop"

    def carried(self) -> dict[str, float]:
        """Each task that carries calls, with its final run-at (epoch seconds): the
        latest a reply gave it. Dropped calls name the window's leading run; unique hits
        the live task: their replies give no run-at."""
        run_ats: dict[str, float] = {}
        for reply in self.replies:
            if reply.run_at is not None:
                run_ats[reply.id] = max(run_ats.get(reply.id, 0.0), reply.run_at)
        return run_ats


@pytest.fixture
def callers() -> Iterator[list[KeyedCaller]]:
    started: list[KeyedCaller] = []
    try:
        yield started
    finally:
        for caller in started:
            if caller.is_alive():
                caller.halt()


@KINDS_IN_SOAK
def test_worker_kill_9_storm_with_keyed_tasks(
    callers: list[KeyedCaller], scenario: Scenario
) -> None:
    scenario.configure(KEYED_ENV)
    rng, ledger, raw = scenario.rng, scenario.ledger, scenario.client
    url, queue_name = scenario.url, scenario.queue_name
    count, duration = pick(150, 3000), pick(5.0, 30.0)
    dispatchers, workers = scenario.start_fleet(dispatchers=1, workers=3, concurrency=10)
    begin = time.time() + 1.0
    jobs = [
        Job({"work": round(rng.uniform(0.02, 0.2), 3)}, at=begin + duration * i / count,
            task="ledger", id=f"s{i}")
        for i in range(count)
    ]  # fmt: skip
    kills: list[tuple[int, float]] = []
    # Tasks to cancel: plain and async handlers that take 0.3 to 1.5 s, each cancelled
    # from 0.2 s before its run-at to the end of its work.
    doomed = [
        Job({"work": round(rng.uniform(0.3, 1.5), 3)}, at=begin + duration * rng.random(),
            task=rng.choice(["ledger_stoppable", "ledger_stoppable_async"]), id=f"c{i}")
        for i in range(pick(40, 400))
    ]  # fmt: skip
    moments = {
        str(job.id): float(job.at) + rng.uniform(-0.2, job.data["work"])  # type: ignore[arg-type]
        for job in doomed
    }
    with scenario.queue() as queue:
        queue.set_history(100_000)  # keeps every attempt of the storm
        queue.schedule_many(jobs + doomed)
        caller = KeyedCaller(url, queue_name, SEED)
        callers.append(caller)
        caller.start()
        canceller = Canceller(url, queue_name, moments)
        canceller.start()
        moment = begin + rng.uniform(1.2, 2.2)
        while moment < begin + duration:
            pause_until(moment)
            victim = scenario.busy_worker(workers)
            kills.append((victim.pid, scenario.fleet.replace(victim, workers)))
            moment += rng.uniform(1.2, 2.2)
        caller.halt()
        canceller.join(60)
        assert caller.failures == [] and canceller.failures == []
        cancelled = canceller.yes()
        scheduled = {str(job.id): float(job.at) for job in jobs}  # type: ignore[arg-type]
        # A task whose cancel said no had completed already: it is owed a run like any.
        scheduled |= {
            str(job.id): float(job.at)  # type: ignore[arg-type]
            for job in doomed
            if str(job.id) not in cancelled
        }
        keyed = caller.carried()
        assert not keyed.keys() & scheduled.keys()
        scheduled |= keyed
        keys = QueueKeys(queue_name)

        def every_key_swept() -> None:
            try:
                wait_until_sync(
                    lambda: raw.hlen(keys.keyed) == 0 and raw.hlen(keys.keyed_tasks) == 0,
                    timeout=30,
                    what="every spent key's record swept",
                )
            except AssertionError as error:
                left = (
                    raw.hgetall(keys.keyed),
                    raw.zrange(keys.keyed_expiry, 0, -1, withscores=True),
                )
                raise AssertionError(f"{error}: {left}, now {time.time()}") from None

        end = scenario.end(
            queue,
            scheduled,
            workers=workers,
            dispatchers=dispatchers,
            timeout=duration + 60,
            settled=every_key_swept,
            maybe=cancelled,
            faults=[Fault("kill -9", at, at, frozenset({pid})) for pid, at in kills],
        )
        end.problems += completed_after_cancel(queue, cancelled)
    # Every call is carried by a task that completed (a dropped call by its window's
    # leading run, a unique hit by the live task).
    uncarried = {reply.id for reply in caller.replies} - ledger.done
    end.judge(
        "worker kill -9 storm with keyed tasks",
        kind=scenario.server.kind,
        plain=count,
        keyed_calls=len(caller.replies),
        keyed_tasks=len(keyed),
        cancels=f"{len(cancelled)} of {len(doomed)} said yes",
        stop_after_cancel_ms=stop_latency(ledger, cancelled),
        kills=len(kills),
    )
    assert uncarried == set(), f"seed {SEED}: calls carried by no completed task"
    outcomes = {reply.outcome for reply in caller.replies}
    assert {"created", "collapsed", "dropped", "existing"} <= outcomes, outcomes
    counters = end.counters
    assert counters.get("debounced", 0) > 0 and counters.get("unique_hits", 0) > 0


def completed_after_cancel(queue: Queue, cancelled: dict[str, float]) -> list[str]:
    """Tasks whose cancel said yes yet that completed, or are still kept, or whose history
    does not end with the cancel."""
    problems = []
    for task_id in sorted(cancelled):
        outcomes = [attempt.outcome for attempt in queue.history(100, task_id=task_id)]
        if HistoryOutcome.SUCCEEDED in outcomes:
            problems.append(f"{task_id} completed after its cancel said yes: {outcomes}")
        elif not outcomes or outcomes[0] != HistoryOutcome.CANCELLED:
            problems.append(f"{task_id}: its history does not end with the cancel: {outcomes}")
        if queue.status(task_id) is not None:
            problems.append(f"{task_id} is still kept after its cancel")
    return problems


def stop_latency(ledger: Ledger, cancelled: dict[str, float]) -> str:
    """From the cancel's call to the handler's stop, for the tasks that were running."""
    waits = sorted(
        ledger.stopped[task_id] - at * 1000 for task_id, at in cancelled.items()
        if task_id in ledger.stopped
    )  # fmt: skip
    if not waits:
        return "none stopped"
    middle, high = waits[len(waits) // 2], waits[min(len(waits) - 1, len(waits) * 99 // 100)]
    return f"{len(waits)} stopped: p50 {middle:.0f}, p99 {high:.0f}, max {waits[-1]:.0f}"
