"""Fault injection on real processes: workers and dispatchers killed with SIGKILL, Redis
restarted under load, connections stalled, cut and frozen by a proxy, handlers that
never return, and a large backlog.

Every scenario runs the daemons as separate ``python -m duetime`` processes on loopback,
is bounded in time, and ends with the same verdict: ``queue.check() == []``, nothing
left behind in Redis, and a ledger comparison. The ledger is written by the handlers in
tests/apps.py (one "start" and one "done" record per attempt, with the wall clock and the
task's run-at): every acknowledged task completed at least once, none started before its
run-at, and a task that ran more than once did so only where an injected fault made it
possible.

Each scenario has a short version that runs in the normal suite, and a long one
selected with ``DUETIME_SOAK=1`` (``make reliability``). Timing figures are measured and
reported, never pass/fail thresholds, except generous bounds on recovery: a daemon that
does not resume within its bound is hung.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from duetime import Job, Queue
from duetime.errors import RedisUnavailableError
from duetime.store.plans.keys import QueueKeys
from tests.helpers import decoded, wait_until_sync
from tests.reliability.ledger import Fault, Ledger, Verdict, compare
from tests.reliability.proxy import FaultyProxy
from tests.servers import Server, binary

T = TypeVar("T")

#: Long versions (make reliability). The short ones keep the normal suite quick.
SOAK = os.environ.get("DUETIME_SOAK", "") == "1"
ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps:app"
#: Seed for the random choices (victims, pauses, task spread); printed on failure.
SEED = int(os.environ.get("DUETIME_FAULT_SEED", str(random.randrange(1 << 30))))
#: Most scenarios test how the daemons cope with faults, which does not depend on the
#: server kind: they run on the system Redis. The two that race many processes' scripts
#: against each other also run on Valkey in the soak run; the short run keeps to Redis
#: to stay within its time budget.
REDIS_ONLY = pytest.mark.parametrize("server", ["redis"], indirect=True)
KINDS_IN_SOAK = pytest.mark.parametrize(
    "server", ["redis", "valkey"] if SOAK else ["redis"], indirect=True
)


def pick(short: T, long: T) -> T:
    return long if SOAK else short


# --- daemons as processes --------------------------------------------------------------


@dataclass(eq=False)
class Daemon:
    """One daemon process and its log file."""

    role: str
    process: subprocess.Popen[bytes]
    log: Path
    ended_by_test: bool = False  # killed or stopped on purpose; any other exit is a crash

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def _started_or_ended(daemon: Daemon) -> bool:
    return not daemon.alive() or "starting" in daemon.tail(200)


class Fleet:
    """Daemons started as real processes, each logging to its own file. ``close`` kills
    every one still running, so a failing test leaves nothing behind."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.daemons: list[Daemon] = []

    def start(
        self,
        role: str,
        queue: str,
        url: str,
        env: Mapping[str, str],
        *options: str,
    ) -> Daemon:
        # Handlers write the ledger to $DUETIME_TEST_RECORD_URL; without it they fail.
        assert "DUETIME_TEST_RECORD_URL" in env
        command = [sys.executable, "-m", "duetime", "--log-level", "info", role]
        if role in ("worker", "run"):
            command.append(APP)
        command += ["--queue", queue, "--redis", url, *options]
        log = self.directory / f"{len(self.daemons):03d}-{role}.log"
        with open(log, "wb") as out:
            # A log file, not a pipe: a daemon writing warnings into a pipe nobody reads
            # would block once the pipe is full and look hung.
            process = subprocess.Popen(
                command, cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=out
            )
        daemon = Daemon(role, process, log)
        self.daemons.append(daemon)
        return daemon

    def kill(self, daemon: Daemon) -> float:
        """SIGKILL; returns the wall-clock time of the kill."""
        at = time.time()
        daemon.ended_by_test = True
        daemon.process.kill()
        daemon.process.wait(10)
        return at

    def stop(self, *daemons: Daemon, timeout: float = 40.0) -> None:
        """Graceful stop (SIGTERM) of several daemons at once; each must exit with code 0
        in time, or it is reported as hung, with its log."""
        for daemon in daemons:
            # A process still importing Python has no handler yet (a SIGTERM then is a
            # death by signal, as for any program): stop it once it says it is starting.
            wait_until_sync(
                partial(_started_or_ended, daemon),
                timeout=30,
                what=f"{daemon.role} {daemon.pid} to start",
            )
            daemon.ended_by_test = True
            daemon.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for daemon in daemons:
            try:
                code = daemon.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"{daemon.role} {daemon.pid} did not stop within {timeout}s of SIGTERM:\n"
                    f"{daemon.tail()}"
                ) from None
            assert code == 0, f"{daemon.role} {daemon.pid} exited with {code}:\n{daemon.tail()}"

    def close(self) -> None:
        for daemon in self.daemons:
            if daemon.alive():
                daemon.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):  # a process stuck in D state
                daemon.process.wait(10)

    def crashes(self) -> list[str]:
        """Daemons that exited on their own, and tracebacks in any daemon's log: through
        every fault, a daemon must log, back off and carry on."""
        found = []
        for daemon in self.daemons:
            code = daemon.process.poll()
            if code is not None and not daemon.ended_by_test:
                found.append(f"{daemon.role} {daemon.pid} exited with {code}:\n{daemon.tail()}")
            elif "Traceback" in daemon.log.read_text(errors="replace"):
                found.append(f"{daemon.role} {daemon.pid} ({daemon.log}):\n{daemon.tail(40)}")
        return found


class Servers:
    """Dedicated servers started by one test (not the session's), stopped at the end."""

    def __init__(self) -> None:
        self.started: list[Server] = []
        self.clients: list[redis.Redis] = []

    def client(self, instance: Server) -> redis.Redis:
        client = instance.client()
        self.clients.append(client)
        return client

    def start(self, *extra: str) -> Server:
        executable = binary("redis")
        assert executable is not None  # the redis_url fixture fails or skips first
        instance = Server("redis", executable, extra=list(extra))
        self.started.append(instance)
        instance.start()
        return instance

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for instance in self.started:
            instance.stop()


@pytest.fixture
def servers() -> Iterator[Servers]:
    group = Servers()
    try:
        yield group
    finally:
        group.close()


@pytest.fixture
def proxies() -> Iterator[list[FaultyProxy]]:
    started: list[FaultyProxy] = []
    try:
        yield started
    finally:
        for proxy in started:
            proxy.close()


# --- scheduling while faults happen ----------------------------------------------------


