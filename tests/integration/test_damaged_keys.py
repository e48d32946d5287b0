"""A key of the queue that holds another type than duetime keeps there (written by hand
or by another program) makes the script that would write it fail before its first write:
the call raises DamagedKeyError naming that key, and every key of the queue is exactly
as it was (a script that fails half way keeps the writes it made, so a late failure would
leave a half-written task).

Each case brings a queue to a state where one step writes, runs the step once on a
healthy queue to learn which keys it writes, then, for each of those keys on a fresh
queue in the same state, damages the key and runs the step again."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from duetime import Job, Queue
from duetime.clock import ManualClock
from duetime.errors import DamagedKeyError
from duetime.store.plans.keys import QueueKeys, key_type
from duetime.store.plans.operations import QueueOperations
from duetime.store.plans.working import Outcome
from tests.conftest import require_binary
from tests.helpers import as_bytes
from tests.servers import Cluster

NOW_MS = 1_800_000_000_000
LEASE_MS = 60_000
#: Counters are bumped with pcall: one of the wrong type is left as it is and never
#: fails the step. A result key is replaced whole (DEL first). A damaged history
#: (history_state, history, history_tasks) records nothing and never fails the step
#: (test_history.py), and so does a damaged record of reaped workers, gone_workers
#: (test_frozen_workers.py).
TOLERATED = ("stats", "minutes", "result:", "history", "gone_workers")


@dataclass
class Env:
    raw: redis.Redis
    keys: QueueKeys
    queue: Queue
    clock: ManualClock
    ops: QueueOperations
    ids: list[str]

    def run(self, plan: Any) -> Any:
        return self.queue.runner.run(plan)

    def claim(self, count: int = 10) -> None:
        self.run(self.ops.worker.claim("w", LEASE_MS, count))


Step = Callable[[Env], Any]


def due_now(env: Env, count: int = 2) -> None:
    env.ids += [env.queue.schedule_now({"i": i}, id=f"now-{i}") for i in range(count)]


def claimed(env: Env) -> None:
    due_now(env)
    env.claim()


def dead(env: Env) -> None:
    claimed(env)
    env.run(env.ops.worker.fail("w", env.ids[0], 1, b"error", None))


def moved_by_blmove(env: Env) -> None:
    due_now(env, 1)
    env.raw.lmove(env.keys.ready, env.keys.active("w"), "LEFT", "RIGHT")


def delayed(env: Env, count: int = 40) -> None:
    env.ids += env.queue.schedule_many(
        [Job({"i": i}, delay=30 + i / 10, id=f"delayed-{i}") for i in range(count)]
    )


def due_for_promotion(env: Env) -> None:
    delayed(env)
    env.ids.append(env.queue.schedule_in(10, {"retry": True}, id="retry"))
    env.run(env.ops.dispatcher.promote_due(100))  # learns the buckets
    env.clock.set(NOW_MS + 31_000)


def cron_declared(env: Env) -> None:
    env.run(env.ops.cron.declare_cron([("job", b"definition", NOW_MS + 60_000)]))


def cron_fired(env: Env) -> None:
    cron_declared(env)
    env.run(fire(env))


def fire(env: Env) -> Any:
    # The job's row as fire_cron.lua reads it: name, score read, following score, overlap,
    # recheck time, tick to hold, ticks outside the window, max runs, pause after, whether
    # its first tick goes on from the one before, ticks.
    row = ["job", str(NOW_MS + 60_000), str(NOW_MS + 120_000), "allow", "0", "0", 0, 0, 0,
           "1", "cron:job:1", str(NOW_MS), b"envelope", ""]  # fmt: skip
    return env.ops.cron.fire_cron([row])


def cron_paused(env: Env) -> None:
    cron_declared(env)
    env.run(env.ops.cron.set_cron_next("job", None))


def then(prepare: Step, now_ms: int) -> Step:
    """``prepare``, then the clock set to ``now_ms``."""

    def both(env: Env) -> None:
        prepare(env)
        env.clock.set(now_ms)

    return both


def nothing(env: Env) -> None:
    pass


#: A retried, re-entered or handed-back task's note of when it became due again, which
#: its lateness counts from: written with pcall, like a counter, so a damaged ``early``
#: never stops recovery (the claim, which reads it, fails on it instead).
LATENESS_NOTE = ("early",)

#: name -> (bring the queue to a state, the step, keys the step may write without
#: failing when damaged, beyond TOLERATED)
CASES: dict[str, tuple[Step, Step, tuple[str, ...]]] = {
    "schedule due now": (nothing, lambda env: env.queue.schedule_now({}, id="new"), ()),
    "schedule delayed, earliest": (
        nothing,
        lambda env: env.queue.schedule_in(60, {}, id="new"),
        (),
    ),
    "schedule delayed, behind others": (
        lambda env: env.queue.schedule_in(30, {}, id="old"),
        lambda env: env.queue.schedule_in(60, {}, id="new"),
        (),
    ),
    "schedule after 2255": (
        nothing,
        lambda env: env.queue.schedule_task(datetime(2300, 1, 1, tzinfo=UTC), {}, id="new"),
        (),
    ),
    "schedule_many mixed": (
        lambda env: env.queue.schedule_in(3600, {}, id="old"),
        lambda env: env.queue.schedule_many(
            [Job({"i": i}, delay=1 + i, id=f"new-{i}") for i in range(60)]
            + [Job({"now": i}, delay=0, id=f"now-{i}") for i in range(2)]
            + [Job({"late": 1}, at=datetime(2300, 1, 1, tzinfo=UTC), id="late")]
        ),
        (),
    ),
    "cancel delayed": (delayed, lambda env: env.queue.cancel(env.ids[0]), ()),
    "cancel ready": (due_now, lambda env: env.queue.cancel(env.ids[0]), ()),
    "cancel dead": (dead, lambda env: env.queue.cancel(env.ids[0]), ()),
    "reschedule delayed": (
        delayed,
        lambda env: env.queue.reschedule(env.ids[0], (NOW_MS + 5_000) / 1000),
        (),
    ),
    "reschedule ready to later": (
        due_now,
        lambda env: env.queue.reschedule(env.ids[0], (NOW_MS + 5_000) / 1000),
        (),
    ),
    "reschedule delayed to now": (
        delayed,
        lambda env: env.queue.reschedule(env.ids[0], NOW_MS / 1000),
        (),
    ),
    # The layout's count is bumped with pcall, as counters are.
    "promote and stage": (
        due_for_promotion,
        lambda env: env.run(env.ops.dispatcher.promote_due(100, ahead_ms=1_000, stage_ms=5_000)),
        ("delayed_layout",),
    ),
    "claim from ready": (due_now, lambda env: env.claim(), ()),
    "claim taken by BLMOVE": (
        moved_by_blmove,
        lambda env: env.run(env.ops.worker.claim("w", LEASE_MS, 0, env.ids)),
        (),
    ),
    "heartbeat": (
        then(claimed, NOW_MS + 1_000),
        lambda env: env.run(env.ops.worker.heartbeat("w", LEASE_MS, [(i, 1) for i in env.ids], 1)),
        (),
    ),
    "ack": (
        claimed,
        lambda env: env.run(
            env.ops.worker.ack("w", [Outcome(i, 1, 60_000, b"result", 5) for i in env.ids])
        ),
        (),
    ),
    "fail, retry": (
        claimed,
        lambda env: env.run(env.ops.worker.fail("w", env.ids[0], 1, b"error", 1_000)),
        LATENESS_NOTE,
    ),
    "fail, dead": (
        claimed,
        lambda env: env.run(env.ops.worker.fail("w", env.ids[0], 1, b"error", None, 60_000, b"r")),
        (),
    ),
    "reap expired leases": (
        then(claimed, NOW_MS + LEASE_MS + 1),
        lambda env: env.run(env.ops.dispatcher.reap_expired_leases(100)),
        LATENESS_NOTE,
    ),
    "reap a silent worker": (
        claimed,
        lambda env: env.run(env.ops.dispatcher.reap_worker("w", NOW_MS + 1, 1_000)),
        LATENESS_NOTE,
    ),
    "release a stopping worker": (
        claimed,
        lambda env: env.run(env.ops.worker.release_worker("w", 1_000, 1)),
        LATENESS_NOTE,
    ),
    "give back": (
        moved_by_blmove,
        lambda env: env.run(env.ops.worker.give_back("w", env.ids[0])),
        (),
    ),
    "requeue dead": (
        dead,
        lambda env: env.run(env.ops.operator.requeue_dead(env.ids[:1])),
        LATENESS_NOTE,
    ),
    "purge dead": (dead, lambda env: env.run(env.ops.operator.purge_dead(env.ids[:1])), ()),
    "declare cron": (nothing, cron_declared, ()),
    "pause cron": (cron_declared, lambda env: env.run(env.ops.cron.set_cron_next("job", None)), ()),
    "resume cron": (
        cron_paused,
        lambda env: env.run(env.ops.cron.set_cron_next("job", NOW_MS + 1_000)),
        (),
    ),
    "fire cron": (cron_declared, lambda env: env.run(fire(env)), ()),
    "remove cron": (cron_fired, lambda env: env.run(env.ops.cron.remove_cron("job")), ()),
}


@pytest.fixture
def fresh(redis_url: str, raw: redis.Redis) -> Iterator[Callable[[], Env]]:
    """Makes an Env on a queue of its own, at NOW_MS on a manual clock."""
    queues: list[Queue] = []

    def make() -> Env:
        name = f"damaged-{uuid.uuid4().hex[:12]}"
        clock = ManualClock(NOW_MS)
        queue = Queue(name, redis_url, clock=clock)
        queues.append(queue)
        keys = QueueKeys(name)
        return Env(raw, keys, queue, clock, QueueOperations(keys, clock), [])

    yield make
    for queue in queues:
        queue.close()


def state(env: Env) -> dict[str, tuple[bytes, bool]]:
    """Every key of the queue, by its name without the queue's: its DUMP, and whether it
    has a TTL."""
    prefix = env.keys.tasks.removesuffix("tasks")
    found = {}
    for key in env.raw.scan_iter(match=f"{prefix}*", count=1000):
        dump = env.raw.dump(key)
        assert isinstance(dump, bytes)
        found[as_bytes(key).decode().removeprefix(prefix)] = (dump, env.raw.pttl(key) > 0)
    return found


WRONG_TYPES = ("string", "list", "set", "hash", "zset")


def damage(raw: redis.Redis, key: str, held: str) -> None:
    raw.delete(key)
    write: dict[str, Callable[[], Any]] = {
        "string": lambda: raw.set(key, "damaged"),
        "list": lambda: raw.rpush(key, "damaged"),
        "set": lambda: raw.sadd(key, "damaged"),
        "hash": lambda: raw.hset(key, "damaged", "1"),
        "zset": lambda: raw.zadd(key, {"damaged": 1}),
    }
    write[held]()


@pytest.mark.parametrize("case", CASES)
def test_a_damaged_key_fails_the_step_with_nothing_written(
    fresh: Callable[[], Env], case: str
) -> None:
    prepare, step, tolerated = CASES[case]
    healthy = fresh()
    prepare(healthy)
    before = state(healthy)
    step(healthy)
    after = state(healthy)
    written = sorted(
        name
        for name in before.keys() | after.keys()
        if before.get(name) != after.get(name) and not name.startswith(TOLERATED + tolerated)
    )
    assert written, f"{case}: the step wrote nothing to check"
    problems = []
    wrong_types = itertools.cycle(WRONG_TYPES)
    for name in written:
        env = fresh()
        prepare(env)
        key = env.keys.tasks.removesuffix("tasks") + name
        held = next(t for t in wrong_types if t != key_type(key))
        damage(env.raw, key, held)
        before = state(env)
        try:
            step(env)
        except DamagedKeyError as error:
            if error.keys != {key: held} or key not in str(error):
                problems.append(f"{name} as a {held}: the error names {error.keys}: {error}")
        except Exception as error:
            problems.append(f"{name} as a {held}: {type(error).__name__}: {error}")
        else:
            problems.append(f"{name} as a {held}: the step did not fail")
        if (now := state(env)) != before:
            changed = sorted(n for n in before.keys() | now.keys() if before.get(n) != now.get(n))
            problems.append(f"{name} as a {held}: the failed step changed {changed}")
    assert problems == [], f"{case}: {len(problems)} of {len(written)} keys"


def test_the_error_says_what_the_key_holds_and_what_to_do(fresh: Callable[[], Env]) -> None:
    env = fresh()
    env.raw.set(env.keys.ready, "damaged")
    with pytest.raises(DamagedKeyError) as caught:
        env.queue.schedule_now({})
    message = str(caught.value)
    assert f"{env.keys.ready} holds a string where duetime keeps a list" in message
    assert "changed nothing" in message and "delete it" in message
    assert not env.raw.exists(env.keys.tasks)


def test_check_names_a_damaged_key(fresh: Callable[[], Env]) -> None:
    """The checker reads the whole queue in one transaction: a key of the wrong type
    fails it with the key named, not a bare WRONGTYPE."""
    env = fresh()
    due_now(env)
    env.raw.delete(env.keys.ready)
    env.raw.hset(env.keys.ready, "damaged", "1")
    with pytest.raises(DamagedKeyError) as caught:
        env.queue.check()
    assert caught.value.keys == {env.keys.ready: "hash"}


@pytest.fixture(scope="module", params=["redis", "valkey"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    instance = Cluster(request.param, require_binary(request.param))
    instance.start()
    yield instance
    instance.stop()


def test_on_a_cluster_the_error_names_the_key_too(cluster: Cluster) -> None:
    """The TYPE questions go to the node of each key, as the refused call did."""
    name = f"damaged-{uuid.uuid4().hex[:12]}"
    keys = QueueKeys(name)
    client = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    try:
        client.set(keys.ready, "damaged")
        with Queue(name, cluster.url) as queue, pytest.raises(DamagedKeyError) as caught:
            queue.schedule_now({})
        assert caught.value.keys == {keys.ready: "string"}
        assert not client.exists(keys.tasks)
    finally:
        client.delete(keys.ready)
        client.close()
