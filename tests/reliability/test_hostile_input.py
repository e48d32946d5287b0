"""The causes of the failures an independent hostile-input battery found, one focused
test (or a few) each, on a real server.

Each test asserts the behaviour of the fix (3aa6394 and the commits after it) and fails
on the code before it (70d8626), except where a docstring says the test guards
something related that already worked. The causes, in the order of the issue:

1. data nested one level short of msgpack's limit was accepted, then died in the worker;
2. ``result(id, timeout=nan)`` never returned;
3. ``requeue_dead("xy1")`` / ``purge_dead("pq1")`` iterated the string as ids;
4. ``Dispatcher("abc", url)`` served the queues a, b and c;
5. ``duetime worker mod:app`` crashed with a traceback when the module raised on import;
6. settings took nan, inf, 1e308, 30-digit, bool and float-for-int values;
7-9. a handler raising SystemExit or KeyboardInterrupt ended the worker's process;
10. garbage in an early run-at note stopped the claim of that task and its neighbours;
11. garbage in an attempt counter failed every claim, and in a counter of ``stats``
    failed ``schedule_now`` and ``inspect --check``;

then the smaller points (run-at at the end of 9999, ``schedule_task(None, ...)``, a huge
id, NaN in JSON, a database that is not a number, a 5 MB error message, a limit that is
a string).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis
from click.testing import CliRunner

import duetime
from duetime import App, Dispatcher, Queue, Settings, Worker
from duetime.cli import main
from duetime.errors import (
    ConfigurationError,
    InvalidNameError,
    InvalidOptionError,
    InvalidPayloadError,
    InvalidTimestampError,
    ResultTimeoutError,
)
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from tests.apps import RUNS
from tests.helpers import FAST, as_bytes, running, wait_until, wait_until_sync

#: The repository root: ``tests.apps`` is importable from there.
REPO = Path(__file__).resolve().parents[2]
#: Longest wait for anything these tests expect; the fixed code needs well under a
#: second each time, the old code times out here.
WAIT = 8.0
#: Settings for daemon processes, as FAST is for daemons in the test's loop.
FAST_ENV = {
    "DUETIME_RETRY_BASE": "0.02",
    "DUETIME_RETRY_MAX": "0.1",
    "DUETIME_HEARTBEAT_INTERVAL": "0.1",
    "DUETIME_WORKER_TTL": "0.5",
    "DUETIME_LEASE_DURATION": "1.0",
    "DUETIME_SHUTDOWN_GRACE": "2",
}


# --- helpers -----------------------------------------------------------------------------


def queue_keys(raw: redis.Redis, queue: str) -> list[bytes]:
    """Every key of the queue: after a refused call there must be none."""
    return list(raw.scan_iter(match=f"duetime:{{{queue}}}:*"))


def run_with_daemons(
    app: App,
    queue_name: str,
    redis_url: str,
    body: Callable[[], Awaitable[None]],
    *,
    dispatcher: Dispatcher | None = None,
) -> Worker:
    """Run ``body`` while a dispatcher and a worker (FAST settings) run in this event
    loop. The old code let SystemExit / KeyboardInterrupt out of the loop: that is a
    test failure here, never the end of the pytest session."""
    worker = Worker(app, queue_name, redis_url, settings=FAST)
    dispatcher = dispatcher or Dispatcher([queue_name], redis_url, settings=FAST)

    async def scenario() -> None:
        async with running(dispatcher, worker):
            await body()

    try:
        asyncio.run(scenario())
    except (SystemExit, KeyboardInterrupt) as error:
        pytest.fail(f"the worker's event loop died of {error!r}")
    return worker


def run_until(
    app: App, queue_name: str, redis_url: str, condition: Callable[[], bool], what: str
) -> Worker:
    async def body() -> None:
        await wait_until(condition, timeout=WAIT, what=what)

    return run_with_daemons(app, queue_name, redis_url, body)


def dead_count(queue: Queue) -> int:
    return queue.stats().dead


def runs(raw: redis.Redis) -> list[str]:
    return [
        entry.decode() if isinstance(entry, bytes) else entry for entry in raw.lrange(RUNS, 0, -1)
    ]


# --- 1. nesting: anything accepted decodes at the worker ---------------------------------


def nested(levels: int) -> list[Any]:
    """Lists nested ``levels`` deep: nested(1) is [], nested(2) is [[]]."""
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def depth(value: Any) -> int:
    levels = 0
    while isinstance(value, list):
        levels += 1
        value = value[0] if value else None
    return levels


def decodes(blob: bytes) -> bool:
    try:
        msgpack.unpackb(blob)
    except ValueError:  # msgpack's StackError is one
        return False
    return True


#: msgpack's decoder takes 1,024 levels of nesting; the envelope (an array holding the
#: data) takes one of them, so the data itself may have 1,023. Found by trying: the
#: premise is asserted by the test, so a msgpack with another limit says so at once.
DEEPEST = 1023


def test_data_nested_past_what_the_worker_decodes_is_refused_and_the_deepest_runs(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """1,024 levels used to be accepted (they decode on their own) and then died at the
    worker with a msgpack StackError (inside the envelope they are 1,025). Now they are
    refused with nothing written, and 1,023 levels run end to end."""
    deepest, too_deep = nested(DEEPEST), nested(DEEPEST + 1)
    assert decodes(msgpack.packb(too_deep)), "premise: decodes on its own"
    assert not decodes(b"\x91" + msgpack.packb(too_deep)), "premise: not inside an array"
    assert decodes(b"\x91" + msgpack.packb(deepest)), "premise: one level less does"
    seen: list[int] = []
    with Queue(queue_name, redis_url, result_ttl=60) as queue:
        size = raw.dbsize()
        with pytest.raises(InvalidPayloadError, match="decode"):
            queue.schedule_now(too_deep)
        assert (raw.dbsize(), queue_keys(raw, queue_name)) == (size, [])
        task_id = queue.schedule_now(deepest)
        run_until(
            App(default=lambda data: seen.append(depth(data))),
            queue_name,
            redis_url,
            lambda: queue.stats().counters.get("completed") == 1,
            "the deepest data to run",
        )
        assert seen == [DEEPEST]
        status = queue.status(task_id)
        assert status is not None and (status.state, status.succeeded) == ("finished", True)
        assert queue.stats().dead == 0


# --- 2. result() and the other waits refuse nan and inf ----------------------------------


def outcome_within(seconds: float, call: Callable[[], Any]) -> Any:
    """What ``call`` returned or raised, given ``seconds``; a call still waiting then
    fails the test (in a daemon thread, so a wait for ever cannot hang the run)."""
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(call())
        except BaseException as error:
            box.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still waiting after {seconds}s")
    return box[0]


@pytest.mark.parametrize(
    "timeout", [math.nan, math.inf, -1, True, "5"], ids=["nan", "inf", "-1", "True", "str"]
)
def test_result_refuses_a_timeout_that_is_not_a_finite_wait_at_once(
    redis_url: str, queue_name: str, timeout: Any
) -> None:
    """nan used to wait for ever (every comparison with it is false), inf too, True
    waited a second, -1 timed out and "5" raised TypeError. Each is refused before any
    wait (the server blocks 2 s at a time: a wait would overrun the 1 s allowed)."""
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_in(3600, {"n": 1}, result_ttl=60)
        started = time.monotonic()
        outcome = outcome_within(1.0, lambda: queue.result(task_id, timeout=timeout))
        assert isinstance(outcome, InvalidOptionError), repr(outcome)
        assert time.monotonic() - started < 1.0


def test_result_with_timeout_zero_looks_once(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """Guard (passed before the fix too): 0 is a valid timeout; it looks once, returning
    a stored result, and raises ResultTimeoutError at once for a task still pending."""
    with Queue(queue_name, redis_url, result_ttl=60) as queue:
        pending = queue.schedule_in(3600, {"n": 1})
        done = queue.schedule_now({"n": 2})
        run_until(
            App(default=lambda data: data["n"] * 10),
            queue_name,
            redis_url,
            lambda: queue.stats().counters.get("completed") == 1,
            "the task to finish",
        )
        started = time.monotonic()
        assert queue.result(done, timeout=0) == 20
        with pytest.raises(ResultTimeoutError):
            queue.result(pending, timeout=0)
        assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("delay", [math.nan, math.inf, -math.inf, -1], ids=str)
def test_schedule_in_refuses_a_delay_that_is_not_finite(
    redis_url: str, raw: redis.Redis, queue_name: str, delay: float
) -> None:
    """Guard (passed before the fix too): a delay must be a finite number from 0 up."""
    with Queue(queue_name, redis_url) as queue, pytest.raises(InvalidOptionError):
        queue.schedule_in(delay, {"n": 1})
    assert queue_keys(raw, queue_name) == []


# --- 3. a single string is one task id ---------------------------------------------------


def test_requeue_and_purge_take_a_single_string_as_one_id(redis_url: str, queue_name: str) -> None:
    """With dead tasks "x", "y", "1" and "xy1", requeue_dead("xy1") used to requeue x, y
    and 1 (the characters) and leave xy1 dead; purge_dead("pq1") likewise. Now a str is
    one id, and something that is neither an id nor a sequence of them is refused."""
    ids = ["x", "y", "1", "xy1", "p", "q", "pq1"]

    def broken(data: object) -> None:
        raise RuntimeError("always")

    with Queue(queue_name, redis_url) as queue:
        for task_id in ids:
            queue.schedule_now({}, id=task_id, max_attempts=1)
        run_until(
            App(default=broken),
            queue_name,
            redis_url,
            lambda: dead_count(queue) == len(ids),
            "every task dead",
        )
        assert queue.requeue_dead("xy1") == 1
        assert queue.purge_dead("pq1") == 1
        assert sorted(entry.id for entry in queue.dead_tasks()) == sorted(["x", "y", "1", "p", "q"])
        requeued = queue.status("xy1")
        assert requeued is not None and requeued.state == "ready"
        assert queue.status("pq1") is None
        for not_ids in (5, 1.5):
            with pytest.raises(InvalidNameError):
                queue.requeue_dead(not_ids)  # type: ignore[arg-type]
            with pytest.raises(InvalidNameError):
                queue.purge_dead(not_ids)  # type: ignore[arg-type]
        assert queue.stats().dead == 5


# --- 4. a dispatcher given one name serves one queue -------------------------------------


def test_a_dispatcher_given_one_name_serves_that_queue(redis_url: str, queue_name: str) -> None:
    """Dispatcher("abc", url) used to serve the queues "a", "b" and "c"."""
    assert Dispatcher("abc", redis_url).queues == ["abc"]
    dispatcher = Dispatcher(queue_name, redis_url, settings=FAST)
    assert dispatcher.queues == [queue_name]
    done: list[str] = []
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_in(0.05, {"n": 1})  # needs promoting by that dispatcher

        async def body() -> None:
            await wait_until(lambda: bool(done), timeout=WAIT, what="the promoted task")

        run_with_daemons(
            App(default=lambda data: done.append(duetime.current_task().id)),
            queue_name,
            redis_url,
            body,
            dispatcher=dispatcher,
        )
    assert done == [task_id]


# --- 5. an app module that raises on import ----------------------------------------------


@pytest.mark.parametrize("command", ["worker", "run"])
def test_an_app_module_raising_on_import_exits_2_with_one_line(
    redis_url: str, raw: redis.Redis, queue_name: str, tmp_path: Path, command: str
) -> None:
    """The import error used to escape as a traceback with exit code 1. Now: exit 2 and
    one line naming the exception, its message and where it was raised."""
    (tmp_path / "explodes_on_import.py").write_text('raise RuntimeError("boom while importing")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [*filter(None, [os.environ.get("PYTHONPATH")]), str(tmp_path)]
    )}  # fmt: skip
    completed = subprocess.run(
        [sys.executable, "-m", "duetime", command, "explodes_on_import:app",
         "-q", queue_name, "--redis", redis_url],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert completed.returncode == 2, completed.stderr
    assert "Traceback" not in completed.stderr
    naming = [line for line in completed.stderr.splitlines() if "RuntimeError" in line]
    assert len(naming) == 1, completed.stderr
    assert "boom while importing" in naming[0] and "explodes_on_import" in naming[0]
    assert queue_keys(raw, queue_name) == []


# --- 6. settings: finite, in range, of the right type ------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("maintenance_interval", math.nan),
        ("lease_duration", math.inf),
        ("task_timeout", 1e308),
        ("retry_max", math.inf),
        ("promote_ahead", math.nan),
        ("max_attempts", 10**30),
        ("dead_max", 10**30),
        ("max_attempts", True),
        ("shutdown_grace", True),
        ("max_attempts", 2.5),
        ("claim_batch", 5.0),
    ],
    ids=repr,
)
def test_settings_refuse_non_finite_huge_and_mistyped_values(field: str, value: object) -> None:
    """Each used to be taken (nan compares false with everything; a bool is an int; a
    float passed for an int). Now ConfigurationError names the field. (No server:
    refused where Settings is built.)"""
    with pytest.raises(ConfigurationError, match=field):
        Settings(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=field):
        FAST.replace(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DUETIME_MAINTENANCE_INTERVAL", "nan"),
        ("DUETIME_LEASE_DURATION", "inf"),
        ("DUETIME_WORKER_TTL", "-inf"),
        ("DUETIME_MAX_ATTEMPTS", "1000000000000"),
        ("DUETIME_DEAD_MAX", "1" * 30),
        ("DUETIME_PROMOTE_AHEAD", "1e308"),
        ("DUETIME_TASK_TIMEOUT", "1e308"),
        ("DUETIME_SOCKET_TIMEOUT", "nan"),
    ],
)
def test_settings_from_the_environment_refuse_them_naming_the_variable(
    variable: str, value: str
) -> None:
    with pytest.raises(ConfigurationError, match=variable):
        Settings.from_env({variable: value})


def test_every_command_exits_2_naming_a_bad_setting_variable(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """The daemons used to start with such values (and run with a nan interval), and
    inspect ran. Now each exits 2 naming the variable, before touching the queue. The
    four run at once; each command gets another of the variables."""
    cases = {
        "worker": ("DUETIME_MAINTENANCE_INTERVAL", "nan", ["worker", "tests.apps:app"]),
        "dispatcher": ("DUETIME_LEASE_DURATION", "inf", ["dispatcher"]),
        "run": ("DUETIME_MAX_ATTEMPTS", "1000000000000", ["run", "tests.apps:app"]),
        "inspect": ("DUETIME_PROMOTE_AHEAD", "1e308", ["inspect"]),
    }
    clean = {name: value for name, value in os.environ.items() if not name.startswith("DUETIME_")}
    processes = {}
    for command, (variable, value, arguments) in cases.items():
        processes[command] = subprocess.Popen(
            [sys.executable, "-m", "duetime", *arguments, "-q", queue_name, "--redis", redis_url],
            cwd=REPO, env={**clean, variable: value}, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
    problems = []
    deadline = time.monotonic() + 20
    for command, process in processes.items():
        variable = cases[command][0]
        try:
            _, stderr = process.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
            problems.append(f"{command} with {variable} bad was still running after 20 s")
            continue
        if process.returncode != 2 or variable not in stderr or "Traceback" in stderr:
            problems.append(f"{command}: exit {process.returncode}, stderr {stderr[-300:]!r}")
    assert problems == []
    assert queue_keys(raw, queue_name) == []


# --- 7-9. SystemExit and KeyboardInterrupt from a handler --------------------------------


def raising(name: str) -> BaseException:
    return SystemExit("handler exit") if name == "SystemExit" else KeyboardInterrupt()


def base_exception_app(raised: str, kind: str, calls: list[int], done: list[str]) -> App:
    """A handler "failing" that raises ``raised`` (sync or async) after noting its
    attempt, and a default handler noting the ids it runs."""
    app = App()

    def failing_sync(data: object) -> None:
        calls.append(duetime.current_task().attempt)
        raise raising(raised)

    async def failing_async(data: object) -> None:
        calls.append(duetime.current_task().attempt)
        raise raising(raised)

    app.task(failing_sync if kind == "sync" else failing_async, name="failing")
    app.default(lambda data: done.append(duetime.current_task().id))
    return app


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("raised", ["SystemExit", "KeyboardInterrupt"])
def test_a_handler_raising_systemexit_or_keyboardinterrupt_fails_only_its_attempt(
    redis_url: str, queue_name: str, raised: str, kind: str
) -> None:
    """It used to leave the event loop and end the worker (asyncio re-raises both from
    a task). Now the attempt fails with the exception as its error: retried, then dead,
    and the worker keeps running: a task scheduled afterwards runs."""
    calls: list[int] = []
    done: list[str] = []
    app = base_exception_app(raised, kind, calls, done)
    with Queue(queue_name, redis_url) as queue:
        bad = queue.schedule_now({}, task="failing", max_attempts=2)
        later: list[str] = []

        async def body() -> None:
            await wait_until(lambda: dead_count(queue) == 1, timeout=WAIT, what="the task dead")
            later.append(queue.schedule_now({"after": True}))
            await wait_until(lambda: done == later, timeout=WAIT, what="a later task")

        worker = run_with_daemons(app, queue_name, redis_url, body)
        status = queue.status(bad)
        assert status is not None and (status.state, status.attempts) == ("dead", 2)
        assert calls == [1, 2]
        expected = "SystemExit: handler exit" if raised == "SystemExit" else "KeyboardInterrupt"
        assert (status.last_error or "").startswith(expected), status.last_error
        assert (worker.counters.failed, worker.counters.dead) == (1, 1)
        assert queue.check() == []


def test_a_duetime_run_process_survives_such_handlers_and_still_stops_on_sigint(
    redis_url: str, raw: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    """The same under a real ``duetime run``: the old process exited on the first of
    these handlers. Now each task dies after its two attempts with the exception as its
    error, the process stays up and runs a later task, and a real SIGINT still stops it
    gracefully with exit code 0."""
    env = {**os.environ, **FAST_ENV, "DUETIME_TEST_RECORD_URL": redis_url}
    names = ["exit_sync", "exit_async", "interrupt_sync", "interrupt_async"]
    log_path = tmp_path / "run.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "duetime", "--log-level", "warning", "run",
             "tests.apps:app", "-q", queue_name, "--redis", redis_url],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
    try:

        def while_alive(condition: Callable[[], bool]) -> Callable[[], bool]:
            def check() -> bool:
                if process.poll() is not None:
                    raise AssertionError(
                        f"duetime run exited with {process.returncode}:\n"
                        + log_path.read_text()[-2000:]
                    )
                return condition()

            return check

        with Queue(queue_name, redis_url) as queue:
            bad = {name: queue.schedule_now({}, task=name, max_attempts=2) for name in names}
            wait_until_sync(
                while_alive(lambda: dead_count(queue) == len(names)),
                timeout=WAIT + 7,  # includes the process's start-up
                what="the four tasks dead",
            )
            later = queue.schedule_now({"after": True})
            wait_until_sync(
                while_alive(lambda: f"{later}:1" in runs(raw)), timeout=WAIT, what="a later task"
            )
            for name, task_id in bad.items():
                status = queue.status(task_id)
                assert status is not None and (status.state, status.attempts) == ("dead", 2)
                expected = "SystemExit: handler exit" if "exit" in name else "KeyboardInterrupt"
                assert (status.last_error or "").startswith(expected), (name, status.last_error)
                assert runs(raw).count(f"{task_id}:2") == 1
            process.send_signal(signal.SIGINT)
            assert process.wait(15) == 0, log_path.read_text()[-2000:]
            assert raw.zcard(QueueKeys(queue_name).workers) == 0  # deregistered
            assert queue.check() == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


# --- 10, 11. garbage in early notes, attempt counters and counters ----------------------


def garbage_subjects(queue: Queue) -> list[str]:
    return [v.subject for v in queue.check() if v.kind == "garbage"]


@pytest.mark.parametrize(
    ("record", "garbage", "reason"),
    [("early", "soon", "early run-at note"), ("attempts", "many", "attempt counter")],
)
def test_garbage_in_a_tasks_record_costs_that_task_only(
    redis_url: str, raw: redis.Redis, queue_name: str, record: str, garbage: str, reason: str
) -> None:
    """A non-number in the early hash for a ready id used to make the claim take that
    task and its neighbours and run none, silently; a non-integer attempt counter failed
    the claim script for ever (so nothing ran), and status() of that task raised. Now
    status() reports the problem, the checker reports the garbage while it is there, the
    task goes to dead with an error naming the record, and its neighbours run."""
    done: list[str] = []
    with Queue(queue_name, redis_url) as queue:
        ids = [queue.schedule_now({"n": n}) for n in range(5)]
        bad = ids[2]
        raw.hset(getattr(QueueKeys(queue_name), record), bad, garbage)
        if record == "attempts":
            status = queue.status(bad)
            assert status is not None and status.state == "ready"
            assert reason in (status.problem or ""), status
        assert garbage_subjects(queue) == [bad]
        run_until(
            App(default=lambda data: done.append(duetime.current_task().id)),
            queue_name,
            redis_url,
            lambda: len(done) == 4 and dead_count(queue) == 1,
            "the neighbours run and the bad task dead",
        )
        assert sorted(done) == sorted(ids[:2] + ids[3:])
        status = queue.status(bad)
        assert status is not None and status.state == "dead"
        assert reason in (status.last_error or ""), status.last_error
        assert queue.check() == []


def test_ids_that_are_not_tasks_are_dropped_and_counted_by_recovery(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """Ids without an envelope in a dead worker's processing list, under an expired lease
    and in ready used to be re-entered (into scheduled, then ready) by the dead-worker and
    expired-lease sweeps, and were reported by the checker as orphan ids until a claim
    happened to drop them. Now each recovery path drops them where it finds them and
    counts them as dropped_unknown; a real task beside them is re-entered and runs, and
    the checker reports nothing."""
    keys = QueueKeys(queue_name)
    done: list[str] = []
    with Queue(queue_name, redis_url) as queue:
        real = queue.schedule_now({"real": True})
        # A worker that died holding the real task and two ids that are not tasks.
        raw.zadd(keys.workers, {"dead-worker": 1})
        raw.lmove(keys.ready, keys.active("dead-worker"), "LEFT", "RIGHT")
        raw.rpush(keys.active("dead-worker"), "ghost-a", "ghost-b")
        raw.zadd(keys.leases, {f"dead-worker|{real}": 1, "dead-worker|ghost-a": 1})
        # A live worker (its heartbeat far ahead) whose lease on a non-task expired.
        raw.zadd(keys.workers, {"slow-worker": time.time() * 1000 + 3_600_000})
        raw.rpush(keys.active("slow-worker"), "ghost-c")
        raw.zadd(keys.leases, {"slow-worker|ghost-c": 1})
        raw.rpush(keys.ready, "ghost-d")

        def recovered() -> bool:
            dropped = raw.hget(keys.stats, "dropped_unknown")
            return done == [real] and dropped is not None and int(dropped) == 4

        run_until(
            App(default=lambda data: done.append(duetime.current_task().id)),
            queue_name,
            redis_url,
            recovered,
            "the real task run and the four ids that are not tasks dropped",
        )
        assert queue.stats().counters["dropped_unknown"] == 4
        assert queue.check() == []
    ghosts = {b"ghost-a", b"ghost-b", b"ghost-c", b"ghost-d"}
    for key in raw.scan_iter(match=f"duetime:{{{queue_name}}}:*"):
        kind = as_bytes(raw.type(key))
        members: set[bytes] = set()
        if kind == b"list":
            members = {as_bytes(m) for m in raw.lrange(key, 0, -1)}
        elif kind == b"zset":
            members = {as_bytes(m) for m in raw.zrange(key, 0, -1)}
        assert not members & ghosts, (key, members & ghosts)


def test_a_stopping_worker_and_a_give_back_drop_ids_that_are_not_tasks(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """release_worker (a worker's graceful stop) and give_back hand ids back to ready;
    an id without an envelope is dropped there instead (with its lease and attempt
    count), and counted as dropped_unknown."""
    keys = QueueKeys(queue_name)
    operations = QueueOperations(keys, duetime.ServerClock())
    with Queue(queue_name, redis_url) as queue:
        real = queue.schedule_now({"real": True})
        raw.lmove(keys.ready, keys.active("w"), "LEFT", "RIGHT")
        raw.rpush(keys.active("w"), "ghost-a")
        raw.zadd(keys.leases, {"w|ghost-a": time.time() * 1000 + 60_000})
        raw.hset(keys.attempts, "ghost-a", 1)
        assert queue.runner.run(operations.worker.release_worker("w", 1_000)) == 1
        assert [as_bytes(i).decode() for i in raw.lrange(keys.ready, 0, -1)] == [real]
        raw.lmove(keys.ready, keys.active("w2"), "LEFT", "RIGHT")
        raw.rpush(keys.active("w2"), "ghost-b")
        assert queue.runner.run(operations.worker.give_back("w2", "ghost-b"))
        assert queue.runner.run(operations.worker.give_back("w2", real))
        assert [as_bytes(i).decode() for i in raw.lrange(keys.ready, 0, -1)] == [real]
        assert queue.stats().counters["dropped_unknown"] == 2
        assert queue.check() == []


def test_garbage_in_a_stats_counter_is_reported_not_fatal(
    redis_url: str, raw: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A non-integer in stats used to make schedule_now raise although the task was
    stored, and ``inspect --check`` crash. Now scheduling returns the id, the task runs,
    stats() shows the counter as -1, the checker reports it, and ``inspect --check``
    exits 1 printing the violation."""
    raw.hset(QueueKeys(queue_name).stats, "scheduled", "lots")
    done: list[str] = []
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now({"n": 1})
        assert queue.stats().counters["scheduled"] == -1
        assert garbage_subjects(queue) == ["stats.scheduled"]
        monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
        result = CliRunner().invoke(main, ["inspect", "--check", "-q", queue_name])
        assert result.exit_code == 1, (result.output, result.exception)
        assert "stats.scheduled" in result.output and "Traceback" not in result.output
        run_until(
            App(default=lambda data: done.append(duetime.current_task().id)),
            queue_name,
            redis_url,
            lambda: bool(done),
            "the task to run",
        )
        assert done == [task_id]
        assert queue.stats().counters["scheduled"] == -1  # left alone, still reported
        assert garbage_subjects(queue) == ["stats.scheduled"]


# --- smaller points ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "at",
    [datetime.max.replace(tzinfo=UTC), datetime.max.replace(tzinfo=timezone(timedelta(hours=5)))],
    ids=["utc", "plus-5h"],
)
def test_an_aware_datetime_max_is_accepted(redis_url: str, queue_name: str, at: datetime) -> None:
    """The last microsecond of 9999 (UTC, or earlier in UTC) is a valid run-at. The
    +05:00 case is a guard (it passed before the fix too)."""
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_task(at, {"n": 1})
        status = queue.status(task_id)
        assert status is not None and status.state == "scheduled"