class Feeder(threading.Thread):
    """Schedules ledger tasks from a thread at a steady rate, each due a little later,
    and remembers which schedule calls were acknowledged (returned) and which raised.
    Every task gets an id chosen here, so a call that raised is still known by id."""

    def __init__(
        self,
        url: str,
        queue: str,
        *,
        rate: float,
        lead: tuple[float, float],
        work: tuple[float, float] = (0.0, 0.0),
        batch: int = 1,
        prefix: str = "f",
        seed: int = SEED,
    ) -> None:
        super().__init__(name=f"feeder-{prefix}", daemon=True)
        self.url, self.queue, self.rate, self.lead, self.work = url, queue, rate, lead, work
        self.batch, self.prefix = batch, prefix
        self.random = random.Random(seed)
        self.acked: dict[str, float] = {}  # id -> run-at (epoch seconds)
        self.acked_when: dict[str, float] = {}  # id -> wall time the call returned
        self.maybe: set[str] = set()  # the call raised: the task may or may not exist
        self.failures: list[str] = []
        self.errors = 0
        self.lock = threading.Lock()
        self._halt = threading.Event()

    def run(self) -> None:
        count = 0
        pace = time.monotonic()
        try:
            with Queue(self.queue, self.url) as queue:
                while not self._halt.is_set():
                    now = time.time()
                    jobs = [
                        Job(
                            {"work": round(self.random.uniform(*self.work), 4)},
                            at=now + self.random.uniform(*self.lead),
                            task="ledger",
                            id=f"{self.prefix}{count + i}",
                        )
                        for i in range(self.batch)
                    ]
                    count += self.batch
                    try:
                        if len(jobs) == 1:
                            job = jobs[0]
                            assert job.at is not None and job.id is not None
                            queue.schedule_task(job.at, job.data, task="ledger", id=job.id)
                        else:
                            queue.schedule_many(jobs)
                    except RedisUnavailableError:
                        with self.lock:
                            self.errors += 1
                            self.maybe.update(str(job.id) for job in jobs)
                    else:
                        done = time.time()
                        with self.lock:
                            for job in jobs:
                                self.acked[str(job.id)] = float(job.at)  # type: ignore[arg-type]
                                self.acked_when[str(job.id)] = done
                    pace += self.batch / self.rate
                    self._halt.wait(max(0.0, pace - time.monotonic()))
        except Exception as error:  # reported by the test, which owns the assertion
            self.failures.append(repr(error))

    def halt(self) -> None:
        self._halt.set()
        self.join(60)
        assert not self.is_alive(), "the feeder thread did not stop"


@pytest.fixture
def feeders() -> Iterator[list[Feeder]]:
    started: list[Feeder] = []
    try:
        yield started
    finally:
        for feeder in started:
            if feeder.is_alive():
                feeder.halt()


# --- looking at processes and Redis ----------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def connections_to(pid: int, port: int) -> int:
    """Established TCP connections from process ``pid`` to a local ``port`` (Linux /proc):
    how a test sees that a daemon has reconnected, without asking the daemon."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)
            for row in rows:
                parts = row.split()
                remote_port = int(parts[2].rsplit(":", 1)[1], 16)
                if parts[3] == "01" and remote_port == port and parts[9] in inodes:
                    count += 1
    return count


def leftovers(client: redis.Redis, queue: str) -> list[str]:
    """Keys of the queue other than its counters (running totals and per-minute figures),
    the (at most one) wake alarm, the history of finished attempts (capped; the checker
    checks its size) and the record of workers taken for dead (capped): after every task
    finished and every worker stopped, there must be none."""
    keys = QueueKeys(queue)
    allowed = {keys.stats, keys.minutes, keys.wake, *keys.history_keys, keys.gone_workers}
    found = {key.decode() for key in client.scan_iter(match=f"duetime:{{{queue}}}:*", count=1000)}
    return sorted(found - allowed)


def queue_empty(queue: Queue, client: redis.Redis) -> bool:
    """Nothing waiting or running: every task left is dead (the caller checks which)."""
    stats = queue.stats()
    return (
        stats.scheduled == stats.ready == stats.running == 0
        and client.hlen(QueueKeys(queue.name).tasks) == stats.dead
    )


def start_fleet(
    fleet: Fleet,
    client: redis.Redis,
    queue: str,
    url: str,
    env: Mapping[str, str],
    workers: int,
    concurrency: str,
) -> tuple[Daemon, list[Daemon]]:
    """One dispatcher and ``workers`` worker processes, once every worker registered."""
    dispatcher = fleet.start("dispatcher", queue, url, env)
    started = [fleet.start("worker", queue, url, env, "-c", concurrency) for _ in range(workers)]
    wait_for_workers(client, queue, workers)
    return dispatcher, started


def wait_for_workers(client: redis.Redis, queue: str, count: int, timeout: float = 30) -> None:
    wait_until_sync(
        lambda: client.zcard(QueueKeys(queue).workers) >= count,
        timeout=timeout,
        what=f"{count} worker(s) registered",
    )


def shut_down(
    fleet: Fleet,
    client: redis.Redis,
    queue: str,
    workers: Sequence[Daemon],
    dispatchers: Sequence[Daemon],
    reap_bound: float,
) -> None:
    """Graceful end: workers hand back and deregister; dispatchers, still running, reap
    every worker that was killed, and look once more at the list of every reaped or
    stopped worker (a block later); then the dispatchers stop. Each step is bounded.
    A worker started late in a storm is stopped only once it has registered: a SIGTERM
    that comes before its signal handlers (while it still imports) kills it outright."""
    alive = [w for w in workers if w.alive()]
    keys = QueueKeys(queue)

    def registered() -> bool:
        names = decoded(client.zrange(keys.workers, 0, -1))
        return all(any(f".{w.pid}." in name for name in names) for w in alive if w.alive())

    wait_until_sync(registered, timeout=30, what="every live worker registered")
    fleet.stop(*alive)
    wait_until_sync(
        lambda: client.zcard(keys.workers) == 0 and client.zcard(keys.reaped) == 0,
        timeout=reap_bound,
        what="every killed worker reaped, and every reaped list looked at again",
    )
    fleet.stop(*[d for d in dispatchers if d.alive()])


def settle(
    ledger: Ledger,
    queue: Queue,
    client: redis.Redis,
    expected: Sequence[str],
    timeout: float,
    fleet: Fleet,
) -> None:
    """Wait, bounded, until every expected task finished and the queue is empty."""
    try:
        wait_until_sync(lambda: ledger.all_done(expected), timeout=timeout, what="every task done")
        wait_until_sync(lambda: queue_empty(queue, client), timeout=30, what="an empty queue")
    except AssertionError as error:
        missing = [task_id for task_id in expected if task_id not in ledger.done][:10]
        statuses = {}
        for task_id in missing[:3]:
            status = queue.status(task_id)
            statuses[task_id] = status and (status.state, status.attempts, status.last_error)
        logs = "\n\n".join(f"{d.role} {d.pid}:\n{d.tail(15)}" for d in fleet.daemons[-6:])
        raise AssertionError(
            f"{error}; stats {queue.stats()}; not done: {missing}; statuses {statuses}\n{logs}"
        ) from None


def dump(fleet: Fleet, ledger: Ledger, faults: Sequence[Fault] = ()) -> None:
    """Keep the ledger and the faults next to the daemons' logs, for a post-mortem."""
    with open(fleet.directory / "ledger.txt", "w") as out:
        for fault in faults:
            out.write(f"fault {fault.what} {fault.start:.3f} {fault.end:.3f} {fault.pids}\n")
        for e in ledger.entries:
            out.write(f"{e.kind} {e.task_id} {e.attempt} {e.pid} {e.at_ms:.3f} {e.run_at_ms}\n")


