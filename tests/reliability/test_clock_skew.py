"""Hosts whose wall clocks are 30 s off. A real dispatcher, worker and scheduling
client each run as their own process under an LD_PRELOAD shim (wallclock_shift.c,
compiled here) that moves only their wall clock (time.time(), datetime.now(), ...) and
leaves the monotonic clock alone. duetime must go by the server's TIME regardless: no
task runs before its run-at by that clock, none is lost, and ``schedule_in`` on a
skewed client counts from the server's now, not the client's."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import IO, Any, NoReturn

import pytest
import redis

from duetime import Queue
from duetime.store.plans.keys import QueueKeys
from tests.apps import SERVER_CLOCK_RUNS
from tests.conftest import IN_CI
from tests.helpers import scheduled_count, wait_until_sync
from tests.reliability.test_processes import FAST_ENV

ROOT = Path(__file__).resolve().parents[2]
SHIM_SOURCE = Path(__file__).with_name("wallclock_shift.c")
SHIFT_VARIABLE = "DUETIME_TEST_WALLCLOCK_SHIFT_SECONDS"
SKEWS = [30.0, -30.0]
SKEW_IDS = ["host-30s-fast", "host-30s-slow"]

#: How far a process's wall clock minus the server's TIME may be from the skew. Both
#: clocks are this host's clock (the server is on loopback), so the only error is the
#: round trip of one TIME call; anything near the 30 s skew means the shim is active.
SKEW_READING_TOLERANCE_US = 1_000_000
#: A client's estimate of the server's now trails the server by at most the round trip
#: of the TIME sample it came from (never ahead: see duetime.clock). That sample was
#: taken inside the client, out of our sight, so its round trip is allowed this much.
CLIENT_CLOCK_TRAIL_MS = 1_000
#: Tasks run within milliseconds of their run-at; this only catches one held back by a
#: clock tens of seconds off, with room for a loaded 2-core machine.
MOST_LATENESS_US = 5_000_000
SCHEDULE_IN_TASKS = 34
SCHEDULE_AT_TASKS = 6


def unavailable(message: str) -> NoReturn:
    if IN_CI:
        pytest.fail(f"{message}: CI must run the clock-skew tests")
    pytest.skip(message)


@pytest.fixture(scope="session")
def wallclock_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """wallclock_shift.c built with the system C compiler into a temporary directory."""
    if not sys.platform.startswith("linux"):
        unavailable("the wall-clock shim needs Linux (LD_PRELOAD, /proc)")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        unavailable("no C compiler (cc) to build the wall-clock shim")
    library = tmp_path_factory.mktemp("wallclock-shim") / "wallclock_shift.so"
    built = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-std=gnu11",
         "-o", str(library), str(SHIM_SOURCE), "-ldl"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if built.returncode != 0:
        pytest.fail(f"building the wall-clock shim failed:\n{built.stdout}{built.stderr}")
    return library


def shimmed_env(shim: Path, skew: float, **extra: str) -> dict[str, str]:
    preload = " ".join(filter(None, [str(shim), os.environ.get("LD_PRELOAD", "")]))
    return {**os.environ, **extra, "LD_PRELOAD": preload, SHIFT_VARIABLE: repr(skew)}


# --- the shim itself -------------------------------------------------------------------

PROBE = """
import json, threading, time
wall, mono = time.time(), time.monotonic()
def took(wait):
    start = time.monotonic()
    outcome = wait()
    return [outcome, time.monotonic() - start]
