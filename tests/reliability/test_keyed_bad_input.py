"""Bad input at the door of a keyed call, and garbage where keyed records are kept.

- A schedule call with a ``debounce``, ``throttle`` or ``unique`` of any shape (windows
  of 0, negative, NaN, infinite or huge; max_wait shorter than the window; empty, long,
  control-character and odd Unicode keys; unknown collect and until; two modes; a mode
  with an ``id``; a mode of the wrong type) is either accepted (a task carries it, the
  checker finds nothing) or refused with an ``InvalidInputError`` having sent no command
  that writes.
- A key that equals a live task's id changes nothing of that task.
- A keyed record that does not read, planted in Redis, is reported by the checker and
  replaced by the next call; a keyed hash of the wrong type fails the call with
  ``DamagedKeyError`` and nothing written; the dispatcher's sweep clears the garbage.
"""

from __future__ import annotations

import math
import uuid
from datetime import timedelta
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duetime import Debounce, ManualClock, Queue, Settings, Throttle, Unique
from duetime.errors import DamagedKeyError, InvalidInputError
from duetime.states import KeyedOutcome
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from duetime.store.redis.runner import SyncRunner
from tests.reliability.test_bad_input import write_commands

T0 = 1_800_000_000_000

DURATIONS = st.one_of(
    st.sampled_from([0, -1, 0.0001, 1e-9, math.nan, math.inf, -math.inf, 10**12, 1e300, True]),
    st.floats(min_value=-10, max_value=1e10, allow_nan=False),
    st.integers(min_value=-5, max_value=10**10),
    st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=400)),
    st.just("5"),
    st.none(),
)
KEYS = st.one_of(
    st.text(max_size=210),
    st.sampled_from(["", "a\nb", "\x00", "é" * 100, "é" * 101, "🙂" * 50, "🙂" * 51, "x" * 201]),
    st.binary(max_size=5),
    st.none(),
    st.integers(),
)


@st.composite
def modes(draw: st.DrawFn) -> dict[str, Any]:
    """The keyed options of one call: usually one mode, sometimes two, sometimes a
    value of the wrong type, sometimes an id beside them."""
    options: dict[str, Any] = {}
    for name in draw(st.sets(st.sampled_from(["debounce", "throttle", "unique"]), min_size=1)):
        options[name] = draw(mode_of(name))
    if draw(st.integers(0, 9)) == 0:
        options["id"] = draw(st.sampled_from(["mine", "x" * 300, ""]))
    return options


def mode_of(name: str) -> st.SearchStrategy[Any]:
    def made(kind: Any, *arguments: Any, **keywords: Any) -> Any:
        try:
            return kind(*arguments, **keywords)
        except InvalidInputError as error:
            return error  # refused when made: the call is not even tried

    if name == "debounce":
        return st.builds(
            lambda key, window, max_wait, collect, most: made(
                Debounce, key, window, max_wait=max_wait, collect=collect, most=most
            ),
            KEYS,
            DURATIONS,
            DURATIONS,
            st.sampled_from(["last", "all", "first", None]),
            st.one_of(st.integers(-1, 10_002), st.just(1.5)),
        )
    if name == "throttle":
        return st.builds(
            lambda key, window, trailing: made(Throttle, key, window, trailing=trailing),
            KEYS,
            DURATIONS,
            st.sampled_from([True, False, 1, "yes"]),
        )
    return st.one_of(
        st.builds(
            lambda key, until: made(Unique, key, until=until),
            KEYS,
            st.sampled_from(["started", "finished", "done"]),
        ),
        st.sampled_from(["k", {"key": "k"}, 5]),  # not a Unique at all
    )


def test_keyed_calls_are_carried_or_refused_with_nothing_written(
    redis_url: str, raw: redis.Redis
) -> None:
    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(options=modes())
    def check(options: dict[str, Any]) -> None:
        if any(isinstance(value, InvalidInputError) for value in options.values()):
            return  # refused where the mode was made, before any call
        name = f"k{uuid.uuid4().hex[:10]}"
        before = raw.info("commandstats")
        with Queue(name, redis_url, clock=ManualClock(T0)) as queue:
            try:
                done = queue.schedule_keyed({"n": 1}, **options)
            except InvalidInputError:
                written = write_commands(before, raw.info("commandstats"))
                leftover = list(raw.scan_iter(match=f"duetime:{{{name}}}:*"))
                assert not written and not leftover, (options, written, leftover)
                return
            assert done.outcome == KeyedOutcome.CREATED, (options, done)
            status = queue.status(done.id)
            assert status is not None and status.data in ({"n": 1}, [{"n": 1}]), options
            assert queue.check() == [], options

    check()


