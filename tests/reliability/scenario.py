"""What every fault scenario is made of: daemons run as ``python -m duetime`` processes
(a ``Fleet``), producers that schedule from a thread while faults happen (``Feeder``),
the seed and the soak switch, and a ``Scenario``: the set-up a test is given (its
queue, the handlers' ledger, the daemons' settings, seeded random choices) and the
ending every scenario shares (``Scenario.end``):

1. wait, bounded, until every expected task finished and the queue is empty;
2. stop the workers, let the dispatchers reap every killed one, stop the dispatchers;
3. compare the ledger with what was scheduled and the faults injected (nothing lost,
   nothing early, a task run again only where a fault explains it), run the invariant
   checker, look for keys left behind and for daemons that crashed or logged a
   traceback;
4. report the figures and fail on any of those problems, printing the seed.

A scenario reads as what is particular to it: its settings, its faults, its tasks, and
the checks of its own it makes on top of that verdict.
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
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
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

#: The daemons' settings in a kill storm.
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
#: Where workers are never faulted, their leases are long: with nothing to make a task
#: run twice, any duplicate is a bug in promotion, not a slow heartbeat.
CALM_ENV = {
    "DUETIME_HEARTBEAT_INTERVAL": "0.5",
    "DUETIME_WORKER_TTL": "10",
    "DUETIME_LEASE_DURATION": "15",
    "DUETIME_BLOCK_TIMEOUT": "1.0",
    "DUETIME_SHUTDOWN_GRACE": "5",
}


def pick(short: T, long: T) -> T:
    return long if SOAK else short


def pause_until(moment: float) -> None:
    """Pace the fault schedule (not a wait for a condition)."""
    time.sleep(max(0.0, moment - time.time()))


# --- daemons as processes --------------------------------------------------------------


@dataclass(eq=False)
class Daemon:
    """One daemon process, its log file, and how it was started (to start another like
    it)."""

    role: str
    process: subprocess.Popen[bytes]
    log: Path
    command: list[str]
    env: Mapping[str, str]
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
        app: str = APP,
    ) -> Daemon:
        """A ``role`` process on ``queue``; a worker (or ``run``) runs the handlers of
        ``app``."""
        # Handlers write the ledger to $DUETIME_TEST_RECORD_URL; without it they fail.
        assert "DUETIME_TEST_RECORD_URL" in env
        command = [sys.executable, "-m", "duetime", "--log-level", "info", role]
        if role in ("worker", "run"):
            command.append(app)
        command += ["--queue", queue, "--redis", url, *options]
        return self._spawn(role, command, env)

    def again(self, daemon: Daemon) -> Daemon:
        """Another process started as ``daemon`` was."""
        return self._spawn(daemon.role, daemon.command, daemon.env)

    def _spawn(self, role: str, command: list[str], env: Mapping[str, str]) -> Daemon:
        log = self.directory / f"{len(self.daemons):03d}-{role}.log"
        with open(log, "wb") as out:
            # A log file, not a pipe: a daemon writing warnings into a pipe nobody reads
            # would block once the pipe is full and look hung.
            process = subprocess.Popen(
                command, cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=out
            )
        daemon = Daemon(role, process, log, command, env)
        self.daemons.append(daemon)
        return daemon

    def kill(self, daemon: Daemon) -> float:
        """SIGKILL; returns the wall-clock time of the kill."""
        at = time.time()
        daemon.ended_by_test = True
        daemon.process.kill()
        daemon.process.wait(10)
        return at

    def replace(self, victim: Daemon, group: list[Daemon]) -> float:
        """SIGKILL ``victim`` and start another like it in its place in ``group``;
        returns the wall-clock time of the kill."""
        at = self.kill(victim)
        group.remove(victim)
        group.append(self.again(victim))
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


# --- looking at the queue --------------------------------------------------------------


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


def wait_for_workers(client: redis.Redis, queue: str, count: int, timeout: float = 30) -> None:
    wait_until_sync(
        lambda: client.zcard(QueueKeys(queue).workers) >= count,
        timeout=timeout,
        what=f"{count} worker(s) registered",
    )


def promotion_surplus(counters: Mapping[str, int]) -> int:
    """Promotions beyond the entries made into ``scheduled``: future tasks, retries and
    tasks re-entered by reaping. Each entry is promoted once, so this is never positive,
    and it is zero when every task was scheduled into the future (a task due at once
    goes straight to ``ready``). A task promoted twice would make it positive."""
    entries = sum(
        counters.get(name, 0) for name in ("scheduled", "retried", "reaped_tasks", "expired_leases")
    )
    return counters.get("promoted", 0) - entries


# --- the ending every scenario shares --------------------------------------------------


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


def shut_down(
    fleet: Fleet,
    client: redis.Redis,
    queue: str,
    workers: Sequence[Daemon],
    dispatchers: Sequence[Daemon],
    reap_bound: float = 30,
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


def dump(fleet: Fleet, ledger: Ledger, faults: Sequence[Fault] = ()) -> None:
    """Keep the ledger and the faults next to the daemons' logs, for a post-mortem."""
    with open(fleet.directory / "ledger.txt", "w") as out:
        for fault in faults:
            out.write(f"fault {fault.what} {fault.start:.3f} {fault.end:.3f} {fault.pids}\n")
        for e in ledger.entries:
            out.write(f"{e.kind} {e.task_id} {e.attempt} {e.pid} {e.at_ms:.3f} {e.run_at_ms}\n")