lock = threading.Lock()
lock.acquire()
print(json.dumps({
    "wall": wall, "mono": mono,
    "sleep": took(lambda: time.sleep(0.01)),
    "event": took(lambda: threading.Event().wait(0.05)),
    "lock": took(lambda: lock.acquire(timeout=0.05)),
}))
"""


@pytest.mark.parametrize("skew", SKEWS, ids=SKEW_IDS)
def test_the_shim_moves_the_wall_clock_only(wallclock_shim: Path, skew: float) -> None:
    wall_before, mono_before = time.time(), time.monotonic()
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], env=shimmed_env(wallclock_shim, skew),
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    wall_after, mono_after = time.time(), time.monotonic()
    seen = json.loads(probe.stdout)
    # Same host clock, shifted by exactly the skew (a little float slack).
    assert wall_before + skew - 0.001 <= seen["wall"] <= wall_after + skew + 0.001, seen
    # CLOCK_MONOTONIC is one clock for the whole system, and the shim leaves it alone.
    assert mono_before <= seen["mono"] <= mono_after, seen
    # Timed waits still wait (libfaketime broke these), and for about as long as asked.
    assert seen["sleep"][0] is None and 0.01 <= seen["sleep"][1] < 2, seen
    assert seen["event"][0] is False and 0.05 <= seen["event"][1] < 2, seen
    assert seen["lock"][0] is False and 0.05 <= seen["lock"][1] < 2, seen


# --- duetime under skewed hosts --------------------------------------------------------


class SkewedProcesses:
    """Processes started under the shim; every one is killed at teardown."""

    def __init__(self, shim: Path, skew: float, redis_url: str, logs: Path) -> None:
        self.shim = shim
        self.env = shimmed_env(
            shim, skew, **FAST_ENV, DUETIME_REDIS_URL=redis_url, DUETIME_TEST_RECORD_URL=redis_url
        )
        self.logs = logs
        self.processes: list[tuple[str, subprocess.Popen[str]]] = []

    def _start(self, name: str, command: list[str], **pipes: Any) -> subprocess.Popen[str]:
        stderr = open(self.logs / f"{name}.log", "w")  # noqa: SIM115 (kept by the child)
        try:
            process = subprocess.Popen(
                command, env=self.env, cwd=ROOT, text=True, stderr=stderr, **pipes
            )
        finally:
            stderr.close()
        self.processes.append((name, process))
        return process

    def daemon(self, name: str, *arguments: str) -> subprocess.Popen[str]:
        command = [sys.executable, "-m", "duetime", "--log-level", "warning", *arguments]
        return self._start(name, command, stdout=subprocess.DEVNULL)

    def client(self, redis_url: str, queue_name: str) -> Client:
        command = [sys.executable, "-m", "tests.reliability.skewed_client", redis_url, queue_name]
        process = self._start("client", command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return Client(process)

    def has_shim_loaded(self, process: subprocess.Popen[str]) -> bool:
        return str(self.shim) in Path(f"/proc/{process.pid}/maps").read_text()

    def stop_all(self) -> None:
        for name, process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(10)
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()
            log = (self.logs / f"{name}.log").read_text()
            if log:
                print(f"--- stderr of {name} (pid {process.pid}) ---\n{log}")  # shown on failure


class Client:
    """The skewed scheduling client (tests/reliability/skewed_client.py): its stdout is
    read by a thread, so each line is waited for with a deadline."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: SimpleQueue[str] = SimpleQueue()
        assert process.stdout is not None
        stdout: IO[str] = process.stdout

        def pump() -> None:
            for line in stdout:
                self.lines.put(line)

        threading.Thread(target=pump, daemon=True).start()

    def read(self, what: str, timeout: float = 30.0) -> Any:
        try:
            return json.loads(self.lines.get(timeout=timeout))
        except Empty:
            raise AssertionError(f"the client printed no {what} within {timeout}s") from None

    def send(self, message: object) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()


@pytest.fixture(params=SKEWS, ids=SKEW_IDS)
def skew(request: pytest.FixtureRequest) -> float:
    return float(request.param)


@pytest.fixture
def skewed(
    wallclock_shim: Path, skew: float, redis_url: str, tmp_path: Path
) -> Iterator[SkewedProcesses]:
    group = SkewedProcesses(wallclock_shim, skew, redis_url, tmp_path)
    yield group
    group.stop_all()


@dataclass(frozen=True)
class Run:
    """One handler start, as recorded by tests.apps.server_clock."""

    id: str
    attempt: int
    server_us: int  # the server's TIME, read by the handler right after it started
    run_at_ms: int  # the run-at duetime handed the attempt
    wall_us: int  # the worker host's own (skewed) wall clock, read just before TIME

    @classmethod
    def parse(cls, entry: bytes | str) -> Run:
        text = entry.decode() if isinstance(entry, bytes) else entry
        task_id, attempt, server_us, run_at_ms, wall_us = text.split(":")
        return cls(task_id, int(attempt), int(server_us), int(run_at_ms), int(wall_us))


def runs(raw: redis.Redis) -> list[Run]:
    return [Run.parse(entry) for entry in raw.lrange(SERVER_CLOCK_RUNS, 0, -1)]


def server_us(raw: redis.Redis) -> int:
    seconds, micros = raw.time()
    return int(seconds) * 1_000_000 + int(micros)


