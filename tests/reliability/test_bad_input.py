"""Bad input at every door, and garbage already in Redis.

- ``Queue.schedule_*`` and ``duetime schedule`` either accept a call (the task is then
  really stored, its data round-trips, and a sample of them runs) or refuse it with an
  ``InvalidInputError`` (exit code 2 for the command) having sent no command that writes.
- Garbage planted in Redis under a running worker and dispatcher (undecodable or
  future-format envelopes, ids without envelopes, huge and non-UTF-8 ids, keys of the
  wrong type) ends in ``dead`` with a clear error or is skipped with a logged reason.
  Neither daemon dies or spins, and both still serve a healthy task afterwards.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import math
import socket
import string
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, tzinfo
from decimal import Decimal
from fractions import Fraction
from typing import Any

import msgpack
import pytest
import redis
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import duetime
from duetime import App, AsyncQueue, Dispatcher, Job, Queue, Settings, Worker, codec, validation
from duetime.cli import EXIT_USAGE, main
from duetime.errors import DecodeError, DuetimeError, InvalidInputError
from duetime.store.plans.keys import QueueKeys
from duetime.validation import END_OF_9999
from tests.helpers import (
    FAST,
    as_bytes,
    scheduled_microseconds,
    scheduled_score,
    wait_until,
)
from tests.servers import Server

# --- the property: accepted and stored, or refused with nothing written -----------------

PAYLOAD_LIMIT = 2048
SMALL = Settings(max_payload_bytes=PAYLOAD_LIMIT)
REGISTERED = ("send_email", "a.b:c-d", "_private")
#: Commands a refused call may still have sent: none of them writes. (INFO, DBSIZE and
#: SCAN are the test's own reads.)
READ_ONLY = frozenset({"time", "info", "dbsize", "scan", "config|resetstat", "ping"})
SAMPLE_SIZE = 12

_registry_app = App()


@_registry_app.task(name="send_email")
def send_email(data: object) -> None:
    """Registered, so ``task=send_email`` (the function) is a valid reference."""


def not_registered(data: object) -> None:
    """Never registered: passing it as ``task=`` must be refused."""


class NoOffset(tzinfo):
    """A tzinfo whose utcoffset is None: the datetime counts as naive."""

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str | None:
        return None


class Opaque:
    """An object msgpack has no encoding for."""


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def _self_referencing() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


NUMBERS: list[Any] = [
    0, -0.0, 1e-9, 1e-4, 0.0005, 0.001, 0.5, 1, 1e9, 1e14, 1e16, 1e17, 1e300,
    END_OF_9999 - 1, END_OF_9999 - 0.001, END_OF_9999, END_OF_9999 + 1, 2**53, 2**63, 2**64,
    10**400, -1, -1e-9, math.nan, math.inf, -math.inf, True, False,
]  # fmt: skip
OTHER_TYPES = st.one_of(
    st.none(),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.sampled_from([Decimal("1.5"), 1j, "5", b"5", [1], {}]),
)
numbers = st.one_of(st.floats(), st.integers(), st.sampled_from(NUMBERS))
durations = st.one_of(st.none(), numbers, OTHER_TYPES)
timestamps = st.one_of(
    numbers,
    st.floats(-5, 1).map(lambda offset: time.time() + offset),  # due now: these run
    st.datetimes(),  # naive
    st.datetimes(timezones=st.timezones()),
    st.datetimes(timezones=st.just(NoOffset())),
    OTHER_TYPES,
)
delays = st.one_of(durations, st.floats(0, 0.5))
ID_ALPHABET = string.ascii_letters + string.digits + "_.:@/+=~-"
ODD_NAMES = ["", "|", "a|b", "x" * 200, "x" * 201, "ünïcode", "a b", "a\n", "\x00", "[/x]", "1a"]
ids = st.one_of(
    st.none(),
    st.text(ID_ALPHABET, min_size=1, max_size=200),
    st.text(max_size=12),
    st.sampled_from(ODD_NAMES),
    st.integers(),
    st.binary(max_size=3),
)
task_refs = st.one_of(
    st.none(),
    st.sampled_from(REGISTERED),
    st.sampled_from([send_email, not_registered, print]),
    st.text(max_size=12),
    st.sampled_from(ODD_NAMES),
    st.integers(),
)
attempt_counts = st.one_of(
    st.none(),
    st.integers(-3, 1003),
    st.sampled_from([0, 1, 1000, 1001, 2**64, 10**400, True, False, 1.0, 5.5, "5", math.nan]),
)
map_keys = st.one_of(
    st.text(max_size=6),
    st.integers(-(2**70), 2**70),
    st.binary(max_size=4),
    st.booleans(),
    st.none(),
    st.floats(),
    st.tuples(st.integers(0, 3)),  # packs as an array key
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30]),
    st.floats(),
    st.text(max_size=20),
    st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2),  # lone surrogates
    st.binary(max_size=20),
    st.just(bytearray(b"ab")),
)
unencodable = st.sampled_from([Opaque(), {1, 2}, frozenset(), Decimal("1"), 1j, print])
payloads = st.one_of(
    st.recursive(
        st.one_of(scalars, scalars, scalars, unencodable),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.tuples(inner, inner),
            st.dictionaries(map_keys, inner, max_size=4),
        ),
        max_leaves=12,
    ),
    st.sampled_from([None, "", b"", {}, [], 0, False, nested(100), nested(600)]),
    st.sampled_from([_self_referencing(), datetime(2030, 1, 1)]),
    st.integers(PAYLOAD_LIMIT - 8, PAYLOAD_LIMIT + 8).map(lambda n: "x" * n),
    st.integers(PAYLOAD_LIMIT - 8, PAYLOAD_LIMIT + 8).map(lambda n: b"x" * n),
)


@dataclass(frozen=True)
class Spec:
    """One task as handed to duetime: ``form`` says how (a keyword call, a ``Job``, an
    ``(at, data)`` pair, or a garbage item in ``schedule_many``)."""

    data: Any
    at: Any = None
    delay: Any = None
    task: Any = None
    id: Any = None
    max_attempts: Any = None
    timeout: Any = None
    result_ttl: Any = None
    form: str = "kw"
    garbage: Any = None

    def options(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "id": self.id,
            "max_attempts": self.max_attempts,
            "timeout": self.timeout,
            "result_ttl": self.result_ttl,
        }

    def item(self) -> Any:
        if self.form == "pair":
            return (self.at, self.data)
        if self.form == "garbage":
            return self.garbage
        return Job(self.data, self.at, self.delay, **self.options())


@dataclass(frozen=True)
class Call:
    method: str  # schedule_task | schedule_in | schedule_many
    specs: tuple[Spec, ...]

    def __call__(self, queue: Queue) -> Any:
        if self.method == "schedule_many":
            return queue.schedule_many([spec.item() for spec in self.specs])
        (spec,) = self.specs
        if self.method == "schedule_task":
            return queue.schedule_task(spec.at, spec.data, **spec.options())
        return queue.schedule_in(spec.delay, spec.data, **spec.options())


valid_payloads = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
        st.text(max_size=20), st.binary(max_size=20),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
).filter(lambda data: data not in (None, "", b""))  # fmt: skip
#: A value duetime must accept, for each argument...
VALID: dict[str, st.SearchStrategy[Any]] = {
    "data": valid_payloads,
    "task": st.one_of(st.none(), st.sampled_from(REGISTERED), st.just(send_email)),
    "id": st.one_of(st.none(), st.text(ID_ALPHABET, min_size=1, max_size=200)),
    "max_attempts": st.one_of(st.none(), st.integers(1, 1000)),
    "timeout": st.one_of(st.none(), st.floats(0.001, 1e6), st.integers(1, 10**6)),
    "result_ttl": st.one_of(st.none(), st.floats(0.001, 1e6), st.integers(1, 10**6)),
    "at": st.one_of(
        st.floats(0, END_OF_9999, exclude_max=True),
        st.floats(-5, 1).map(lambda offset: time.time() + offset),  # due now: these run
        st.datetimes(timezones=st.timezones()).filter(lambda at: 0 <= at.timestamp() < END_OF_9999),
    ),
    "delay": st.one_of(st.floats(0, 0.5), st.floats(0, 1e6), st.integers(0, 10**6)),
}
#: ...and anything at all.
WILD: dict[str, st.SearchStrategy[Any]] = {
    "data": payloads,
    "task": task_refs,
    "id": ids,
    "max_attempts": attempt_counts,
    "timeout": durations,
    "result_ttl": durations,
    "at": timestamps,
    "delay": delays,
}


@st.composite
def specs(draw: st.DrawFn, method: str) -> Spec:
    """One task's arguments: a few of them (often one, sometimes all) drawn from
    anything, the rest valid, so that each odd value also meets the code paths behind
    the checks of the others."""
    wild = draw(st.sets(st.sampled_from(sorted(WILD)), min_size=1))

    def value(name: str) -> Any:
        return draw(WILD[name] if name in wild else VALID[name])

    spec = Spec(
        data=value("data"),
        task=value("task"),
        id=value("id"),
        max_attempts=value("max_attempts"),
        timeout=value("timeout"),
        result_ttl=value("result_ttl"),
    )
    if method == "schedule_task":
        return replace(spec, at=value("at"))
    if method == "schedule_in":
        return replace(spec, delay=value("delay"))
    form = draw(st.sampled_from(["job", "job", "job", "pair", "garbage"]))
    if form == "pair":  # (at, data) carries no options
        return Spec(spec.data, at=value("at"), form=form)
    if form == "garbage":
        junk = draw(st.sampled_from(["x", None, (1,), (1, 2, 3), 5, Job, [0, {}]]))
        return replace(spec, form=form, garbage=junk)
    when = draw(st.sampled_from(["at", "at", "delay", "delay", "both", "neither"]))
    return replace(
        spec,
        form=form,
        at=value("at") if when in ("at", "both") else None,
        delay=value("delay") if when in ("delay", "both") else None,
    )


@st.composite
def calls(draw: st.DrawFn) -> Call:
    method = draw(st.sampled_from(["schedule_task", "schedule_in", "schedule_many"]))
    if method != "schedule_many":
        return Call(method, (draw(specs(method)),))
    items = draw(st.lists(specs(method), max_size=4))
    if len(items) >= 2 and draw(st.booleans()):
        items[1] = replace(items[1], id=items[0].id)  # the same id twice in one call
    return Call(method, tuple(items))


def write_commands(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """Commands (from INFO commandstats) issued between two readings, except reads."""
    issued = {}
    for key, stats in after.items():
        count = stats["calls"] - before.get(key, {}).get("calls", 0)
        name = key.removeprefix("cmdstat_")
        if count and name not in READ_ONLY:
            issued[name] = count
    return issued


def expected_task_name(task: Any) -> str:
    if task is None:
        return ""
    return str(getattr(task, "duetime_name", task))


def milliseconds_written(at: Any) -> Fraction:
    """The run-at asked for, exactly: a datetime to its microsecond, a number as the
    decimal it was written as (its repr), not the double nearest to that."""
    if isinstance(at, datetime):
        return Fraction((at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1), 1000)
    return Fraction(repr(float(at))) * 1000


@dataclass
class Runnable:
    queue: str
    task_id: str
    packed: bytes


def verify_stored(
    queue: Queue, raw: redis.Redis, spec: Spec, task_id: Any, sample: list[Runnable]
) -> list[str]:
    """Everything an accepted task promises: stored, decodable, data round-trips, options
    kept, run-at never before ``at``. Due tasks with a known handler join the sample."""
    keys = QueueKeys(queue.name)
    if not isinstance(task_id, str):
        return [f"returned {task_id!r} instead of a task id"]
    if spec.id is not None and task_id != spec.id:
        return [f"asked for id {spec.id!r}, got {task_id!r}"]
    blob = raw.hget(keys.tasks, task_id)
    if blob is None:
        return [f"{task_id!r} was accepted but nothing is stored"]
    try:
        envelope = codec.decode_envelope(as_bytes(blob))
    except DecodeError as error:
        return [f"{task_id!r} was accepted but its stored envelope is unreadable: {error}"]
    problems = []
    status = queue.status(task_id)
    if status is None or status.state not in ("scheduled", "ready"):
        problems.append(f"status of a new task is {status!r}")
    elif codec.pack(status.data) != codec.pack(spec.data):
        problems.append(f"data {spec.data!r} came back as {status.data!r}")
    if envelope.task != expected_task_name(spec.task):
        problems.append(f"task name {spec.task!r} stored as {envelope.task!r}")
    if spec.max_attempts is not None and envelope.max_attempts != spec.max_attempts:
        problems.append(f"max_attempts {spec.max_attempts!r} stored as {envelope.max_attempts}")
    if spec.timeout is not None and envelope.timeout_ms <= 0:
        problems.append(f"timeout {spec.timeout!r} s was stored as {envelope.timeout_ms} ms")
    if spec.result_ttl is not None and envelope.result_ttl_ms <= 0:
        problems.append(
            f"result_ttl {spec.result_ttl!r} s was stored as {envelope.result_ttl_ms} ms "
            "(that means: keep no result)"
        )
    if spec.at is not None:
        at_ms = milliseconds_written(spec.at)
        stored = Fraction(envelope.run_at_ms)
        now_ms = Fraction(repr(time.time())) * 1000
        # A run-at in the past is stored as the server's now at the call (the task is
        # due from then); server and test share this host's clock.
        as_now = at_ms < stored and at_ms < now_ms and now_ms - 60_000 <= stored <= now_ms + 1000
        if not (at_ms <= stored <= at_ms + 1 or as_now):
            problems.append(f"at {spec.at!r} stored as run-at {envelope.run_at_ms} ms")
    # Both to the microsecond: a delayed bucket keeps whole µs, the envelope a double.
    micros = scheduled_microseconds(raw, keys, task_id)
    if micros is not None and micros != validation.whole_microseconds(envelope.run_at_ms):
        problems.append(f"scheduled at {micros} µs but the envelope says {envelope.run_at_ms}")
    if micros is not None and spec.at is not None and micros < milliseconds_written(spec.at) * 1000:
        problems.append(f"scheduled at {micros} µs, before the time given ({spec.at!r})")
    due = micros is None or micros <= time.time() * 1_000_000 + 1_500_000
    runnable_handler = envelope.task in ("", *REGISTERED)
    long_enough = envelope.timeout_ms >= 1000
    if not problems and due and runnable_handler and long_enough and len(sample) < SAMPLE_SIZE:
        sample.append(Runnable(queue.name, task_id, codec.pack(spec.data)))
    return problems


def attempt_call(call: Call, redis_url: str, raw: redis.Redis, sample: list[Runnable]) -> list[str]:
    """Run one call on a fresh queue; the problems with its outcome (empty: fine)."""
    name = f"p{uuid.uuid4().hex[:10]}"
    size = raw.dbsize()
    before = raw.info("commandstats")
    with Queue(name, redis_url, settings=SMALL) as queue:
        try:
            returned = call(queue)
        except InvalidInputError:
            after = raw.info("commandstats")
            written = write_commands(before, after)
            leftover = list(raw.scan_iter(match=f"duetime:{{{name}}}:*"))
            problems = []
            if written or leftover or raw.dbsize() != size:
                problems.append(f"refused, but it sent {written} and left keys {leftover}")
            return problems
        except Exception as error:
            return [f"raised {type(error).__name__}: {error} (not an InvalidInputError)"]
        if call.method != "schedule_many":
            return verify_stored(queue, raw, call.specs[0], returned, sample)
        if not isinstance(returned, list) or len(returned) != len(call.specs):
            return [f"schedule_many of {len(call.specs)} returned {returned!r}"]
        problems = []
        for spec, task_id in zip(call.specs, returned, strict=True):
            problems += verify_stored(queue, raw, spec, task_id, sample)
        return problems


def run_sample(redis_url: str, sample: list[Runnable]) -> list[str]:
    """Run a worker and a dispatcher for the sampled queues; each sampled task must run
    with its data and finish cleanly."""
    if not sample:
        return []
    seen: dict[tuple[str, str], bytes] = {}
    app = App()

    def recorder(data: Any) -> None:
        context = duetime.current_task()
        seen[context.queue_name, context.id] = codec.pack(data)

    app.default(recorder)
    for name in REGISTERED:
        app.task(lambda data: recorder(data), name=name)
    queues = sorted({item.queue for item in sample})
    clients = {q: Queue(q, redis_url) for q in queues}

    def finished(item: Runnable) -> bool:
        status = clients[item.queue].status(item.task_id)
        ran = (item.queue, item.task_id) in seen
        return ran and (status is None or status.state == "finished")

    async def scenario() -> None:
        daemons: list[Dispatcher | Worker] = [Dispatcher(queues, redis_url, settings=FAST)]
        daemons += [Worker(app, q, redis_url, settings=FAST) for q in queues]
        tasks = [asyncio.create_task(d.run()) for d in daemons]
        try:
            await wait_until(
                lambda: all(finished(item) for item in sample),
                timeout=15,
                what="the sampled tasks to run and be acknowledged",
            )
        finally:
            for daemon in daemons:
                daemon.stop()
            await asyncio.wait(tasks, timeout=15)

    problems = []
    try:
        asyncio.run(scenario())
    except AssertionError as error:
        problems.append(str(error))
    for item in sample:
        if seen.get((item.queue, item.task_id), item.packed) != item.packed:
            problems.append(f"{item.task_id} ran with other data than it was given")
    for q, queue in clients.items():
        problems += [f"queue {q}: {violation}" for violation in queue.check()]
        queue.close()
    return problems


def test_schedule_calls_are_stored_or_refused_with_nothing_written(
    redis_url: str, raw: redis.Redis
) -> None:
    """Property over schedule_task / schedule_in / schedule_many arguments of every kind
    (NaN, inf, negative, huge, bool, str, naive and aware timestamps; empty, nested,
    bytes, big-int, float, unencodable and oversized payloads; odd ids and task names;
    edge limits): each call is accepted and stored as given, or refused with an
    InvalidInputError after sending nothing that writes. A sample of the accepted tasks
    then runs on a real worker."""
    sample: list[Runnable] = []

    @settings(
        max_examples=200,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(call=calls())
    # Past 2248 a double in ms stands for two µs: the bucket must take the later one.
    @example(call=Call("schedule_task", (Spec(data=[], at=8796093023.0, form="kw"),)))
    def check(call: Call) -> None:
        problems = attempt_call(call, redis_url, raw, sample)
        assert not problems, f"{call.method}{call.specs!r}:\n" + "\n".join(problems)

    check()
    assert run_sample(redis_url, sample) == []


@pytest.mark.parametrize(
    ("method", "spec"),
    [
        ("schedule_task", Spec({}, at=10**400)),
        ("schedule_in", Spec({}, delay=10**400)),
        ("schedule_in", Spec({}, delay=1e300)),
        ("schedule_in", Spec({}, delay=1e17)),
        ("schedule_in", Spec({}, delay=0, timeout=1e300)),
        ("schedule_in", Spec({}, delay=0, timeout=10**400)),
        ("schedule_in", Spec({}, delay=0, result_ttl=1e300)),
        ("schedule_in", Spec({}, delay=0, timeout=1e-9)),
        ("schedule_in", Spec({}, delay=0, result_ttl=1e-9)),
        ("schedule_in", Spec({(1, 2): "tuple key"}, delay=0)),
        ("schedule_in", Spec({"deep": nested(600)}, delay=0)),
        ("schedule_in", Spec([_self_referencing()], delay=0)),
        ("schedule_task", Spec({}, at=datetime(2030, 1, 1, tzinfo=NoOffset()))),
        ("schedule_many", Spec({}, at=10**400, form="job")),
        ("schedule_many", Spec({}, delay=1e300, form="job")),
        ("schedule_many", Spec({(1,): 1}, at=0, form="pair")),
    ],
    ids=[
        "at-huge-int", "delay-huge-int", "delay-1e300", "delay-1e17", "timeout-1e300",
        "timeout-huge-int", "result-ttl-1e300", "timeout-1ns", "result-ttl-1ns",
        "tuple-map-key", "nested-600", "self-reference", "tzinfo-without-offset",
        "many-at-huge-int", "many-delay-1e300", "many-pair-tuple-key",
    ],
)  # fmt: skip
def test_known_edge_inputs_are_stored_or_refused_cleanly(
    redis_url: str, raw: redis.Redis, method: str, spec: Spec
) -> None:
    """The same property for edge values named one by one (huge ints and floats that
    overflow, durations that round to zero, map keys that cannot be decoded)."""
    problems = attempt_call(Call(method, (spec,)), redis_url, raw, [])
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("result_ttl", [1e14, 1e16])
def test_an_accepted_result_ttl_is_honoured_by_the_worker(
    redis_url: str, queue_name: str, result_ttl: float
) -> None:
    """A result_ttl that schedule_* accepts must not break the worker's acknowledgement:
    the task completes, its result can be read, no key is left without a TTL, and the
    worker keeps acking later tasks."""
    done: list[int] = []

    def handler(data: dict[str, int]) -> int:
        done.append(data["n"])
        return data["n"]

    with Queue(queue_name, redis_url) as queue:
        try:
            big = queue.schedule_now({"n": 1}, result_ttl=result_ttl)
        except InvalidInputError:
            return  # refusing it at the door is fine too
        later = queue.schedule_in(0.3, {"n": 2})

        async def scenario() -> None:
            daemons: list[Worker | Dispatcher] = [
                Worker(App(default=handler), queue_name, redis_url, settings=FAST),
                Dispatcher([queue_name], redis_url, settings=FAST),
            ]
            tasks = [asyncio.create_task(daemon.run()) for daemon in daemons]
            try:
                await wait_until(
                    lambda: queue.status(later) is None, timeout=5, what="both tasks acked"
                )
            finally:
                for daemon in daemons:
                    daemon.stop()
                await asyncio.wait(tasks, timeout=10)

        asyncio.run(scenario())
        assert done == [1, 2]
        assert queue.result(big, timeout=1) == 1
        assert queue.check() == []


# --- the same property for `duetime schedule` ----------------------------------------

number_texts = st.one_of(
    st.floats().map(repr),
    st.integers().map(str),
    st.sampled_from(
        ["nan", "inf", "-inf", "1e400", "-1", "0", "-0", "1_000", "0x10", "", " ", "abc",
         "1e17", "1e300", "1e-9", "5", "0.2", "٣", str(10**30), str(END_OF_9999)]
    ),
)  # fmt: skip
json_documents = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
data_texts = st.one_of(
    json_documents.map(json.dumps),
    st.text(max_size=12),
    st.sampled_from(
        ["null", '""', "[]", "{}", "NaN", "-Infinity", "1e400", str(10**25), '"\\ud800"',
         "[" * 3000 + "]" * 3000, "{not json", "x" * 3000, json.dumps("y" * 3000)]
    ),
)  # fmt: skip
name_texts = st.one_of(
    st.text(ID_ALPHABET, min_size=1, max_size=12),
    st.text(max_size=12),
    st.sampled_from([*ODD_NAMES, "[/x]", "[bold]x", "[/]", "a]b[", "send_email"]),
)


CLI_VALID: dict[str, st.SearchStrategy[str]] = {
    "--at": st.floats(-5, 1).map(lambda offset: f"{time.time() + offset:.3f}"),
    "--in": st.sampled_from(["0", "0.2", "60", "86400"]),
    "--id": st.text(ID_ALPHABET, min_size=1, max_size=200),
    "--task": st.sampled_from(REGISTERED),
    "--max-attempts": st.integers(1, 1000).map(str),
    "--timeout": st.sampled_from(["0.5", "30", "3600"]),
    "--result-ttl": st.sampled_from(["1", "60", "86400"]),
    "DATA": valid_payloads.filter(lambda data: not isinstance(data, bytes)).map(
        lambda data: json.dumps(data, default=repr)
    ),
}
CLI_WILD: dict[str, st.SearchStrategy[str]] = {
    "--at": number_texts,
    "--in": number_texts,
    "--id": name_texts,
    "--task": name_texts,
    "--max-attempts": number_texts,
    "--timeout": number_texts,
    "--result-ttl": number_texts,
    "DATA": data_texts,
}


@st.composite
def cli_arguments(draw: st.DrawFn) -> list[str]:
    """`duetime schedule` arguments: a few wild (often one, sometimes all), the rest
    valid; options present or not, and --at/--in given as one, both or neither."""
    wild = draw(st.sets(st.sampled_from(sorted(CLI_WILD)), min_size=1))

    def value(name: str) -> str:
        return draw(CLI_WILD[name] if name in wild else CLI_VALID[name])

    when = draw(st.sampled_from(["at", "in", "in", "both", "neither"]))
    arguments = [f"--{w}={value('--' + w)}" for w in ("at", "in") if when in (w, "both")]
    for option in ("--id", "--task", "--max-attempts", "--timeout", "--result-ttl"):
        if option in wild or draw(st.booleans()):
            arguments.append(f"{option}={value(option)}")
    return [*arguments, "--", value("DATA")]


def test_cli_schedule_prints_an_id_or_exits_2_with_nothing_written(
    redis_url: str, raw: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property over `duetime schedule` arguments: exit code 0 and a printed id whose
    task holds the JSON data, or exit code 2 with a message and nothing written. Any
    other outcome (a traceback, exit 1) is a bug."""
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    monkeypatch.setenv("DUETIME_MAX_PAYLOAD_BYTES", str(PAYLOAD_LIMIT))
    runner = CliRunner()

    @settings(
        max_examples=150,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(arguments=cli_arguments())
    def check(arguments: list[str]) -> None:
        problems = cli_outcome(runner, raw, redis_url, arguments)
        assert not problems, "\n".join(problems)

    check()


def cli_outcome(
    runner: CliRunner, raw: redis.Redis, redis_url: str, arguments: list[str]
) -> list[str]:
    """Run `duetime schedule` on a fresh queue; the problems with its outcome."""
    name = f"c{uuid.uuid4().hex[:10]}"
    size = raw.dbsize()
    before = raw.info("commandstats")
    result = runner.invoke(main, ["schedule", "--create", "-q", name, *arguments])
    shown = f"duetime schedule {arguments!r:.300}: exit {result.exit_code}\n{result.output[-800:]}"
    if result.exit_code == EXIT_USAGE:
        written = write_commands(before, raw.info("commandstats"))
        leftover = list(raw.scan_iter(match=f"duetime:{{{name}}}:*"))
        if written or leftover or raw.dbsize() != size:
            return [f"{shown}\nexit 2, but it sent {written} and left keys {leftover}"]
        if not result.output.strip():
            return [f"{shown}\nexit 2 without a message"]
        return []
    if result.exit_code != 0:
        return [f"{shown}\nunexpected outcome; exception: {result.exception!r}"]
    task_id = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    with Queue(name, redis_url) as queue:
        status = queue.status(task_id) if task_id else None
    if status is None:
        return [f"{shown}\nprinted {task_id!r}, but no such task is stored"]
    data = json.loads(arguments[-1])
    if codec.pack(status.data) != codec.pack(data):
        return [f"{shown}\nstored data {status.data!r} differs from the JSON given"]
    return []


@pytest.mark.parametrize(
    "arguments",
    [
        ["--in=1", "--", "[" * 3000 + "]" * 3000],
        ["--in=1", "--id=[/x]", "--", "{}"],
        ["--in=1", "--task=[/x]", "--", "{}"],
        ["--in=1", "--timeout=1e300", "--", "{}"],
        ["--in=1e17", "--", "{}"],
    ],
    ids=["deep-json", "markup-id", "markup-task", "huge-timeout", "huge-delay"],
)
def test_known_cli_edge_inputs_exit_0_or_2(
    redis_url: str, raw: redis.Redis, monkeypatch: pytest.MonkeyPatch, arguments: list[str]
) -> None:
    """Edge arguments named one by one: deeply nested JSON, ids and task names that
    look like console markup, durations that overflow."""
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    problems = cli_outcome(CliRunner(), raw, redis_url, arguments)
    assert not problems, "\n".join(problems)


def test_cli_tiny_result_ttl_is_not_silently_dropped(
    redis_url: str, raw: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--result-ttl 0.0001` is positive: it must be kept (as at least 1 ms) or refused
    with exit 2, never stored as 0, which means "keep no result"."""
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    result = CliRunner().invoke(
        main,
        ["schedule", "--create", "-q", queue_name, "--in=60", "--result-ttl=0.0001", "--", "{}"],
    )
    if result.exit_code == EXIT_USAGE:
        return
    assert result.exit_code == 0, result.output
    blob = raw.hget(QueueKeys(queue_name).tasks, result.stdout.strip())
    assert blob is not None
    assert codec.decode_envelope(as_bytes(blob)).result_ttl_ms > 0


# --- garbage already in Redis, under running daemons ---------------------------------

GARBAGE_SETTINGS = FAST.replace(
    heartbeat_interval=0.2, worker_ttl=2.0, lease_duration=4.0, shutdown_grace=1.0,
    block_timeout=0.5,
)  # fmt: skip
#: How long the daemons live with the garbage before the command count is read.
WINDOW = 2.0
#: Commands (script-internal ones included) one worker + one dispatcher may issue in
#: WINDOW. Idle, the pair issues about 100-200; a loop retrying without a pause, thousands.
COMMAND_BOUND = 1000
GARBAGE_QUEUE = "garbage"
#: Length of the huge ids: 50 times the longest id duetime itself accepts.
HUGE = 10_000

_scenario: contextvars.ContextVar[str] = contextvars.ContextVar("garbage_scenario")


@dataclass
class Planted:
    """What a scenario put in Redis, and what it needs checked afterwards."""

    dead: dict[str | bytes, str] = field(default_factory=dict)  # id -> error substring
    dropped: list[str | bytes] = field(default_factory=list)  # ids to skip with a log
    either: list[str | bytes] = field(default_factory=list)  # dead, or skipped with a log
    runs: list[str] = field(default_factory=list)  # valid tasks that must still run


@dataclass
class Scenario:
    name: str
    plant: Callable[[redis.Redis, QueueKeys, str], Planted]
    restore: Callable[[redis.Redis, QueueKeys, str], None] = lambda raw, keys, worker: None


@dataclass
class Outcome:
    problems: list[str] = field(default_factory=list)
    commands: int = 0


def envelope(task: str = "", data: Any = None, version: int = 1) -> bytes:
    packed: bytes = msgpack.packb([version, task, {} if data is None else data, 0, 3, 5000, 0])
    return packed


def plant_ready(raw: redis.Redis, keys: QueueKeys, task_id: str | bytes, blob: bytes) -> None:
    raw.hset(keys.tasks, task_id, blob)
    raw.rpush(keys.ready, task_id)


POISON: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "not a valid msgpack document"),
    "garbage": (b"\xc1garbage", "not a valid msgpack document"),
    "truncated": (envelope()[:-3], "not a valid msgpack document"),
    "not-an-array": (msgpack.packb({"version": 1}), "not a duetime envelope"),
    "string-version": (msgpack.packb(["1", "", {}, 0, 3, 5000, 0]), "not a duetime envelope"),
    "future-version": (envelope(version=codec.ENVELOPE_VERSION + 1), "newer than this worker"),
    "far-future-version": (envelope(version=2**40), "newer than this worker"),
    "version-zero": (envelope(version=0), "version 0"),
    "too-few-fields": (msgpack.packb([1, ""]), "expected 7"),
    "wrong-field-types": (msgpack.packb([1, b"bytes", {}, 0, 3, 5000, 0]), "wrong types"),
    "undecodable-map-key": (
        codec.envelope_from_packed_data("", msgpack.packb({(1,): 1}), 0, 3, 5000, 0),
        "not a valid msgpack document",
    ),
    "unknown-handler": (envelope("os.system", "touch /tmp/x"), "no handler named 'os.system'"),
}


def plant_poison(raw: redis.Redis, keys: QueueKeys, worker: str) -> Planted:
    planted = Planted()
    for name, (blob, expected) in POISON.items():
        plant_ready(raw, keys, f"poison-{name}", blob)
        planted.dead[f"poison-{name}"] = expected
    return planted


def plant_ids(raw: redis.Redis, keys: QueueKeys, worker: str) -> Planted:
    huge = "h" * HUGE
    raw.rpush(keys.ready, "ghost", "g" * HUGE)
    plant_ready(raw, keys, huge, envelope("unregistered"))
    return Planted(dead={huge: "no handler named 'unregistered'"}, dropped=["ghost", "g" * HUGE])


def plant_non_utf8(raw: redis.Redis, keys: QueueKeys, worker: str) -> Planted:
    raw.rpush(keys.ready, b"\xff\xfe-no-envelope")
    plant_ready(raw, keys, b"\xc3\x28-with-envelope", envelope(data={"non-utf8": True}))
    raw.zadd(keys.scheduled, {b"\xfe-scheduled": 0})
    raw.hset(keys.tasks, b"\xfe-scheduled", envelope(data={"non-utf8": True}))
    return Planted(either=[b"\xff\xfe-no-envelope", b"\xc3\x28-with-envelope", b"\xfe-scheduled"])


def replace_key(part: str, write: Callable[[redis.Redis, str], Any], name: str = "") -> Scenario:
    """A scenario that turns one of the queue's keys into the wrong type."""

    def plant(raw: redis.Redis, keys: QueueKeys, worker: str) -> Planted:
        key = keys.active(worker) if part == "active" else getattr(keys, part)
        raw.delete(key)
        write(raw, key)
        if part == "tasks":
            raw.rpush(keys.ready, "waiting")  # makes the claim script read `tasks`
        if part == "ready":  # a valid task falls due while `ready` is broken
            raw.hset(keys.tasks, "due-meanwhile", envelope(data={"due": True}))
            raw.zadd(keys.scheduled, {"due-meanwhile": 1})
            return Planted(runs=["due-meanwhile"])
        return Planted()

    def restore(raw: redis.Redis, keys: QueueKeys, worker: str) -> None:
        raw.delete(keys.active(worker) if part == "active" else getattr(keys, part))

    return Scenario(name or f"{part}-a-string", plant, restore)


def plant_bad_bucket(raw: redis.Redis, keys: QueueKeys, worker: str) -> Planted:
    """A delayed bucket turned into a string, indexed as due: a dispatcher is given it."""
    raw.set(keys.delayed_bucket("0:0"), "garbage")
    raw.zadd(keys.delayed, {"0:0": 1})
    return Planted()


def restore_bad_bucket(raw: redis.Redis, keys: QueueKeys, worker: str) -> None:
    raw.delete(keys.delayed_bucket("0:0"))  # its index entry is left for the dispatcher


def plant_bad_lease(raw: redis.Redis, keys: QueueKeys, worker: str) -> Planted:
    raw.zadd(keys.leases, {b"no-separator": 1, b"\xff|bad-utf8": 1})
    return Planted()


def restore_bad_lease(raw: redis.Redis, keys: QueueKeys, worker: str) -> None:
    raw.zrem(keys.leases, "no-separator", b"\xff|bad-utf8")


SCENARIOS = [
    Scenario("poison-envelopes", plant_poison),
    Scenario("ids-without-envelopes", plant_ids),
    Scenario("non-utf8-ids", plant_non_utf8),
    replace_key("ready", lambda raw, key: raw.set(key, "garbage")),
    replace_key("ready", lambda raw, key: raw.hset(key, "a", "b"), "ready-a-hash"),
    replace_key("tasks", lambda raw, key: raw.rpush(key, "not", "a", "hash"), "tasks-a-list"),
    replace_key("scheduled", lambda raw, key: raw.set(key, "garbage")),
    replace_key("workers", lambda raw, key: raw.set(key, "garbage")),
    replace_key("wake", lambda raw, key: raw.set(key, "garbage")),
    replace_key("active", lambda raw, key: raw.set(key, "garbage"), "processing-list-a-string"),
    Scenario("delayed-bucket-a-string", plant_bad_bucket, restore_bad_bucket),
    Scenario("lease-members-malformed", plant_bad_lease, restore_bad_lease),
]
KEY_SCENARIOS = [s.name for s in SCENARIOS[3:]]
#: Scenarios whose daemons must log something about the broken key (a malformed lease
#: member may just as well be dropped quietly).
MUST_LOG = [name for name in KEY_SCENARIOS if name.endswith(("-a-string", "-a-hash", "-a-list"))]


class ScenarioLog(logging.Handler):
    """Collects duetime's warnings and errors, tagged with the scenario whose daemon
    logged them (each scenario's daemons run in their own context)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[tuple[str | None, logging.LogRecord]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((_scenario.get(None), record))

    def of(self, name: str) -> list[str]:
        return [record.getMessage() for tag, record in self.records if tag == name]


@dataclass
class Running:
    scenario: Scenario
    server: Server
    raw: redis.Redis
    worker: Worker
    dispatcher: Dispatcher
    runs: list[asyncio.Task[None]]
    healthy_done: list[str] = field(default_factory=list)
    planted: Planted = field(default_factory=Planted)
    outcome: Outcome = field(default_factory=Outcome)


def command_count(raw: redis.Redis) -> int:
    stats = raw.info("commandstats")
    mine = ("cmdstat_info", "cmdstat_config|resetstat")
    return sum(v["calls"] for k, v in stats.items() if k not in mine)


def dead_parts(run: Running, registry: list[tuple[str | None, asyncio.Task[Any]]]) -> list[str]:
    """Daemon tasks that ended: the run() coroutines, and the worker's and dispatcher's
    long-lived loops (named duetime-*)."""
    problems = []
    for task in run.runs:
        if task.done():
            error = None if task.cancelled() else task.exception()
            problems.append(f"a daemon's run() ended: {error!r}")
    for tag, task in registry:
        if tag != run.scenario.name or not task.get_name().startswith("duetime-"):
            continue
        if task.done() and not task.cancelled() and task.exception() is not None:
            problems.append(f"{task.get_name()} died: {task.exception()!r}")
    return problems


def where(raw: redis.Redis, keys: QueueKeys, task_id: str | bytes, worker: str) -> list[str]:
    places = []
    if scheduled_score(raw, keys, task_id) is not None:
        places.append("scheduled")
    if raw.zscore(keys.dead, task_id) is not None:
        places.append("dead")
    # redis-py annotates LPOS's value as str only; it sends a bytes value as it is.
    if raw.type(keys.ready) == b"list" and raw.lpos(keys.ready, task_id) is not None:  # type: ignore[arg-type]
        places.append("ready")
    active = keys.active(worker)
    if raw.type(active) == b"list" and raw.lpos(active, task_id) is not None:  # type: ignore[arg-type]
        places.append("processing list")
    return places


def check_planted(run: Running, log: ScenarioLog) -> list[str]:
    keys = QueueKeys(GARBAGE_QUEUE)
    raw, worker = run.raw, run.worker.worker_id
    messages = log.of(run.scenario.name)
    problems = []
    for task_id, expected in run.planted.dead.items():
        shown = repr(task_id)[:40]
        if raw.zscore(keys.dead, task_id) is None:
            problems.append(f"{shown} is not dead; it is in {where(raw, keys, task_id, worker)}")
            continue
        record = raw.hget(keys.errors, task_id)
        error = codec.decode_error(as_bytes(record)).error if record else "(no error record)"
        if expected not in error:
            problems.append(f"{shown} is dead with error {error!r}, expected {expected!r}")
    for task_id in run.planted.dropped:
        shown = repr(task_id)[:40]
        if places := where(raw, keys, task_id, worker):
            problems.append(f"{shown} was not dropped; it is in {places}")
        text = task_id.decode(errors="replace") if isinstance(task_id, bytes) else task_id
        if not any(text[:40] in message and "no envelope" in message for message in messages):
            problems.append(f"no log line says why {shown} was dropped")
    ran = {i.encode(errors="surrogateescape") for i in run.healthy_done}
    for task_id in run.planted.either:
        shown = repr(task_id)[:40]
        places = where(raw, keys, task_id, worker)
        raw_id = task_id.encode() if isinstance(task_id, str) else task_id
        if places and places != ["dead"]:
            problems.append(f"{shown} neither ended in dead nor was skipped; it is in {places}")
        elif not places and raw_id not in ran and not messages:
            problems.append(f"{shown} was skipped without any log line saying why")
    return problems


async def heartbeating(run: Running) -> bool:
    """Whether the worker is registered with a recent heartbeat (within 3 s: generous,
    it beats every 0.2 s)."""
    keys = QueueKeys(GARBAGE_QUEUE)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        beat = run.raw.zscore(keys.workers, run.worker.worker_id)
        seconds, micros = run.raw.time()
        if beat is not None and seconds * 1000 + micros // 1000 - beat < 3000:
            return True
        await asyncio.sleep(0.1)
    return False


async def healthy_round(run: Running) -> list[str]:
    """Schedule a healthy task (through `scheduled`, so both daemons are needed) and
    wait until it ran and was acknowledged; valid tasks planted with the garbage must
    have run by then too."""
    async with AsyncQueue(GARBAGE_QUEUE, run.server.url) as queue:
        try:
            task_id = await queue.schedule_in(0.05, {"healthy": True})
        except DuetimeError as error:
            return [f"could not schedule a healthy task after the garbage was removed: {error}"]
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            if task_id in run.healthy_done and await queue.status(task_id) is None:
                break
            await asyncio.sleep(0.05)
        else:
            state = await queue.status(task_id)
            ran = "ran" if task_id in run.healthy_done else "did not run"
            return [f"a healthy task scheduled afterwards {ran}; it is {state and state.state}"]
    problems = []
    keys = QueueKeys(GARBAGE_QUEUE)
    for earlier in run.planted.runs:  # had all the time the healthy task had
        if earlier not in run.healthy_done:
            places = where(run.raw, keys, earlier, run.worker.worker_id) or "no place (lost)"
            problems.append(f"valid task {earlier!r} planted with the garbage never ran: {places}")
    return problems


async def run_scenarios(servers: list[Server]) -> dict[str, Outcome]:
    loop = asyncio.get_running_loop()
    registry: list[tuple[str | None, asyncio.Task[Any]]] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        context = kwargs.get("context")
        tag = context.get(_scenario) if context is not None else _scenario.get(None)
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        registry.append((tag, task))
        return task

    loop.set_task_factory(factory)
    log = ScenarioLog()
    duetime_log = logging.getLogger("duetime")
    duetime_log.addHandler(log)
    duetime_log.propagate = False  # thousands of lines; the outcomes say what matters
    runs: list[Running] = []
    try:
        for scenario, server in zip(SCENARIOS, servers, strict=True):
            done: list[str] = []

            async def healthy(data: Any, done: list[str] = done) -> None:
                done.append(duetime.current_task().id)

            worker = Worker(App(default=healthy), GARBAGE_QUEUE, server.url,
                            settings=GARBAGE_SETTINGS, worker_id=f"w-{scenario.name}")  # fmt: skip
            dispatcher = Dispatcher([GARBAGE_QUEUE], server.url, settings=GARBAGE_SETTINGS)
            context = contextvars.copy_context()
            context.run(_scenario.set, scenario.name)
            tasks = [loop.create_task(d.run(), context=context) for d in (worker, dispatcher)]
            runs.append(Running(scenario, server, server.client(), worker, dispatcher, tasks, done))
        keys = QueueKeys(GARBAGE_QUEUE)
        await wait_until(
            lambda: all(r.raw.zcard(keys.workers) == 1 for r in runs), what="workers registered"
        )
        for run in runs:
            run.planted = run.scenario.plant(run.raw, keys, run.worker.worker_id)
            run.raw.config_resetstat()
        await asyncio.sleep(WINDOW)
        for run in runs:
            run.outcome.commands = command_count(run.raw)
            if run.outcome.commands > COMMAND_BOUND:
                run.outcome.problems.append(
                    f"{run.outcome.commands} commands in {WINDOW:g} s: the daemons spin"
                )
            run.outcome.problems += dead_parts(run, registry)
            if run.scenario.name in MUST_LOG and not log.of(run.scenario.name):
                run.outcome.problems.append("nothing was logged about the broken key")
            run.scenario.restore(run.raw, keys, run.worker.worker_id)
        rounds = await asyncio.gather(*(healthy_round(run) for run in runs))
        for run, problems in zip(runs, rounds, strict=True):
            run.outcome.problems += problems
            run.outcome.problems += check_planted(run, log)
            if not await heartbeating(run):
                run.outcome.problems.append("the worker stopped heartbeating")
            for problem in dead_parts(run, registry):
                if problem not in run.outcome.problems:
                    run.outcome.problems.append(problem)
    finally:
        for run in runs:
            run.worker.stop()
            run.dispatcher.stop()
        every = [task for run in runs for task in run.runs]
        if every:
            _, pending = await asyncio.wait(every, timeout=20)
            for task in pending:
                task.cancel()
        duetime_log.removeHandler(log)
        duetime_log.propagate = True
        for run in runs:
            run.raw.close()
    return {run.scenario.name: run.outcome for run in runs}


@pytest.fixture(scope="module")
def garbage_outcomes(server: Server) -> Iterator[dict[str, Outcome]]:
    """Every garbage scenario at once, each on its own throwaway server of this kind
    (so each scenario's command count is its own), with its own worker and dispatcher."""
    servers = [Server(server.kind, server.executable) for _ in SCENARIOS]
    try:
        for instance in servers:
            instance.start()
        yield asyncio.run(run_scenarios(servers))
    finally:
        for instance in servers:
            instance.stop()


def report(outcomes: dict[str, Outcome], name: str) -> str:
    outcome = outcomes[name]
    return f"{name} ({outcome.commands} commands in {WINDOW:g} s):\n  " + "\n  ".join(
        outcome.problems
    )


def test_poison_envelopes_go_to_dead_with_a_clear_error(
    garbage_outcomes: dict[str, Outcome],
) -> None:
    """Undecodable, truncated, wrongly typed, future-version and unknown-handler
    envelopes planted in `ready` each end in `dead` with an error saying why; the worker
    and dispatcher live on and serve a healthy task."""
    assert not garbage_outcomes["poison-envelopes"].problems, report(
        garbage_outcomes, "poison-envelopes"
    )


def test_ids_without_envelopes_and_huge_ids_are_handled(
    garbage_outcomes: dict[str, Outcome],
) -> None:
    """Ids in `ready` with no envelope (one of them 10 kB long) are dropped with a log
    line naming them; a 10 kB id with an envelope for an unknown handler goes to dead."""
    assert not garbage_outcomes["ids-without-envelopes"].problems, report(
        garbage_outcomes, "ids-without-envelopes"
    )


def test_non_utf8_ids_do_not_crash_the_daemons(garbage_outcomes: dict[str, Outcome]) -> None:
    """Ids that are not UTF-8 (in `ready`, with and without an envelope, and in
    `scheduled`) end in dead, are skipped with a logged reason, or simply run; no daemon
    loop dies."""
    assert not garbage_outcomes["non-utf8-ids"].problems, report(garbage_outcomes, "non-utf8-ids")


@pytest.mark.parametrize("scenario", KEY_SCENARIOS)
def test_a_key_of_the_wrong_type_neither_kills_nor_spins_the_daemons(
    garbage_outcomes: dict[str, Outcome], scenario: str
) -> None:
    """One of the queue's keys holds the wrong type (or a lease member is malformed):
    the daemons log the error and back off (bounded command count), none of their loops
    dies, and once the key is removed they serve a healthy task again."""
    assert not garbage_outcomes[scenario].problems, report(garbage_outcomes, scenario)


def test_inspection_survives_non_utf8_ids(
    redis_url: str, raw: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stats(), check(), dead_tasks() and `duetime inspect --check` / `dead list` read a
    queue holding non-UTF-8 ids without crashing: they are the tools for finding garbage."""
    keys = QueueKeys(queue_name)
    raw.rpush(keys.ready, b"\xff-ready")
    raw.zadd(keys.scheduled, {b"\xfe-scheduled": 1})
    raw.hset(keys.tasks, b"\xfd-dead", envelope())
    raw.zadd(keys.dead, {b"\xfd-dead": 1})
    raw.zadd(keys.workers, {b"w\xff": 1})
    raw.rpush(f"duetime:{{{queue_name}}}:active:".encode() + b"w\xff", b"\xfc-running")
    problems = []
    with Queue(queue_name, redis_url) as queue:
        for name, call in (
            ("stats", queue.stats),
            ("check", queue.check),
            ("dead_tasks", queue.dead_tasks),
        ):
            try:
                call()
            except Exception as error:
                problems.append(f"{name}() raised {type(error).__name__}: {error}")
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    runner = CliRunner()
    for arguments in (
        ["inspect", "-q", queue_name, "--check"],
        ["dead", "list", "-q", queue_name],
        ["dead", "list", "-q", queue_name, "--json"],
    ):
        result = runner.invoke(main, arguments)
        if result.exit_code not in (0, 1):
            problems.append(
                f"duetime {' '.join(arguments)}: exit {result.exit_code}, {result.exception!r}"
            )
    assert problems == []


# --- a server that refuses the daemons ------------------------------------------------


def test_daemons_back_off_while_redis_refuses_them(
    server: Server, raw: redis.Redis, queue_name: str
) -> None:
    """A wrong password (AUTH fails) and a port nothing listens on: workers and
    dispatchers keep retrying with a growing pause, not in a loop. Counted over 1.5 s:
    AUTH attempts on the server, and the warnings logged per address (a pause doubling
    from 0.05 s allows about ten of each per daemon; a loop without one, thousands)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record)  # type: ignore[method-assign]
    with socket.socket() as held:  # bound, never listening: connections are refused
        held.bind(("127.0.0.1", 0))
        ports = {"wrong password": server.port, "nothing listening": held.getsockname()[1]}
        urls = [
            f"redis://nobody:wrong@127.0.0.1:{server.port}/0",
            f"redis://127.0.0.1:{ports['nothing listening']}/0",
        ]

        async def scenario() -> int:
            daemons: list[Worker | Dispatcher] = []
            for url in urls:
                daemons.append(Worker(App(default=print), queue_name, url, settings=FAST))
                daemons.append(Dispatcher([queue_name], url, settings=FAST))
            tasks = [asyncio.create_task(daemon.run()) for daemon in daemons]
            await asyncio.sleep(0.3)
            raw.config_resetstat()
            records.clear()
            await asyncio.sleep(1.5)
            auth = int(raw.info("commandstats").get("cmdstat_auth", {}).get("calls", 0))
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=5)
            return auth

        logging.getLogger("duetime").addHandler(handler)
        try:
            auth = asyncio.run(scenario())
        finally:
            logging.getLogger("duetime").removeHandler(handler)
    problems = []
    if auth > 150:
        problems.append(f"{auth} AUTH attempts in 1.5 s")
    for refusal, port in ports.items():
        logged = [r.getMessage() for r in records if f":{port}/" in r.getMessage()]
        if len(logged) > 75:
            problems.append(f"{refusal}: {len(logged)} warnings in 1.5 s, e.g. {logged[-1]}")
    assert not problems, "\n".join(problems)