def invariant_problems(
    verdict: Verdict,
    queue: Queue,
    left_behind: Sequence[str],
    fleet: Fleet,
    skip: Collection[str] = (),
) -> list[str]:
    """Everything that breaks a guarantee, gathered so one failure shows all of it: the
    ledger's problems (but those of the kinds in ``skip``, which the caller judges
    itself), the invariant checker's violations, the keys ``left_behind`` and the
    daemons that crashed."""
    problems = [f"ledger: {problem}" for problem in verdict.problems_but(skip)]
    problems += [f"check: {violation}" for violation in queue.check()]
    problems += [f"left behind: {key}" for key in left_behind]
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


def fail_on(problems: Sequence[str]) -> None:
    """Fail with every problem, and the seed that repeats the run."""
    assert problems == [], f"seed {SEED}:\n" + "\n".join(problems)


@dataclass(slots=True)
class Ending:
    """A scenario's verdict: the ledger compared, the queue's counters once everything
    stopped, and every problem found. A scenario adds its own problems to ``problems``
    before ``judge``."""

    capsys: pytest.CaptureFixture[str]
    verdict: Verdict
    counters: dict[str, int]
    problems: list[str]

    def judge(self, name: str, **figures: Any) -> None:
        """Report the scenario's figures with its counters and the ledger's summary, then
        fail on any problem."""
        report(name, self.capsys, **figures, counters=self.counters, **self.verdict.summary())
        fail_on(self.problems)


# --- a scenario: its set-up and its ending ---------------------------------------------