def test_skewed_hosts_run_every_task_on_time_by_the_server_clock(
    skewed: SkewedProcesses, skew: float, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    skew_us = round(skew * 1_000_000)
    keys = QueueKeys(queue_name)
    dispatcher = skewed.daemon("dispatcher", "dispatcher", "--queue", queue_name)
    worker = skewed.daemon("worker", "worker", "tests.apps:app", "--queue", queue_name)

    # Both daemons up and working: a warm-up task, scheduled here (unskewed) but only
    # promoted by the dispatcher, has run on the worker.
    with Queue(queue_name, redis_url) as queue:
        warm_up = queue.schedule_in(0.05, {"warm": True}, task="server_clock")
    wait_until_sync(
        lambda: any(run.id == warm_up for run in runs(raw)), timeout=30,
        what="the warm-up task (skewed dispatcher and worker running)",
    )  # fmt: skip
    for name, process in (("dispatcher", dispatcher), ("worker", worker)):
        assert process.poll() is None, f"the {name} exited ({process.returncode})"
        assert skewed.has_shim_loaded(process), f"the {name} runs without the shim"

    client = skewed.client(redis_url, queue_name)
    wall_minus_server = client.read("clock reading")["wall_minus_server_us"]
    # The shim is active in the client: its time.time() is the skew away from the
    # server's TIME (without the shim it would be ~0 and this fails).
    assert abs(wall_minus_server - skew_us) < SKEW_READING_TOLERANCE_US, (
        f"client wall clock minus server TIME is {wall_minus_server} µs, "
        f"expected about {skew_us} µs"
    )

    # 40 tasks due over ~2 s: schedule_in delays counted by the client, and now and then
    # a schedule_task at a server epoch computed here from the server's TIME.
    now_ms = server_us(raw) // 1000
    plan: list[dict[str, int]] = []
    for number in range(SCHEDULE_IN_TASKS):
        plan.append({"delay_ms": 400 + 60 * number})  # 0.4 s to 2.38 s
        if number % 6 == 0:
            plan.append({"at_ms": now_ms + 800 + 50 * number})  # 0.8 s to 2.3 s
    assert len(plan) == SCHEDULE_IN_TASKS + SCHEDULE_AT_TASKS
    # duetime takes a delay in whole ms, rounded up: these delays survive the ms -> s -> ms
    # round trip exactly, so the bounds below need no slack for it.
    assert all(
        math.ceil(i["delay_ms"] / 1000 * 1000) == i["delay_ms"] for i in plan if "delay_ms" in i
    )
    client.send(plan)
    scheduled: list[dict[str, Any]] = client.read("report of the tasks scheduled")
    assert client.process.wait(30) == 0
    ids = [item["id"] for item in scheduled]
    assert len(set(ids)) == len(plan)

    # Each task's run-at, exactly as stored: its score in the scheduled set, read by the
    # client right after the scheduling call. Every task is due 0.4 s or more after it
    # was scheduled, so it must still be waiting there (not yet promoted; a task already
    # due when scheduled goes straight to ready and has no score).
    for item in scheduled:
        assert item["stored_ms"] is not None, f"not waiting in the scheduled set: {item}"
        stored_us = round(item["stored_ms"] * 1000)
        if "at_ms" in item:
            # An absolute run-at is kept as given.
            assert stored_us == item["at_ms"] * 1000, item
        else:
            # schedule_in's run-at is the client's estimate of the server's now, plus the
            # delay. That estimate is never ahead of the server, so the run-at is at most
            # the server's TIME read just after the call plus the delay (exact): a +30 s
            # client counting from its own clock lands ~30 s past it. The estimate trails
            # by at most the round trip of its TIME sample, so the run-at is at least the
            # TIME read just before the call plus the delay, less that trail: a -30 s
            # client counting from its own clock lands ~30 s before, already overdue.
            delay_ms = item["delay_ms"]
            latest_us = item["after_us"] + delay_ms * 1000
            earliest_us = item["before_us"] + (delay_ms - CLIENT_CLOCK_TRAIL_MS) * 1000
            assert earliest_us <= stored_us <= latest_us, (
                f"schedule_in({delay_ms} ms) stored a run-at "
                f"{(stored_us - item['before_us']) / 1000:.1f} ms after the server's TIME "
                f"read before the call: {item}"
            )

    wait_until_sync(
        lambda: {run.id for run in runs(raw)} >= set(ids), timeout=30,
        what=f"all {len(ids)} tasks to run",
    )  # fmt: skip
    recorded = runs(raw)
    # None lost and, in this calm run, none repeated: one first attempt per task.
    assert sorted(run.id for run in recorded) == sorted([warm_up, *ids])
    assert all(run.attempt == 1 for run in recorded), recorded
    by_id = {run.id: run for run in recorded}
    for item in scheduled:  # the worker was handed the run-at that was stored
        assert by_id[item["id"]].run_at_ms * 1000 == round(item["stored_ms"] * 1000), item
    for run in recorded:
        # The shim is active in the worker: its wall clock is the skew off the server's.
        assert abs(run.wall_us - run.server_us - skew_us) < SKEW_READING_TOLERANCE_US, run
        # Never early by the server's clock. (The TIME recorded was read just after the
        # handler started: a start before the run-at by less than that one loopback
        # round trip could pass unseen; an early start because of the skew could not.)
        assert run.server_us >= run.run_at_ms * 1000, f"{run} started before its run-at"
        # Not held back either (the warm-up task waited for the daemons to start).
        if run.id != warm_up:
            assert run.server_us - run.run_at_ms * 1000 < MOST_LATENESS_US, f"{run} is late"

    assert scheduled_count(raw, keys) == 0 and raw.llen(keys.ready) == 0
    with Queue(queue_name, redis_url) as queue:
        assert queue.check() == []
    for name, process in (("dispatcher", dispatcher), ("worker", worker)):
        assert process.poll() is None, f"the {name} exited ({process.returncode})"