END_OF_9999 = 253_402_300_800


def test_a_number_from_the_end_of_9999_on_is_refused_with_the_milliseconds_hint(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """At or after 253402300800 (the end of 9999) a number is refused with a hint that
    it may be milliseconds; just before, it is taken (the old bound refused the last
    second of 9999)."""
    with Queue(queue_name, redis_url) as queue:
        for at in (END_OF_9999, float(END_OF_9999), time.time() * 1000, 2**63):
            with pytest.raises(InvalidTimestampError, match="milliseconds"):
                queue.schedule_task(at, {"n": 1})
        assert queue_keys(raw, queue_name) == []
        task_id = queue.schedule_task(END_OF_9999 - 0.5, {"n": 1})
        status = queue.status(task_id)
        assert status is not None and status.run_at == END_OF_9999 - 0.5


def test_a_datetime_after_9999_is_refused_without_the_milliseconds_hint(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """A datetime cannot be in milliseconds: no such hint for one past the end of 9999
    in UTC."""
    late = datetime.max.replace(tzinfo=timezone(timedelta(hours=-5)))
    with Queue(queue_name, redis_url) as queue:
        with pytest.raises(InvalidTimestampError) as refused:
            queue.schedule_task(late, {"n": 1})
        assert "9999" in str(refused.value) and "milliseconds" not in str(refused.value)
    assert queue_keys(raw, queue_name) == []


def test_schedule_task_with_no_run_at_speaks_of_the_run_at(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """It used to say "give exactly one of a run-at time or a delay", for a call that
    takes no delay."""
    with Queue(queue_name, redis_url) as queue:
        with pytest.raises(InvalidTimestampError) as refused:
            queue.schedule_task(None, {"n": 1})  # type: ignore[arg-type]
        assert "delay" not in str(refused.value).lower()
    assert queue_keys(raw, queue_name) == []


def test_a_huge_id_is_refused_with_a_short_message(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """The message used to repeat all 10,000 characters."""
    huge = "x" * 10_000
    with Queue(queue_name, redis_url) as queue:
        calls: list[Callable[[], object]] = [
            lambda: queue.schedule_now({"n": 1}, id=huge),
            lambda: queue.status(huge),
            lambda: queue.cancel(huge),
            lambda: queue.requeue_dead([huge]),
        ]
        for call in calls:
            with pytest.raises(InvalidNameError) as refused:
                call()
            assert len(str(refused.value)) < 300, len(str(refused.value))
    assert queue_keys(raw, queue_name) == []


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_the_schedule_command_refuses_nan_and_infinity_in_json(
    redis_url: str, raw: redis.Redis, queue_name: str, constant: str
) -> None:
    """Python's json reads them, although they are not JSON; they used to be stored."""
    result = CliRunner().invoke(
        main,
        ["schedule", "-q", queue_name, "--in", "0", "--redis", redis_url, f'{{"x": {constant}}}'],
    )
    assert result.exit_code == 2, (result.output, result.exception)
    assert queue_keys(raw, queue_name) == []


def test_a_database_that_is_not_a_number_is_refused(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """redis-py reads redis://host:port/x as database 0 without a word."""
    wrong = redis_url.rsplit("/", 1)[0] + "/x"
    with pytest.raises(ConfigurationError, match="database"), Queue(queue_name, wrong) as queue:
        queue.schedule_now({"n": 1})
    assert queue_keys(raw, queue_name) == []


def test_a_5_mb_error_message_is_stored_cut_short(redis_url: str, queue_name: str) -> None:
    """The error record used to keep the whole message (and a traceback holding it
    again)."""

    def verbose(data: object) -> None:
        raise RuntimeError("x" * 5_000_000)

    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now({"n": 1}, max_attempts=1)
        run_until(App(default=verbose), queue_name, redis_url, lambda: dead_count(queue) == 1,
                  "the task dead")  # fmt: skip
        status = queue.status(task_id)
        assert status is not None and status.last_error is not None
        assert status.last_error.startswith("RuntimeError: xxx")
        assert len(status.last_error) < 10_000 and "cut" in status.last_error
        assert len(status.last_traceback or "") < 20_000
        [entry] = queue.dead_tasks()
        assert entry.error == status.last_error


def test_dead_tasks_refuses_a_limit_that_is_a_string(redis_url: str, queue_name: str) -> None:
    """It used to fail with a TypeError from deep inside."""
    with Queue(queue_name, redis_url) as queue:
        with pytest.raises(InvalidOptionError):
            queue.dead_tasks(limit="5")  # type: ignore[arg-type]
        with pytest.raises(InvalidOptionError):
            queue.dead_tasks(offset="0")  # type: ignore[arg-type]