def promotion_surplus(counters: Mapping[str, int]) -> int:
    """Promotions beyond the entries made into ``scheduled``: future tasks, retries and
    tasks re-entered by reaping. Each entry is promoted once, so this is never positive,
    and it is zero when every task was scheduled into the future (a task due at once
    goes straight to ``ready``). A task promoted twice would make it positive."""
    entries = sum(
        counters.get(name, 0) for name in ("scheduled", "retried", "reaped_tasks", "expired_leases")
    )
    return counters.get("promoted", 0) - entries


def verdict_problems(
    verdict: Verdict, queue: Queue, client: redis.Redis, fleet: Fleet
) -> list[str]:
    """Everything that breaks a guarantee, gathered so one failure shows all of it."""
    problems = [f"ledger: {problem}" for problem in verdict.problems]
    problems += [f"check: {violation}" for violation in queue.check()]
    problems += [f"left behind: {key}" for key in leftovers(client, queue.name)]
    problems += [f"crash: {crash}" for crash in fleet.crashes()]
    return problems


def report(name: str, capsys: pytest.CaptureFixture[str], **figures: Any) -> None:
    """Print a scenario's figures in soak runs (for docs/reliability.md), and append them
    to $DUETIME_RELIABILITY_LOG as JSON lines when that is set."""
    line = json.dumps({"scenario": name, "soak": SOAK, "seed": SEED, **figures}, default=str)
    path = os.environ.get("DUETIME_RELIABILITY_LOG")
    if path:
        with open(path, "a") as out:
            out.write(line + "\n")
    if SOAK:
        with capsys.disabled():
            print(f"\n[reliability] {line}")


def pause_until(moment: float) -> None:
    """Pace the fault schedule (not a wait for a condition)."""
    time.sleep(max(0.0, moment - time.time()))


# --- 1. worker kill -9 storm -----------------------------------------------------------

STORM_ENV = {
    "DUETIME_HEARTBEAT_INTERVAL": "0.25",
    # A killed worker is noticed after 2 s, eight missed heartbeats: fast recovery, yet no
    # live worker on a busy shared machine goes that long without one.
    "DUETIME_WORKER_TTL": "2.0",
    "DUETIME_LEASE_DURATION": "3.0",
    "DUETIME_BLOCK_TIMEOUT": "1.0",
    "DUETIME_RETRY_BASE": "0.05",
    "DUETIME_SHUTDOWN_GRACE": "5",
}


