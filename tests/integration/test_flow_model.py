"""Flow control against a model, on a real server: random steps (schedule with keys and
priorities, promote, claims by several workers, acks, failures, snoozes, expired leases,
cancels, limit changes) on a clock the test drives. After every step: no key runs more
tasks than its concurrency, the queue no more than its cap, no rate limit lets more
starts through than it allows, no task starts before its run-at, and the invariant
checker finds nothing. At the end every task has finished."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator

import pytest

from duetime import Job, KeyLimits, Limits, ManualClock, Queue, Rate, Settings
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from duetime.store.plans.working import Claimed, Outcome
from duetime.store.redis.runner import SyncRunner

T0 = 1_800_000_000_000
KEYS = ["a", "b", "c", None]
WORKERS = ["w1", "w2", "w3"]
LEASE_MS = 5_000


class Model:
    def __init__(self, redis_url: str, queue_name: str, seed: int) -> None:
        self.random = random.Random(seed)
        self.clock = ManualClock(T0)
        self.runner = SyncRunner(redis_url, Settings())
        self.operations = QueueOperations(QueueKeys(queue_name), self.clock)
        self.queue = Queue(queue_name, redis_url, clock=self.clock)
        self.limits = Limits(
            cap=5,
            each_key=KeyLimits(concurrency=2),
            keys={"a": KeyLimits(concurrency=1, rate=Rate(2, per=1.0))},
        )
        self.queue.set_limits(self.limits)
        self.key_of: dict[str, str | None] = {}
        self.run_at: dict[str, int] = {}
        self.running: dict[str, tuple[str, Claimed]] = {}  # task id -> (worker, claim)
        self.finished: set[str] = set()
        self.cancelled: set[str] = set()
        self.starts: dict[str | None, list[int]] = defaultdict(list)

    def close(self) -> None:
        self.queue.close()
        self.runner.close()

    # --- steps ------------------------------------------------------------------

    def schedule(self) -> None:
        jobs, delays = [], []
        for _ in range(self.random.randint(1, 6)):
            key = self.random.choice(KEYS)
            delays.append(self.random.choice([0, 0, 0.2, 1.5]))
            jobs.append(Job({"k": key}, delay=delays[-1], limit_key=key,
                            priority=self.random.randint(-3, 3)))  # fmt: skip
        now = self.clock.now_ms() or T0
        ids = self.queue.schedule_many(jobs)
        for job, delay, task_id in zip(jobs, delays, ids, strict=True):
            self.key_of[task_id] = job.limit_key
            self.run_at[task_id] = now + round(delay * 1000)

    def promote(self) -> None:
        self.runner.run(self.operations.dispatcher.promote_due(1000))

    def claim(self) -> None:
        worker = self.random.choice(WORKERS)
        most = self.random.randint(1, 4)
        claimed = self.runner.run(self.operations.worker.claim(worker, LEASE_MS, most)) or []
        now = self.clock.now_ms() or T0
        for item in claimed:
            assert item.task_id not in self.running, f"{item.task_id} started twice at once"
            key = self.key_of[item.task_id]
            if key is not None:  # a start needs a free slot (a lowered limit stops starts)
                own = self.limits.keys.get(key, self.limits.each_key)
                held = sum(1 for i in self.running if self.key_of[i] == key)
                assert own.concurrency is None or held < own.concurrency, (key, held)
            assert now >= self.run_at[item.task_id] or item.early_run_at_ms is not None
            self.running[item.task_id] = (worker, item)
            self.starts[self.key_of[item.task_id]].append(now)

    def finish(self) -> None:
        if not self.running:
            return
        task_id = self.random.choice(sorted(self.running))
        worker, item = self.running.pop(task_id)
        how = self.random.random()
        if how < 0.7:
            [acked] = self.runner.run(
                self.operations.worker.ack(worker, [Outcome(task_id, item.attempt)])
            )
            assert acked
            self.finished.add(task_id)
        elif how < 0.85:
            assert self.runner.run(
                self.operations.worker.fail(worker, task_id, item.attempt, b"x", 100)
            )
        else:
            whole = self.random.random() < 0.5
            assert self.runner.run(
                self.operations.worker.snooze(worker, task_id, item.attempt, 300, whole)
            )

    def expire(self) -> None:
        """A worker dies: its leases run out and a dispatcher takes them back."""
        self.clock.advance((LEASE_MS + 1) / 1000)
        self.runner.run(self.operations.dispatcher.reap_expired_leases(1000))
        self.running.clear()

    def cancel(self) -> None:
        gone = self.running.keys() | self.finished | self.cancelled
        waiting = [i for i in self.key_of if i not in gone]
        if waiting:
            task_id = self.random.choice(waiting)
            if self.queue.cancel(task_id):
                self.cancelled.add(task_id)

    def change_limits(self) -> None:
        concurrency = self.random.randint(1, 3)
        self.queue.set_key_limits("b", KeyLimits(concurrency=concurrency))
        self.limits = self.queue.limits() or self.limits

    def tick(self) -> None:
        """Time passes; live workers renew their leases as their heartbeats would."""
        self.clock.advance(self.random.choice([1, 50, 250, 600]) / 1000)
        for worker in WORKERS:
            held = [(i, item.attempt) for i, (w, item) in self.running.items() if w == worker]
            if held:
                reply = self.runner.run(self.operations.worker.heartbeat(worker, LEASE_MS, held))
                assert reply.lost == []

    # --- what must hold after every step ----------------------------------------

    def check(self) -> None:
        assert len(self.running) <= (self.limits.cap or 10**9)
        # Key "a": 2 a second, burst 1: no 1-second span holds more than count + burst.
        starts = self.starts["a"]
        for n, at in enumerate(starts):
            assert sum(1 for t in starts[n:] if t < at + 1000) <= 3, starts
        assert self.queue.check() == []


STEPS = ("schedule", "promote", "claim", "claim", "finish", "finish", "tick", "tick",
         "cancel", "change_limits", "expire")  # fmt: skip


@pytest.fixture
def model(redis_url: str, queue_name: str, request: pytest.FixtureRequest) -> Iterator[Model]:
    instance = Model(redis_url, queue_name, request.param)
    yield instance
    instance.close()


@pytest.mark.parametrize("model", range(6), indirect=True)
def test_random_steps_keep_every_limit_and_lose_nothing(model: Model) -> None:
    for _ in range(250):
        step = model.random.choice(STEPS[:-1] if model.random.random() > 0.02 else STEPS)
        getattr(model, step)()
        model.check()
    # Drain: every task not cancelled finishes.
    for _ in range(2000):
        if model.finished | model.cancelled >= set(model.key_of):
            break
        model.tick()
        model.promote()
        model.claim()
        while model.running:
            task_id = next(iter(model.running))
            worker, item = model.running.pop(task_id)
            assert model.runner.run(
                model.operations.worker.ack(worker, [Outcome(task_id, item.attempt)])
            )
            model.finished.add(task_id)
        model.check()
    assert model.finished | model.cancelled == set(model.key_of)
    flow = model.queue.flow()
    assert (flow.due, flow.running) == (0, 0)