@dataclass(eq=False)
class Scenario:
    """What a fault scenario works with: its daemons (``fleet``), its queue (on the
    session's server unless ``use_server`` moves it), the handlers' ledger (on the
    session's server, which no fault touches), the daemons' settings (``configure``),
    random choices from the seed, and its producers (halted at the end)."""

    fleet: Fleet
    server: Server
    ledger_url: str
    queue_name: str
    capsys: pytest.CaptureFixture[str]
    url: str  # where the queue lives
    client: redis.Redis  # a plain client there
    ledger: Ledger
    rng: random.Random = field(default_factory=lambda: random.Random(SEED))
    env: dict[str, str] = field(default_factory=dict)
    feeders: list[Feeder] = field(default_factory=list)

    # --- set-up ---

    def configure(self, settings: Mapping[str, str]) -> dict[str, str]:
        """The daemons' environment from now on: ``settings``, and the ledger's URL for
        their handlers."""
        self.env = {**settings, "DUETIME_TEST_RECORD_URL": self.ledger_url}
        return self.env

    def use_server(self, url: str, client: redis.Redis) -> None:
        """The queue lives on another server from now on; the ledger stays."""
        self.url, self.client = url, client

    def queue(self) -> Queue:
        return Queue(self.queue_name, self.url)

    def start(self, role: str, *options: str, url: str | None = None, app: str = APP) -> Daemon:
        """A daemon of the queue, on its server (or ``url``), with the settings."""
        return self.fleet.start(role, self.queue_name, url or self.url, self.env, *options, app=app)

    def start_fleet(
        self,
        *,
        dispatchers: int,
        workers: int,
        concurrency: int | None = None,
        app: str = APP,
    ) -> tuple[list[Daemon], list[Daemon]]:
        """Dispatcher and worker processes (of ``concurrency`` slots each, or the
        default), once every worker registered."""
        options = () if concurrency is None else ("-c", str(concurrency))
        started = [self.start("dispatcher") for _ in range(dispatchers)]
        working = [self.start("worker", *options, app=app) for _ in range(workers)]
        self.wait_for_workers(workers)
        return started, working

    def wait_for_workers(self, count: int) -> None:
        wait_for_workers(self.client, self.queue_name, count)

    def feed(
        self,
        *,
        rate: float,
        lead: tuple[float, float],
        work: tuple[float, float] = (0.0, 0.0),
        batch: int = 1,
        prefix: str = "f",
    ) -> Feeder:
        """A started ``Feeder`` of the queue, halted at the end if the test did not."""
        feeder = Feeder(
            self.url, self.queue_name, rate=rate, lead=lead, work=work, batch=batch, prefix=prefix
        )
        self.feeders.append(feeder)
        feeder.start()
        return feeder

    def busy_worker(self, workers: Sequence[Daemon]) -> Daemon:
        """A worker in the middle of a task, so that a fault interrupts work (any worker
        when none is)."""
        self.ledger.refresh()
        busy = [w for w in workers if self.ledger.in_flight(w.pid)]
        return self.rng.choice(busy or workers)

    # --- the ending ---

    def end(
        self,
        queue: Queue,
        expected: Mapping[str, float],
        *,
        workers: Sequence[Daemon],
        dispatchers: Sequence[Daemon],
        timeout: float = 60.0,
        settled: Callable[[], None] | None = None,
        maybe: Collection[str] = (),
        faults: Sequence[Fault] = (),
        before: float = 1.0,
        after: float = 5.0,
        left_behind: Callable[[], list[str]] | None = None,
    ) -> Ending:
        """The shared ending: wait (``timeout``) until every ``expected`` task (id ->
        run-at, epoch seconds) finished and the queue is empty; run ``settled`` (what
        the scenario looks at before its daemons stop); shut down; and judge
        (``verdict``)."""
        settle(self.ledger, queue, self.client, list(expected), timeout, self.fleet)
        if settled is not None:
            settled()
        self.shut_down(workers, dispatchers)
        return self.verdict(
            queue,
            expected,
            maybe=maybe,
            faults=faults,
            before=before,
            after=after,
            left_behind=left_behind,
        )

    def shut_down(self, workers: Sequence[Daemon], dispatchers: Sequence[Daemon]) -> None:
        shut_down(self.fleet, self.client, self.queue_name, workers, dispatchers)

    def verdict(
        self,
        queue: Queue,
        expected: Mapping[str, float],
        *,
        maybe: Collection[str] = (),
        faults: Sequence[Fault] = (),
        before: float = 1.0,
        after: float = 5.0,
        left_behind: Callable[[], list[str]] | None = None,
    ) -> Ending:
        """Once every daemon stopped: keep the ledger for a post-mortem, compare it with
        ``expected`` (``maybe``: ids that may have run or not; a second start is
        explained by one of ``faults``, widened by ``before`` and ``after``: see
        ``compare``), read the counters, and gather every problem, with the keys left
        behind (``leftovers`` unless ``left_behind`` says otherwise)."""
        dump(self.fleet, self.ledger, faults)
        verdict = compare(
            self.ledger, expected, maybe=maybe, faults=faults, before=before, after=after
        )
        counters = queue.stats().counters
        left = leftovers(self.client, queue.name) if left_behind is None else left_behind()
        problems = invariant_problems(verdict, queue, left, self.fleet)
        return Ending(self.capsys, verdict, counters, problems)

    def close(self) -> None:
        for feeder in self.feeders:
            if feeder.is_alive():
                feeder.halt()