@KINDS_IN_SOAK
def test_worker_kill_9_storm(
    fleet: Fleet,
    server: Server,
    redis_url: str,
    raw: redis.Redis,
    queue_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Three workers, one killed with SIGKILL every ~2 s (preferably one that is running
    tasks) and restarted at once, while tasks come due throughout. Proves that no task
    is lost, none runs early, only tasks interrupted by a kill run again, and the
    dispatcher reaps every killed worker, leaving a consistent, empty queue."""
    rng = random.Random(SEED)
    env = {**STORM_ENV, "DUETIME_TEST_RECORD_URL": redis_url}
    count, duration = pick(350, 10_000), pick(5.0, 30.0)
    concurrency = pick("10", "20")
    dispatcher, workers = start_fleet(fleet, raw, queue_name, redis_url, env, 3, concurrency)
    ledger = Ledger(raw)
    begin = time.time() + 1.0
    jobs = [
        Job(
            {"work": round(rng.uniform(0.02, 0.2), 3)},
            at=begin + duration * i / count,
            task="ledger",
            id=f"s{i}",
        )
        for i in range(count)
    ]
    scheduled = {str(job.id): float(job.at) for job in jobs}  # type: ignore[arg-type]
    kills: list[tuple[int, float]] = []
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_many(jobs)
        spacing = pick((1.2, 2.2), (1.5, 2.5))  # ~2 s; a little tighter in the short run
        moment = begin + rng.uniform(*spacing)
        while moment < begin + duration:
            pause_until(moment)
            ledger.refresh()
            # Prefer a worker in the middle of a task, so that kills interrupt work.
            busy = [w for w in workers if ledger.in_flight(w.pid)]
            victim = rng.choice(busy or workers)
            kills.append((victim.pid, fleet.kill(victim)))
            workers.remove(victim)
            workers.append(fleet.start("worker", queue_name, redis_url, env, "-c", concurrency))
            moment += rng.uniform(*spacing)
        settle(ledger, queue, raw, list(scheduled), timeout=duration + 60, fleet=fleet)
        shut_down(fleet, raw, queue_name, workers, [dispatcher], reap_bound=30)

        faults = [Fault("kill -9", at, at, frozenset({pid})) for pid, at in kills]
        dump(fleet, ledger, faults)
        verdict = compare(ledger, scheduled, faults=faults, after=5.0)
        counters = queue.stats().counters
        problems = verdict_problems(verdict, queue, raw, fleet)

    # Recovery: from each kill to the next start of every task that was mid-run in it.
    by_task = ledger.runs_by_task()
    recoveries = []
    for pid, at in kills:
        for task_id in ledger.in_flight(pid):
            later = [r.started_ms / 1000 for r in by_task[task_id] if r.started_ms / 1000 > at]
            recoveries.append(min(later) - at)
    report(
        "worker kill -9 storm",
        capsys,
        kind=server.kind,
        tasks=count,
        seconds=duration,
        kills=len(kills),
        interrupted=len(recoveries),
        recovery_max_s=round(max(recoveries, default=0), 2),
        recovery_p50_s=round(sorted(recoveries)[len(recoveries) // 2] if recoveries else 0, 2),
        counters=counters,
        **verdict.summary(),
    )
    assert problems == [], f"seed {SEED}:\n" + "\n".join(problems)
    assert counters.get("completed") == count, counters
    assert promotion_surplus(counters) == 0, counters
    # Each killed worker that had registered is reaped once, never a live one.
    assert counters.get("reaped_workers", 0) <= len(kills), counters
    assert recoveries, "no kill interrupted a running task: the scenario proved nothing"


# --- 2. dispatcher kill -9 and multiplicity ---------------------------------------------

#: Workers are never faulted here, so their leases are long: with nothing to make a task
#: run twice, any duplicate is a bug in promotion, not a slow heartbeat.
CALM_ENV = {
    "DUETIME_HEARTBEAT_INTERVAL": "0.5",
    "DUETIME_WORKER_TTL": "10",
    "DUETIME_LEASE_DURATION": "15",
    "DUETIME_BLOCK_TIMEOUT": "1.0",
    "DUETIME_SHUTDOWN_GRACE": "5",
}


@KINDS_IN_SOAK
def test_dispatcher_kill_9_with_three_dispatchers(
    fleet: Fleet,
    feeders: list[Feeder],
    server: Server,
    redis_url: str,
    raw: redis.Redis,
    queue_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Three dispatchers race for the same queue while one of them is killed with SIGKILL
    every ~3 s and restarted, and tasks are scheduled continuously, each due within
    1.5 s (so the wake alarm matters). Proves that no task is promoted twice (each runs
    exactly once, as attempt 1, with no worker fault at all), none is lost or stuck,
    and none runs early."""
    rng = random.Random(SEED)
    env = {**CALM_ENV, "DUETIME_TEST_RECORD_URL": redis_url}
    duration = pick(5.0, 60.0)
    dispatchers = [fleet.start("dispatcher", queue_name, redis_url, env) for _ in range(3)]
    workers = [fleet.start("worker", queue_name, redis_url, env, "-c", "20") for _ in range(2)]
    wait_for_workers(raw, queue_name, 2)
    ledger = Ledger(raw)
    feeder = Feeder(
        redis_url,
        queue_name,
        rate=pick(60.0, 300.0),
        lead=(0.05, 1.5),
        work=(0.0, 0.02),
        batch=3,
        prefix="d",
    )
    feeders.append(feeder)
    feeder.start()
    kills = 0
    began = time.time()
    moment = began + rng.uniform(1.5, 2.5)
    while moment < began + duration:
        pause_until(moment)
        victim = rng.choice(dispatchers)
        fleet.kill(victim)
        kills += 1
        dispatchers.remove(victim)
        dispatchers.append(fleet.start("dispatcher", queue_name, redis_url, env))
        moment += rng.uniform(2.0, 4.0)
    pause_until(began + duration)
    feeder.halt()
    with Queue(queue_name, redis_url) as queue:
        settle(ledger, queue, raw, list(feeder.acked), timeout=60, fleet=fleet)
        shut_down(fleet, raw, queue_name, workers, dispatchers, reap_bound=30)
        # No faults are passed: any second start of a task is unexplained.
        dump(fleet, ledger)
        verdict = compare(ledger, feeder.acked, maybe=feeder.maybe)
        counters = queue.stats().counters
        problems = verdict_problems(verdict, queue, raw, fleet)
    report(
        "dispatcher kill -9, three dispatchers",
        capsys,
        kind=server.kind,
        seconds=duration,
        kills=kills,
        counters=counters,
        **verdict.summary(),
    )
    assert feeder.failures == [] and feeder.errors == 0, feeder.failures
    assert problems == [], f"seed {SEED}:\n" + "\n".join(problems)
    assert counters.get("completed") == len(feeder.acked), counters
    # Promotion moves each task once: a task promoted twice would show here even if the
    # second copy had not run yet. (A task already due when scheduled skips promotion.)
    assert promotion_surplus(counters) <= 0, counters
    assert not counters.get("expired_leases") and not counters.get("reaped_workers"), counters
    # "None stuck": the wake alarm one killed dispatcher took is covered by the others'
    # idle passes (one per block_timeout); far more than that would be a stuck task.
    assert verdict.percentile(1.0) < 10_000, verdict.summary()


# --- 3. Redis restarts -----------------------------------------------------------------

RESTART_ENV = {
    "DUETIME_HEARTBEAT_INTERVAL": "0.25",
    "DUETIME_WORKER_TTL": "2.0",
    "DUETIME_LEASE_DURATION": "3.0",
    "DUETIME_BLOCK_TIMEOUT": "1.0",
    "DUETIME_SOCKET_TIMEOUT": "2.0",
    "DUETIME_RETRY_BASE": "0.05",
    "DUETIME_SHUTDOWN_GRACE": "5",
    # Valid and realistic; it also makes the clock due for a sample within every longer
    # outage, a path that must back off like any other (see the CPU check below).
    "DUETIME_CLOCK_RESYNC_INTERVAL": "1.0",
}
#: While Redis is down, a daemon waits between attempts (back-off doubling up to 5 s; a
#: worker's heartbeat every interval), which costs about 1 % of a core. A tenth of a core
#: while it is down is a busy loop (measured on a loaded 2-core host: 25-70 %).
MAX_CPU_SHARE_WHILE_DOWN = 0.10


def restart(
    server: Server, how: signal.Signals, outage: float, daemons: Sequence[Daemon]
) -> tuple[float, float, dict[int, float]]:
    """Stop the server with ``how``, leave it down for ``outage`` seconds, and start it
    again on the same port and directory (so the append-only file is reloaded).
    Returns the wall-clock times it went down and came back, and, for an outage of
    over 2 s, the share of a core each daemon used while it was down (measured from
    1 s into the outage, once running handlers have wound down)."""
    down = time.time()
    server.kill(how)
    # The outage itself, not a wait for a condition.
    time.sleep(min(1.0, outage))
    started, before = time.time(), {d.pid: cpu_seconds(d.pid) for d in daemons}
    time.sleep(max(0.0, outage - 1.0))
    shares = {}
    if outage > 2.0:
        spent = time.time() - started
        shares = {d.pid: (cpu_seconds(d.pid) - before[d.pid]) / spent for d in daemons}
    server.start(timeout=30)
    return down, time.time(), shares


@REDIS_ONLY
def test_redis_restart_loses_no_acknowledged_task(
    fleet: Fleet,
    feeders: list[Feeder],
    servers: Servers,
    redis_url: str,
    raw: redis.Redis,
    queue_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Redis with ``appendonly yes`` and ``appendfsync always`` is restarted mid-run, by
    SIGTERM and by SIGKILL in turn, while tasks are scheduled one call at a time and run;
    some outages are brief, some outlast a lease and a worker TTL. Proves that every
    schedule call that returned completes, that dispatchers and workers wait while the
    server is down (back off, not spin) and reconnect on their own (each has a
    connection to the new server within a bound), that work resumes, and that tasks run
    again only around an outage. The ledger lives on another server, which stays up."""
    rng = random.Random(SEED)
    durable = servers.start("--appendonly", "yes", "--appendfsync", "always")
    env = {**RESTART_ENV, "DUETIME_TEST_RECORD_URL": redis_url}
    lease, ttl = float(env["DUETIME_LEASE_DURATION"]), float(env["DUETIME_WORKER_TTL"])
    duration = pick(6.5, 60.0)
    dispatchers = [fleet.start("dispatcher", queue_name, durable.url, env) for _ in range(2)]
    workers = [fleet.start("worker", queue_name, durable.url, env) for _ in range(2)]
    durable_client = servers.client(durable)
    wait_for_workers(durable_client, queue_name, 2)
    ledger = Ledger(raw)
    feeder = Feeder(
        durable.url,
        queue_name,
        rate=pick(80.0, 200.0),
        lead=(0.2, 2.0),
        work=(0.0, 0.05),
        prefix="r",
    )
    feeders.append(feeder)
    feeder.start()
    faults: list[Fault] = []
    reconnects: list[float] = []
    resumes: list[float] = []
    spinning: list[str] = []
    cpu_shares: dict[str, float] = {"dispatcher": 0.0, "worker": 0.0}  # highest, by role
    began = time.time()
    moment = began + 2.0
    ways = [signal.SIGTERM, signal.SIGKILL]
    # At least one restart of each kind, then more while the run lasts.
    while len(faults) < 2 or moment < began + duration - 1.0:
        pause_until(moment)
        how = ways[len(faults) % 2]
        # Every third outage (the first SIGKILL among them) outlasts a lease and a worker
        # TTL: on restart, leases have lapsed and workers look dead, so the dispatchers
        # reap running work that the workers gave up reporting.
        outage = lease + 1.0 if len(faults) % 3 == 1 else pick(0.3, rng.uniform(0.3, 1.0))
        live = dispatchers + workers
        down, up, shares = restart(durable, how, outage, live)
        faults.append(Fault(f"redis {how.name}", down, up))
        for daemon in live:
            share = shares.get(daemon.pid, 0.0)
            cpu_shares[daemon.role] = max(cpu_shares[daemon.role], round(share, 3))
        spinning += [
            f"{d.role} {d.pid} used {shares[d.pid]:.0%} of a core while Redis was down ({d.log})"
            for d in live
            if shares.get(d.pid, 0.0) > MAX_CPU_SHARE_WHILE_DOWN
        ]

        def reconnected(live: list[Daemon] = live) -> bool:
            return all(connections_to(d.pid, durable.port) > 0 for d in live)

        # Daemons back off up to 5 s between attempts; 30 s means one is stuck.
        wait_until_sync(reconnected, timeout=30, what="every daemon reconnected")
        reconnects.append(time.time() - up)

        def resumed(up: float = up) -> bool:
            ledger.refresh()
            return any(entry.at_ms / 1000 > up for entry in ledger.entries[-50:])

        wait_until_sync(resumed, timeout=30, what="tasks running again after the restart")
        resumes.append(time.time() - up)
        moment = max(time.time() + 1.0, moment + pick(3.0, rng.uniform(3.0, 5.0)))
    pause_until(began + duration)
    feeder.halt()
    with Queue(queue_name, durable.url) as queue:
        settle(ledger, queue, durable_client, list(feeder.acked), timeout=60, fleet=fleet)
        shut_down(fleet, durable_client, queue_name, workers, dispatchers, reap_bound=30)
        dump(fleet, ledger, faults)
        # A task running, or just finished, when the server went down may run again.
        verdict = compare(
            ledger,
            feeder.acked,
            maybe=feeder.maybe,
            faults=faults,
            before=lease,
            after=lease + ttl + 1.0,
        )
        counters = queue.stats().counters
        problems = verdict_problems(verdict, queue, durable_client, fleet)
    report(
        "redis restart (appendfsync always)",
        capsys,
        seconds=duration,
        restarts=[f"{fault.what} {fault.end - fault.start:.1f}s" for fault in faults],
        acknowledged=len(feeder.acked),
        unacknowledged=len(feeder.maybe),
        reconnect_max_s=round(max(reconnects), 2),
        cpu_share_max_while_down=cpu_shares,
        resume_max_s=round(max(resumes), 2),
        counters=counters,
        **verdict.summary(),
    )
    assert feeder.failures == [], feeder.failures
    assert problems == [], f"seed {SEED}:\n" + "\n".join(problems)
    completed = counters.get("completed", 0)
    assert len(feeder.acked) <= completed <= len(feeder.acked) + len(feeder.maybe), counters
    assert promotion_surplus(counters) <= 0, counters
    assert len(faults) >= 2
    # Back-off means waiting: no daemon may busy-loop while the server is down.
    assert spinning == [], "\n".join(spinning)


@REDIS_ONLY
@pytest.mark.skipif(not SOAK, reason="long-only measurement (DUETIME_SOAK=1)")
def test_appendfsync_everysec_loss_window(
    servers: Servers, redis_url: str, queue_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Measures, does not judge: with ``appendfsync everysec``, schedule continuously
    from four threads, kill -9 the server mid-stream, restart it, and count schedule
    calls that returned but whose task is gone. Reports the loss per round and the
    window (from the oldest lost acknowledgement to the kill). The state that survives
    must still pass the invariant check."""
    durable = servers.start("--appendonly", "yes", "--appendfsync", "everysec")
    keys = QueueKeys(queue_name)
    rounds = []
    for number in range(5):
        group = [
            Feeder(
                durable.url,
                queue_name,
                rate=2000.0,
                lead=(3600.0, 7200.0),
                prefix=f"e{number}t{thread}-",
                seed=SEED + thread,
            )
            for thread in range(4)
        ]
        for feeder in group:
            feeder.start()
        time.sleep(3.0 + random.random())  # let the stream run; not a condition
        # How often Redis had to postpone an AOF write because the previous fsync was
        # still running: only then can a reply go out before its write reaches the kernel.
        delayed = servers.client(durable).info("persistence")["aof_delayed_fsync"]
        killed = time.time()
        durable.kill(signal.SIGKILL)
        for feeder in group:
            feeder.halt()
        durable.start(timeout=60)
        acked = {task_id: when for feeder in group for task_id, when in feeder.acked_when.items()}
        ids = list(acked)
        present = servers.client(durable).hmget(keys.tasks, ids) if ids else []
        lost = [task_id for task_id, blob in zip(ids, present, strict=True) if blob is None]
        with Queue(queue_name, durable.url) as queue:
            assert queue.check() == []
        window = killed - min(acked[i] for i in lost) if lost else 0.0
        rounds.append(
            {
                "acknowledged": len(acked),
                "lost": len(lost),
                "window_s": round(window, 3),
                "aof_delayed_fsync": delayed,
            }
        )
    report(
        "appendfsync everysec loss window (kill -9 of the server process)",
        capsys,
        rounds=rounds,
        lost_total=sum(r["lost"] for r in rounds),
        window_max_s=max(r["window_s"] for r in rounds),
    )


# --- 4. network trouble through a proxy ------------------------------------------------

NETWORK_ENV = {
    "DUETIME_HEARTBEAT_INTERVAL": "0.2",
    # The lease is shorter than the worker TTL, so a stall between the two shows leases
    # expiring (reap_expired_leases) rather than a silent worker being reaped.
    "DUETIME_LEASE_DURATION": "2.0",
    "DUETIME_WORKER_TTL": "4.0",
    "DUETIME_BLOCK_TIMEOUT": "1.0",
    # A command on a dead socket fails after 1 s; a blocking one after 1 + 5 s.
    "DUETIME_SOCKET_TIMEOUT": "1.0",
    "DUETIME_RETRY_BASE": "0.05",
    "DUETIME_SHUTDOWN_GRACE": "5",
}
#: Longest a daemon may take to resume after a network fault ends: socket timeouts
#: (6 s for a blocking call), redis-py's own retries and the 5 s back-off cap, doubled.
RESUME_BOUND = 30.0


@REDIS_ONLY
def test_network_stall_cut_and_dead_sockets(
    fleet: Fleet,
    feeders: list[Feeder],
    proxies: list[FaultyProxy],
    server: Server,
    redis_url: str,
    raw: redis.Redis,
    queue_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A worker and a dispatcher reach Redis through a proxy, another pair directly.
    1. Stall: the proxy stops forwarding (nothing is closed) for longer than a lease
       while the proxied worker runs tasks. Their leases expire, the direct dispatcher
       re-enters them and the direct worker runs them again during the stall. After
       healing, the proxied worker's late results are dropped (each task completes
       once) and it resumes work within a bound.
    2. Cut: every proxied connection is reset, three times; work goes on.
    3. Dead sockets: the direct pair is stopped, then every proxied connection is
       frozen for good (open, silent). The proxied daemons, now alone, must abandon
       those sockets and resume on new ones within a bound: nobody hangs forever.
    Ends with every task done, no unexplained duplicate and a consistent queue."""
    proxy = FaultyProxy(server.port)
    proxies.append(proxy)
    proxy.start()
    env = {**NETWORK_ENV, "DUETIME_TEST_RECORD_URL": redis_url}  # the ledger goes direct
    lease, ttl = float(env["DUETIME_LEASE_DURATION"]), float(env["DUETIME_WORKER_TTL"])
    direct_dispatcher = fleet.start("dispatcher", queue_name, redis_url, env)
    proxied_dispatcher = fleet.start("dispatcher", queue_name, proxy.url, env)
    direct_worker = fleet.start("worker", queue_name, redis_url, env, "-c", "8")
    proxied_worker = fleet.start("worker", queue_name, proxy.url, env, "-c", "8")
    proxied = frozenset({proxied_worker.pid, proxied_dispatcher.pid})
    wait_for_workers(raw, queue_name, 2)
    ledger = Ledger(raw)
    feeder = Feeder(
        redis_url,
        queue_name,
        rate=pick(12.0, 20.0),
        lead=(0.1, 0.5),
        work=(0.2, 0.4),
        prefix="n",
    )
    feeders.append(feeder)
    feeder.start()
    faults: list[Fault] = []
    cycles = pick(1, 5)
    # Longer than a lease, shorter than the worker TTL: the leases lapse, the worker stays.
    stall = lease + 1.0
    recovered_during_stall: list[str] = []
    resume_after_stall: list[float] = []

    def started_on(pid: int, after: float) -> bool:
        ledger.refresh()
        return any(
            e.pid == pid and e.kind == "start" and e.at_ms / 1000 > after
            for e in ledger.entries[-200:]
        )

    def fresh_work_on_proxied() -> bool:
        """The proxied worker started a task in the last 100 ms: one that is sure to be
        still running (0.2 s or more) when the stall begins."""
        ledger.refresh()
        now_ms = time.time() * 1000
        return any(
            run.pid == proxied_worker.pid and run.done_ms is None and now_ms - run.started_ms < 100
            for runs in ledger.attempts.values()
            for run in runs
        )

    for _ in range(cycles):
        # 1. Stall longer than a lease, with tasks running behind it.
        wait_until_sync(
            fresh_work_on_proxied,
            timeout=30,
            what="the proxied worker running a task",
        )
        stalled = time.time()
        proxy.stall()
        caught = ledger.in_flight(proxied_worker.pid)
        time.sleep(stall)  # the stall itself
        healed = time.time()
        proxy.heal()
        faults.append(Fault("stall", stalled, healed, proxied))
        ledger.refresh()
        by_task = ledger.runs_by_task()
        recovered_during_stall += [
            task_id
            for task_id in caught
            if any(
                r.pid == direct_worker.pid and stalled < r.started_ms / 1000 < healed
                for r in by_task.get(task_id, [])
            )
        ]
        wait_until_sync(
            partial(started_on, proxied_worker.pid, healed),
            timeout=RESUME_BOUND,
            what="the proxied worker working again after the stall",
        )
        resume_after_stall.append(time.time() - healed)

        # 2. Cut every proxied connection, three times.
        for _ in range(3):
            cut_at = time.time()
            proxy.cut()
            faults.append(Fault("cut", cut_at, cut_at, proxied))
            time.sleep(0.3)  # pacing between cuts
        cut_done = time.time()
        wait_until_sync(
            partial(started_on, proxied_worker.pid, cut_done),
            timeout=RESUME_BOUND,
            what="the proxied worker working again after the cuts",
        )

    # 3. Dead sockets, with no direct daemon left to cover for the proxied ones.
    fleet.stop(direct_worker, direct_dispatcher)
    frozen_at = time.time()
    frozen = proxy.freeze_existing()
    # A task scheduled now can only be promoted by the proxied dispatcher and run by the
    # proxied worker: both must have dropped their frozen sockets.
    with Queue(queue_name, redis_url) as queue:
        probe = queue.schedule_task(time.time() + 0.5, {}, task="ledger", id="probe")
    wait_until_sync(
        lambda: ledger.all_done([probe]),
        timeout=RESUME_BOUND,
        what="work resumed past frozen sockets",
    )
    resume_after_freeze = time.time() - frozen_at
    faults.append(Fault("frozen sockets", frozen_at, time.time(), proxied))
    feeder.halt()
    scheduled = {**feeder.acked, probe: frozen_at + 0.5}
    with Queue(queue_name, redis_url) as queue:
        settle(ledger, queue, raw, list(scheduled), timeout=60, fleet=fleet)
        shut_down(fleet, raw, queue_name, [proxied_worker], [proxied_dispatcher], reap_bound=30)
        dump(fleet, ledger, faults)
        verdict = compare(
            ledger,
            scheduled,
            maybe=feeder.maybe,
            faults=faults,
            before=lease,
            after=lease + ttl + 1.0,
        )
        counters = queue.stats().counters
        problems = verdict_problems(verdict, queue, raw, fleet)
    report(
        "network stall, cut, dead sockets",
        capsys,
        cycles=cycles,
        stall_s=stall,
        recovered_during_stall=len(recovered_during_stall),
        resume_after_stall_max_s=round(max(resume_after_stall), 2),
        frozen_connections=frozen,
        resume_after_freeze_s=round(resume_after_freeze, 2),
        counters=counters,
        **verdict.summary(),
    )
    assert feeder.failures == [] and feeder.errors == 0, feeder.failures
    assert problems == [], f"seed {SEED}:\n" + "\n".join(problems)
    # Leases expired during the stall, and the tasks the proxied worker was running were
    # run again by the direct one before the network healed; each completed once.
    assert counters.get("expired_leases", 0) >= cycles, counters
    assert recovered_during_stall, "no task caught in the stall was recovered during it"
    assert counters.get("completed") == len(scheduled), counters
    assert promotion_surplus(counters) <= 0, counters


# --- 5. a handler that never returns -----------------------------------------------------

HANG_ENV = {
    "DUETIME_HEARTBEAT_INTERVAL": "0.25",
    "DUETIME_WORKER_TTL": "3.0",
    "DUETIME_LEASE_DURATION": "4.0",
    "DUETIME_BLOCK_TIMEOUT": "1.0",
    "DUETIME_RETRY_BASE": "0.05",
    "DUETIME_SHUTDOWN_GRACE": "2",
}


@REDIS_ONLY
def test_hung_handler_is_timed_out_and_retried(
    fleet: Fleet,
    redis_url: str,
    raw: redis.Redis,
    queue_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One worker with two slots gets handlers that never return (a thread blocked for
    good), timeout 0.5 s, among ordinary tasks. Proves that each hung attempt is timed
    out and failed (not left holding its lease), that the task is retried and succeeds,
    that one that always hangs ends in ``dead`` with a TaskTimeoutError, that the
    worker keeps processing other tasks although more threads hang than it has slots,
    and that it still stops on SIGTERM."""
    rng = random.Random(SEED)
    env = {**HANG_ENV, "DUETIME_TEST_RECORD_URL": redis_url}
    hung_count, others, spread = pick(3, 40), pick(50, 1000), pick(2.0, 20.0)
    dispatcher = fleet.start("dispatcher", queue_name, redis_url, env)
    worker = fleet.start("worker", queue_name, redis_url, env, "-c", "2")
    wait_for_workers(raw, queue_name, 1)
    ledger = Ledger(raw)
    begin = time.time() + 0.5
    jobs = [
        Job(
            {},
            at=begin + spread * i / hung_count,
            task="hang_first_attempt",
            id=f"h{i}",
            timeout=0.5,
            max_attempts=3,
        )
        for i in range(hung_count)
    ] + [
        Job(
            {"work": round(rng.uniform(0.0, 0.02), 3)},
            at=begin + spread * i / others,
            task="ledger",
            id=f"o{i}",
        )
        for i in range(others)
    ]
    always = Job({}, at=begin, task="hang_always", id="forever", timeout=0.5, max_attempts=2)
    scheduled = {str(job.id): float(job.at) for job in jobs}  # type: ignore[arg-type]
    hung = frozenset(f"h{i}" for i in range(hung_count)) | {"forever"}
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_many([*jobs, always])
        settle(ledger, queue, raw, list(scheduled), timeout=spread + 60, fleet=fleet)
        dead = queue.dead_tasks()
        assert [task.id for task in dead] == ["forever"], dead
        assert "TaskTimeoutError" in dead[0].error and dead[0].attempts == 2, dead[0]
        assert queue.purge_dead(["forever"]) == 1
        counters = queue.stats().counters
        shut_down(fleet, raw, queue_name, [worker], [dispatcher], reap_bound=30)
        dump(fleet, ledger)
        verdict = compare(
            ledger,
            scheduled,
            maybe={"forever"},
            faults=[Fault("hung handler", begin, float("inf"), task_ids=hung)],
        )
        problems = verdict_problems(verdict, queue, raw, fleet)
    by_task = ledger.runs_by_task()
    retries = []
    for task_id in sorted(hung - {"forever"}):
        first, *rest = by_task[task_id]
        assert first.attempt == 1 and first.done_ms is None, by_task[task_id]
        assert [r.attempt for r in rest] == [2] and rest[0].done_ms is not None, by_task[task_id]
        retries.append(rest[0].started_ms / 1000 - (first.started_ms / 1000 + 0.5))
    assert [r.attempt for r in by_task["forever"]] == [1, 2]
    # The worker kept working once more threads hung than it has slots: every task ran
    # in that one process, including those that started after the last hang began.
    assert {r.pid for runs in by_task.values() for r in runs} == {worker.pid}
    last_hang_ms = max(
        r.started_ms for task_id in hung for r in by_task[task_id] if r.done_ms is None
    )
    after_hangs = [
        task_id
        for task_id, runs in by_task.items()
        if task_id not in hung and runs[0].started_ms > last_hang_ms
    ]
    assert after_hangs, "no ordinary task started after the last hang: nothing was shown"
    report(
        "hung handler",
        capsys,
        hung_tasks=len(hung),
        other_tasks=others,
        hung_threads=hung_count + 2,
        slots=2,
        tasks_after_last_hang=len(after_hangs),
        retry_after_timeout_max_s=round(max(retries), 2),
        counters=counters,
        **verdict.summary(),
    )
    assert problems == [], f"seed {SEED}:\n" + "\n".join(problems)
    # Timed-out attempts fail (the fail script applies under the still-valid lease).
    assert counters.get("retried") == hung_count + 1, counters
    assert counters.get("dead") == 1 and counters.get("failed") == hung_count + 2, counters
    assert not counters.get("fenced") and not counters.get("expired_leases"), counters
    assert counters.get("completed") == hung_count + others, counters
    assert promotion_surplus(counters) == 0, counters


# --- 6. slow consumers on a large backlog ------------------------------------------------

BACKLOG_ENV = {"DUETIME_SHUTDOWN_GRACE": "5", "DUETIME_BLOCK_TIMEOUT": "1.0"}


@REDIS_ONLY
def test_large_backlog_worker_memory_stays_flat(
    fleet: Fleet,
    redis_url: str,
    raw: redis.Redis,
    queue_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A large backlog of ready tasks, drained by several workers. Samples each worker's
    resident memory (VmRSS) while it drains: after a warm-up (the first quarter of the
    backlog), no worker grows by more than 30 %. Nothing per task may accumulate in a
    worker. Default lease settings: nothing is faulted, so nothing may run twice."""
    env = {**BACKLOG_ENV, "DUETIME_TEST_RECORD_URL": redis_url}
    count, worker_count = pick(8_000, 200_000), pick(3, 10)
    ledger = Ledger(raw)
    now = time.time()
    with Queue(queue_name, redis_url) as queue:
        scheduled: dict[str, float] = {}
        for first in range(0, count, 20_000):
            jobs = [
                Job({}, at=now, task="ledger", id=f"b{i}")
                for i in range(first, min(count, first + 20_000))
            ]
            queue.schedule_many(jobs)
            scheduled.update((str(job.id), now) for job in jobs)
        assert queue.stats().ready == count
        dispatcher = fleet.start("dispatcher", queue_name, redis_url, env)
        workers = [
            fleet.start("worker", queue_name, redis_url, env, "-c", "10")
            for _ in range(worker_count)
        ]
        began = time.time()
        keys = QueueKeys(queue_name)
        samples: dict[int, list[tuple[int, int]]] = {w.pid: [] for w in workers}  # (left, kib)
        deadline = time.monotonic() + pick(120.0, 900.0)
        while (left := int(raw.llen(keys.ready))) > 0:
            assert time.monotonic() < deadline, f"backlog not drained: {left} left"
            assert all(w.alive() for w in workers), fleet.crashes()
            for worker in workers:
                samples[worker.pid].append((left, rss_kib(worker.pid)))
            time.sleep(0.2)  # the sampling period
        drained = time.time() - began
        settle(ledger, queue, raw, list(scheduled), timeout=60, fleet=fleet)
        shut_down(fleet, raw, queue_name, workers, [dispatcher], reap_bound=30)
        dump(fleet, ledger)
        verdict = compare(ledger, scheduled)
        counters = queue.stats().counters
        problems = verdict_problems(verdict, queue, raw, fleet)
    # Per worker: resident memory when a quarter of the backlog was done (imports, pools
    # and buffers are in place by then), and the highest value after that.
    rss: dict[int, tuple[int, int]] = {}
    for pid, series in samples.items():
        warm = [kib for left, kib in series if left <= 0.75 * count]
        if len(warm) >= 2:
            rss[pid] = (warm[0], max(warm))
    growth = {pid: high / base - 1 for pid, (base, high) in rss.items()}
    report(
        "backlog, slow consumers",
        capsys,
        tasks=count,
        workers=worker_count,
        drain_s=round(drained, 1),
        tasks_per_s=round(count / drained),
        rss_kib_warm_and_max=sorted(rss.values()),
        rss_growth_max_pct=round(100 * max(growth.values(), default=0.0), 1),
        counters=counters,
        **verdict.summary(),
    )
    assert problems == [], f"seed {SEED}:\n" + "\n".join(problems)
    assert counters.get("completed") == count and verdict.duplicates == 0, counters
    assert promotion_surplus(counters) <= 0, counters
    assert growth, "too few samples after warm-up to judge memory"
    assert max(growth.values()) < 0.30, growth


# --- 7. workers paused by SIGSTOP past their lease and their worker TTL -------------------

PAUSE_ENV = {
    # The settings of the independent trial that found a paused worker's pending BLMOVE
    # capturing its own re-entered task: a block longer than the worker TTL.
    "DUETIME_HEARTBEAT_INTERVAL": "0.5",
    "DUETIME_WORKER_TTL": "2.0",
    "DUETIME_LEASE_DURATION": "4.0",
    "DUETIME_BLOCK_TIMEOUT": "3.0",
    "DUETIME_RETRY_BASE": "0.05",
    "DUETIME_SHUTDOWN_GRACE": "5",
}


@KINDS_IN_SOAK
def test_worker_paused_past_its_lease_and_ttl_then_resumed(
    fleet: Fleet,
    redis_url: str,
    raw: redis.Redis,
    queue_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two workers; now and then one (preferably busy) is frozen with SIGSTOP for longer
    than its lease and its worker TTL, then resumed with SIGCONT, while tasks come due
    throughout. The frozen worker is reaped and its tasks run elsewhere; when it wakes,
    its late outcomes are fenced, its pending BLMOVE may have caught a re-entered task,
    and it must carry on working. Proves: nothing lost, nothing early, every duplicate
    explained by a pause, no task started more than once more per pause it lived
    through (a late "lost" report must not cancel a newer attempt), and a consistent,
    empty queue at the end."""
    rng = random.Random(SEED)
    env = {**PAUSE_ENV, "DUETIME_TEST_RECORD_URL": redis_url}
    # Work to match the slots: the long run keeps one worker of two frozen much of the
    # time, so about 0.3 s of work a task on 2 x 10 slots leaves room to catch up.
    count, duration, concurrency = pick(100, 1500), pick(8.0, 60.0), pick("5", "10")
    dispatcher, workers = start_fleet(fleet, raw, queue_name, redis_url, env, 2, concurrency)
    ledger = Ledger(raw)
    begin = time.time() + 1.0

    def work() -> float:  # mostly short; one in five long enough to be caught by a pause
        return round(rng.uniform(0.5, 1.5) if rng.random() < 0.2 else rng.uniform(0.02, 0.2), 3)

    jobs = [
        Job(
            {"work": work()},
            at=begin + duration * i / count,
            task="ledger",
            id=f"p{i}",
        )
        for i in range(count)
    ]
    scheduled = {str(job.id): float(job.at) for job in jobs}  # type: ignore[arg-type]
    pauses: list[Fault] = []
    lease, ttl = float(PAUSE_ENV["DUETIME_LEASE_DURATION"]), float(PAUSE_ENV["DUETIME_WORKER_TTL"])
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_many(jobs)
        moment = begin + 1.0
        try:
            while moment < begin + duration - 2:
                pause_until(moment)
                ledger.refresh()
                busy = [w for w in workers if ledger.in_flight(w.pid)]
                victim = rng.choice(busy or workers)
                frozen_for = rng.uniform(lease + 0.5, lease + 2.5)  # past lease and TTL
                start = time.time()
                victim.process.send_signal(signal.SIGSTOP)
                pause_until(start + frozen_for)
                victim.process.send_signal(signal.SIGCONT)
                pauses.append(Fault("SIGSTOP", start, time.time(), frozenset({victim.pid})))
                moment = time.time() + rng.uniform(1.0, 3.0)
        finally:
            for worker in workers:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGCONT)
        settle(ledger, queue, raw, list(scheduled), timeout=duration + 120, fleet=fleet)
        shut_down(fleet, raw, queue_name, workers, [dispatcher], reap_bound=30)
        dump(fleet, ledger, pauses)
        verdict = compare(ledger, scheduled, faults=pauses, after=lease + ttl + 2)
        counters = queue.stats().counters
        problems = verdict_problems(verdict, queue, raw, fleet)

    # One pause costs a task at most one extra start: count the pauses each task's runs
    # lived through: its process frozen while the run was not done, or just before it
    # started (an attempt claimed before the pause can start as the process wakes, if the
    # pause fell between its lease check and its handler's first line).
    too_many = []
    for task_id, runs in ledger.runs_by_task().items():
        lived_through = {id(fault) for run in runs for fault in pauses if fault.hits(run, 1.0, 1.0)}
        if len(runs) > 1 + len(lived_through):
            too_many.append(f"{task_id}: {len(runs)} starts, {len(lived_through)} pause(s)")
    report(
        "workers paused by SIGSTOP",
        capsys,
        tasks=count,
        seconds=duration,
        pauses=len(pauses),
        paused_s=[round(p.end - p.start, 1) for p in pauses],
        counters=counters,
        **verdict.summary(),
    )
    assert problems == [], f"seed {SEED}:\n" + "\n".join(problems)
    assert too_many == [], f"seed {SEED}:\n" + "\n".join(too_many)
    assert pauses, "no pause was injected"
    # Each paused worker was reaped while frozen, and came back to work.
    assert counters.get("reaped_workers", 0) >= 1, counters
    assert all(w.alive() is False and w.process.returncode == 0 for w in workers)