def test_a_key_that_equals_a_task_id_leaves_that_task_alone(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    with Queue(queue_name, redis_url, clock=ManualClock(T0)) as queue:
        plain = queue.schedule_in(60, {"plain": 1}, id="report")
        for options in ({"debounce": Debounce("report", 5)}, {"throttle": Throttle("report", 5)},
                        {"unique": Unique("report")}):  # fmt: skip
            done = queue.schedule_keyed({"keyed": 1}, **options)
            assert done.outcome == KeyedOutcome.CREATED and done.id != plain
        status = queue.status(plain)
        assert status is not None and status.data == {"plain": 1} and status.keyed is None
        assert raw.hlen(QueueKeys(queue_name).tasks) == 4 and queue.check() == []


@pytest.mark.parametrize(
    ("field", "record"),
    [
        ("d:k", "not a record"),
        ("d:k", "id|nan|x|y|1|2|3|last"),
        ("d:k", "|||||||"),
        ("d:k", "gone|9999999999999|9999999999999|1|10|4|9|last"),  # a task that is gone
        ("t:k", "lead|soon|1||||"),
        ("u:k", "gone|started|x"),
    ],
)
def test_a_garbage_record_is_reported_and_replaced_by_the_next_call(
    redis_url: str, raw: redis.Redis, queue_name: str, field: str, record: str
) -> None:
    keys = QueueKeys(queue_name)
    raw.hset(keys.keyed, field, record)
    raw.zadd(keys.keyed_expiry, {field: T0 + 10})
    modes: dict[str, dict[str, Any]] = {
        "d": {"debounce": Debounce("k", 5)},
        "t": {"throttle": Throttle("k", 5)},
        "u": {"unique": Unique("k")},
    }
    mode = modes[field[0]]
    with Queue(queue_name, redis_url, clock=ManualClock(T0)) as queue:
        if not record.startswith("gone|"):
            assert [v.kind for v in queue.check()] == ["garbage"]
        done = queue.schedule_keyed({"n": 1}, **mode)
        assert done.outcome == KeyedOutcome.CREATED and queue.status(done.id) is not None
        assert queue.check() == []
        assert queue.status(done.id).keyed is not None  # type: ignore[union-attr]


def test_a_keyed_hash_of_the_wrong_type_fails_the_call_with_nothing_written(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    raw.set(keys.keyed, "not a hash")
    with Queue(queue_name, redis_url) as queue:
        for options in ({"debounce": Debounce("k", 5)}, {"throttle": Throttle("k", 5)},
                        {"unique": Unique("k")}):  # fmt: skip
            with pytest.raises(DamagedKeyError, match="keyed"):
                queue.schedule_keyed({"n": 1}, **options)
        assert raw.hlen(keys.tasks) == 0 and raw.zcard(keys.scheduled) == 0
        assert raw.llen(keys.ready) == 0 and not raw.exists(keys.stats)


def test_the_sweep_clears_garbage_records_and_their_entries(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    raw.hset(keys.keyed, mapping={"d:a": "garbage", "u:b": "x|y", "t:c": ""})
    raw.zadd(keys.keyed_expiry, {"d:a": 1, "u:b": 1, "t:c": 1, "d:no-record": 1})
    raw.hset(keys.keyed_tasks, mapping={"x": "u:b", "orphan": "d:zzz"})
    clock = ManualClock(T0)
    runner = SyncRunner(redis_url, Settings())
    try:
        with Queue(queue_name, redis_url, clock=clock) as queue:
            kinds = sorted(v.kind for v in queue.check())
            assert kinds == ["garbage"] * 3 + ["leak"] * 2, queue.check()
            assert runner.run(QueueOperations(keys, clock).keyed.sweep_keyed(1000)) == 4
            assert not raw.exists(keys.keyed) and not raw.exists(keys.keyed_expiry)
            # A note no record names is reported; nothing of a task is touched by a sweep.
            assert [v.subject for v in queue.check()] == ["orphan"]
    finally:
        runner.close()
