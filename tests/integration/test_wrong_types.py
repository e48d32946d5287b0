"""Wrong types at every door of ``Queue`` and ``AsyncQueue``: each public method, each of
its parameters (its keyword options too) and each parameter of the constructors, given
a value of a type it does not take, raises a duetime error of the input kinds
(``InvalidInputError``, or ``ConfigurationError`` for a setting) whose message names
what was wrong, and writes nothing to the server: never ``CorruptStateError`` (which
blames data in Redis), never a bare ``TypeError`` or a redis-py error.

The table below lists every parameter and the types it takes; a test checks that it
covers the whole public surface, so a method added later without its row fails here.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duetime import (
    App,
    AsyncQueue,
    Debounce,
    Job,
    KeyLimits,
    Limits,
    Queue,
    Rate,
    Settings,
    TaskSearch,
    Throttle,
    Unique,
)
from duetime.client.models import TASK_OPTIONS, KeyedCallOptions
from duetime.cron.options import SCHEDULE_OPTIONS
from duetime.errors import ConfigurationError, CorruptStateError, DuetimeError, InvalidInputError
from duetime.hooks import Hooks
from tests.conftest import require_binary
from tests.servers import Server

_app = App()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """One server kind only: a wrong type is refused in the client, before any command,
    so the kind cannot matter (the check that nothing was written still needs one)."""
    instance = Server("redis", require_binary("redis"))
    instance.start()
    yield instance
    instance.stop()


@_app.task(name="send_email")
def send_email(data: object) -> None:
    """A registered handler: a valid ``task=``."""


# --- what each parameter takes -------------------------------------------------------


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _moment(value: object) -> bool:
    return _number(value) or isinstance(value, datetime)


def _duration(value: object) -> bool:
    return _number(value) or isinstance(value, timedelta)


def _text(value: object) -> bool:
    return isinstance(value, str)


def _or_none(accepts: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or accepts(value)


def _kind(*kinds: type) -> Callable[[object], bool]:
    return lambda value: isinstance(value, kinds)


def _ids(value: object) -> bool:
    if value is None or isinstance(value, str):
        return True
    if not isinstance(value, list | tuple | set | frozenset):
        return False
    return all(isinstance(item, str) for item in value)


def _handler(value: object) -> bool:
    return value is None or isinstance(value, str) or callable(value)


def _encodable(value: object) -> bool:
    """Data may be anything msgpack encodes; the values drawn for it (UNENCODABLE) are
    none of that."""
    return False


def _iterable(value: object) -> bool:
    return isinstance(value, Iterable) and not isinstance(value, str | bytes)


def _hooks(value: object) -> bool:
    if not isinstance(value, Iterable) or isinstance(value, str | bytes):
        return False
    return all(isinstance(hook, Hooks) for hook in value)


@dataclass(frozen=True)
class Param:
    name: str
    accepts: Callable[[object], bool]
    #: What the refusal's message must name (default: the parameter's name).
    named: str = ""
    #: Values drawn for it (default: every kind of value, those it takes left out).
    wrong: st.SearchStrategy[Any] | None = None

    @property
    def must_name(self) -> str:
        return self.named or self.name


@dataclass(frozen=True)
class Method:
    name: str
    valid: dict[str, Any]  # a call whose every argument is of the right type
    params: tuple[Param, ...]
    constructor: bool = False


WRONG_VALUES: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(["cap", "a", "rate"]), st.integers(0, 5), max_size=2),
    st.sampled_from(
        [
            object(),
            {1, 2},
            frozenset(),
            complex(1, 2),
            Decimal("1.5"),
            datetime(2030, 1, 1),  # naive
            datetime(2030, 1, 1, tzinfo=UTC),
            timedelta(seconds=5),
            Limits(cap=5),
            KeyLimits(concurrency=5),
            Rate(5),
            TaskSearch(task="x"),
            b"bytes",
            (1, 2),
            "cap=5",
            print,  # a plain function, not a handler
        ]
    ),
)

UNENCODABLE = st.sampled_from([object(), {1, 2}, complex(1, 2), Decimal("1"), print])


def _future() -> float:
    return time.time() + 3600


TASK_OPTION_PARAMS = (
    Param("task", _handler),
    Param("id", _or_none(_text), "task id"),
    Param("max_attempts", _or_none(_integer)),
    Param("timeout", _or_none(_duration)),
    Param("result_ttl", _or_none(_duration)),
    Param("expires", _or_none(_duration)),
    Param("priority", _integer),
    Param("limit_key", _or_none(_text)),
    Param("cost", _integer),
    Param("debounce", _or_none(_kind(Debounce)), "debounce"),
    Param("throttle", _or_none(_kind(Throttle)), "throttle"),
    Param("unique", _or_none(_kind(Unique)), "unique"),
)
CRON_OPTION_PARAMS = (
    Param("tz", _text),
    Param("task", _handler),
    Param("missed", _text),
    Param("overlap", _text),
    Param("max_attempts", _or_none(_integer)),
    Param("timeout", _or_none(_duration)),
    Param("priority", _integer),
    Param("limit_key", _or_none(_text)),
    Param("cost", _integer),
    Param("every", _or_none(_duration)),
    Param("catch_up", _or_none(_duration)),
    Param("jitter", _or_none(_duration)),
    Param("start", _or_none(_moment)),
    Param("end", _or_none(_moment)),
    Param("max_runs", _or_none(_integer)),
    Param("pause_after_failures", _or_none(_integer)),
)
DATA = Param("data", _encodable, "data", UNENCODABLE)
TASK_ID = Param("task_id", _text, "task id")
TASK_IDS = Param("task_ids", _ids, "task id")
CRON_NAME = Param("name", _text, "cron job name")


def _cron_job() -> Any:
    with Queue("wrongtypes") as queue:
        return queue.cron_job("job", "* * * * *", {"a": 1})


METHODS: tuple[Method, ...] = (
    Method(
        "__init__",
        {
            "name": "q",
            "redis": None,
            "settings": Settings(),
            "clock": None,
            "result_ttl": None,
            "durable": None,
            "shards": 1,
            "hooks": (),
        },
        (
            Param("name", _text, "queue name"),
            Param("redis", _or_none(_kind(str, redis.Redis)), "redis"),
            Param("settings", _kind(Settings), "settings"),
            Param("clock", lambda value: value is None or hasattr(value, "now_ms"), "clock"),
            Param("result_ttl", _or_none(_duration)),
            Param("durable", _or_none(_kind(bool))),
            Param("shards", _integer),
            Param("hooks", _hooks),
        ),
        constructor=True,
    ),
    Method(
        "schedule_task",
        {"at": _future(), "data": {"a": 1}},
        (Param("at", _moment, "run-at"), DATA, *TASK_OPTION_PARAMS),
    ),
    Method(
        "schedule_in",
        {"delay": 60, "data": {"a": 1}},
        (Param("delay", _duration), DATA, *TASK_OPTION_PARAMS),
    ),
    Method("schedule_now", {"data": {"a": 1}}, (DATA, *TASK_OPTION_PARAMS)),
    Method(
        "schedule_keyed",
        {"data": {"a": 1}, "unique": Unique("k")},
        (
            DATA,
            Param("at", _or_none(_moment), "run-at"),
            Param("delay", _or_none(_duration)),
            # Under unique (the valid call's mode) duetime names the task: any id is refused.
            Param("id", lambda value: value is None, "leave out id"),
            *(p for p in TASK_OPTION_PARAMS if p.name not in ("unique", "id")),
        ),
    ),
    Method("schedule_many", {"jobs": [Job({"a": 1}, delay=60)]}, (Param("jobs", _iterable),)),
    Method("cancel", {"task_id": "t1"}, (TASK_ID,)),
    Method(
        "cancel_many",
        {"task_ids": ["t1"], "stop_running": True},
        (TASK_IDS, Param("stop_running", _kind(bool))),
    ),
    Method(
        "reschedule", {"task_id": "t1", "at": _future()}, (TASK_ID, Param("at", _moment, "run-at"))
    ),
    Method("reschedule_in", {"task_id": "t1", "delay": 60}, (TASK_ID, Param("delay", _duration))),
    Method(
        "reschedule_many",
        {"task_ids": ["t1"], "at": _future()},
        (TASK_IDS, Param("at", _moment, "run-at")),
    ),
    Method(
        "reschedule_many_in",
        {"task_ids": ["t1"], "delay": 60},
        (TASK_IDS, Param("delay", _duration)),
    ),
    Method("run_now", {"task_id": "t1"}, (TASK_ID,)),
    Method("run_now_many", {"task_ids": ["t1"]}, (TASK_IDS,)),
    Method("status", {"task_id": "t1"}, (TASK_ID,)),
    Method(
        "result", {"task_id": "t1", "timeout": 0}, (TASK_ID, Param("timeout", _or_none(_duration)))
    ),
    Method("stats", {}, ()),
    Method("check", {}, ()),
    Method("close", {}, ()),
    Method("pause", {}, ()),
    Method("resume", {}, ()),
    Method("is_paused", {}, ()),
    Method("limits", {}, ()),
    Method("history_size", {}, ()),
    Method(
        "tasks",
        {"state": "scheduled", "limit": 5, "offset": 0},
        (Param("state", _text), Param("limit", _integer), Param("offset", _integer)),
    ),
    Method("throughput", {"minutes": 5}, (Param("minutes", _integer),)),
    Method(
        "dead_tasks",
        {"limit": 5, "offset": 0},
        (Param("limit", _integer), Param("offset", _integer)),
    ),
    Method("requeue_dead", {"task_ids": ["t1"]}, (TASK_IDS,)),
    Method("purge_dead", {"task_ids": ["t1"]}, (TASK_IDS,)),
    Method("requeue_many", {"task_ids": ["t1"]}, (TASK_IDS,)),
    Method("purge_many", {"task_ids": ["t1"]}, (TASK_IDS,)),
    Method("flow", {"most_keys": 5}, (Param("most_keys", _integer),)),
    Method("set_limits", {"limits": Limits(cap=5)}, (Param("limits", _kind(Limits)),)),
    Method("set_queue_limits", {"limits": Limits(cap=5)}, (Param("limits", _kind(Limits)),)),
    Method(
        "set_key_limits",
        {"key": "a", "limits": KeyLimits(concurrency=5)},
        (Param("key", _text, "limit_key"), Param("limits", _or_none(_kind(KeyLimits)))),
    ),
    Method("set_history", {"size": 10}, (Param("size", _or_none(_integer)),)),
    Method(
        "history",
        {"limit": 5, "offset": 0, "task": None, "outcome": None, "task_id": None},
        (
            Param("limit", _integer),
            Param("offset", _integer),
            Param("task", _handler),
            Param("outcome", _or_none(_text)),
            Param("task_id", _or_none(_text), "task id"),
        ),
    ),
    Method(
        "search",
        {"criteria": TaskSearch(task="x"), "cursor": None, "budget": 100, "limit": 5},
        (
            Param("criteria", _kind(TaskSearch)),
            Param("cursor", _or_none(_text)),
            Param("budget", _integer),
            Param("limit", _integer),
        ),
    ),
    Method(
        "cron_job",
        {"name": "job", "expression": "* * * * *", "data": {"a": 1}},
        (CRON_NAME, Param("expression", _or_none(_text)), DATA, *CRON_OPTION_PARAMS),
    ),
    Method(
        "add_cron",
        {"name": "job", "expression": "* * * * *", "data": {"a": 1}},
        (CRON_NAME, Param("expression", _or_none(_text)), DATA, *CRON_OPTION_PARAMS),
    ),
    Method("add_crons", {"jobs": [_cron_job()]}, (Param("jobs", _iterable),)),
    Method(
        "sync_cron",
        {"jobs": [_cron_job()], "prune": False},
        (Param("jobs", _iterable), Param("prune", _kind(bool))),
    ),
    Method("list_cron", {"upcoming": 3}, (Param("upcoming", _integer),)),
    Method("cron_info", {"name": "job", "upcoming": 3}, (CRON_NAME, Param("upcoming", _integer))),
    Method("pause_cron", {"name": "job"}, (CRON_NAME,)),
    Method("resume_cron", {"name": "job"}, (CRON_NAME,)),
    Method("remove_cron", {"name": "job"}, (CRON_NAME,)),
    Method("trigger_cron", {"name": "job"}, (CRON_NAME,)),
    Method(
        "backfill_cron",
        {"name": "job", "start": time.time() - 600, "end": time.time() - 60, "rate": 1.0},
        (
            CRON_NAME,
            Param("start", _moment, "start"),
            Param("end", _or_none(_moment), "end"),
            Param("rate", _number),
        ),
    ),
    Method("task", {"handler": send_email}, (Param("handler", callable, "handler"),)),
)

#: Public names that take no caller's values: a worker lends its own queue with ``lent``.
NOT_CALLED_BY_USERS = frozenset({"lent"})

CASES = [
    pytest.param(method, param, id=f"{method.name}-{param.name}")
    for method in METHODS
    for param in method.params
]


def test_the_table_covers_every_public_parameter() -> None:
    """Every public method of both classes, and every parameter (keyword options by
    name), has its row: a method added without one fails here."""
    table = {method.name: {param.name for param in method.params} for method in METHODS}
    keyword_options = {
        "schedule_task": TASK_OPTIONS,
        "schedule_in": TASK_OPTIONS,
        "schedule_now": TASK_OPTIONS,
        "schedule_keyed": frozenset(KeyedCallOptions.__annotations__) - {"unique"} | {"data"},
        "cron_job": {p.name for p in CRON_OPTION_PARAMS},
        "add_cron": {p.name for p in CRON_OPTION_PARAMS},
    }
    missing = []
    for cls in (Queue, AsyncQueue):
        for name, member in inspect.getmembers(cls, callable):
            if (name.startswith("_") and name != "__init__") or name in NOT_CALLED_BY_USERS:
                continue
            if name == "__init__" and member is object.__init__:
                continue
            parameters = [
                p.name
                for p in inspect.signature(member).parameters.values()
                if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
            ]
            wanted = set(parameters) | set(keyword_options.get(name, ()))
            if name not in table:
                missing.append(f"{cls.__name__}.{name}")
                continue
            missing += [f"{cls.__name__}.{name}({p})" for p in sorted(wanted - table[name])]
    assert not missing, f"no row in METHODS for: {missing}"
    # Unique is the mode schedule_keyed's valid call uses; its row is the other modes'.
    assert "unique" in KeyedCallOptions.__annotations__
    assert set(SCHEDULE_OPTIONS) <= {p.name for p in CRON_OPTION_PARAMS}


def _changes(raw: redis.Redis) -> int:
    """Writes the server has applied since it started (each one that changed a key)."""
    return int(raw.info("persistence")["rdb_changes_since_last_save"])


def _check_refusal(error: BaseException, method: Method, param: Param, value: object) -> None:
    call = f"{method.name}({param.name}={value!r})"
    assert not isinstance(error, CorruptStateError), f"{call} blamed Redis: {error}"
    assert isinstance(error, InvalidInputError | ConfigurationError), (
        f"{call} raised {type(error).__name__}: {error} (not a duetime input error)"
    )
    message = str(error)
    assert param.must_name.lower() in message.lower(), (
        f"{call} said {message!r}, which does not name {param.must_name!r}"
    )


def _call_sync(method: Method, arguments: dict[str, Any], url: str, queue: str) -> None:
    if method.constructor:
        Queue(**(arguments | {"redis": arguments.get("redis", url)})).close()
        return
    with Queue(queue, url) as client:
        getattr(client, method.name)(**arguments)


async def _call_async(method: Method, arguments: dict[str, Any], url: str, queue: str) -> None:
    if method.constructor:
        await AsyncQueue(**(arguments | {"redis": arguments.get("redis", url)})).close()
        return
    async with AsyncQueue(queue, url) as client:
        outcome = getattr(client, method.name)(**arguments)
        if inspect.isawaitable(outcome):
            await outcome


def _arguments(method: Method, param: Param, value: object, url: str) -> dict[str, Any]:
    arguments = dict(method.valid)
    if method.constructor:
        arguments["redis"] = url
    arguments[param.name] = value
    return arguments


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize(("method", "param"), CASES)
@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(drawn=st.data())
def test_a_wrong_type_is_refused_at_the_door_with_nothing_written(
    redis_url: str, raw: redis.Redis, method: Method, param: Param, flavour: str, drawn: Any
) -> None:
    strategy = param.wrong if param.wrong is not None else WRONG_VALUES
    value = drawn.draw(strategy.filter(lambda v: not param.accepts(v)), label=param.name)
    queue = f"w{uuid.uuid4().hex[:10]}"
    arguments = _arguments(method, param, value, redis_url)
    before, keys = _changes(raw), raw.dbsize()
    try:
        if flavour == "sync":
            _call_sync(method, arguments, redis_url, queue)
        else:
            asyncio.run(_call_async(method, arguments, redis_url, queue))
    except DuetimeError as error:
        _check_refusal(error, method, param, value)
    except Exception as error:
        pytest.fail(f"{method.name}({param.name}={value!r}) raised {type(error).__name__}: {error}")
    else:
        pytest.fail(f"{method.name}({param.name}={value!r}) was accepted")
    assert (_changes(raw), raw.dbsize()) == (before, keys), (
        f"{method.name}({param.name}={value!r}) was refused but wrote to the server"
    )


def test_the_valid_calls_of_the_table_are_not_refused(redis_url: str) -> None:
    """The table's valid calls pass the door (a lookup may still find no task): what the
    property refuses is the one wrong argument, not another of the call."""
    refused = []
    for method in METHODS:
        arguments = dict(method.valid) | ({"redis": redis_url} if method.constructor else {})
        try:
            _call_sync(method, arguments, redis_url, f"v{uuid.uuid4().hex[:10]}")
        except InvalidInputError as error:
            refused.append(f"{method.name}: {error}")
        except DuetimeError:
            pass  # no such task or job: the door let it through
    assert not refused
