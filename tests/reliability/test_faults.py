"""Fault injection on real processes: workers and dispatchers killed with SIGKILL, Redis
restarted under load, connections stalled, cut and frozen by a proxy, handlers that
never return, and a large backlog.

Every scenario runs the daemons as separate ``python -m duetime`` processes on loopback,
is bounded in time, and ends with the same verdict (``Scenario.end``, in scenario.py):
``queue.check() == []``, nothing left behind in Redis, and a ledger comparison. The
ledger is written by the handlers in tests/apps.py (one "start" and one "done" record
per attempt, with the wall clock and the task's run-at): every acknowledged task
completed at least once, none started before its run-at, and a task that ran more than
once did so only where an injected fault made it possible.

Each scenario has a short version that runs in the normal suite, and a long one
selected with ``DUETIME_SOAK=1`` (``make reliability``). Timing figures are measured and
reported, never pass/fail thresholds, except generous bounds on recovery: a daemon that
does not resume within its bound is hung.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path

import pytest

from duetime import Job, Queue
from duetime.store.plans.keys import QueueKeys
from tests.helpers import wait_until_sync
from tests.reliability.ledger import Fault
from tests.reliability.proxy import FaultyProxy
from tests.reliability.scenario import (
    CALM_ENV,
    KINDS_IN_SOAK,
    REDIS_ONLY,
    SEED,
    SOAK,
    STORM_ENV,
    Daemon,
    Feeder,
    Scenario,
    Servers,
    fail_on,
    pause_until,
    pick,
    promotion_surplus,
    report,
)
from tests.servers import Server


@pytest.fixture
def proxies() -> Iterator[list[FaultyProxy]]:
    started: list[FaultyProxy] = []
    try:
        yield started
    finally:
        for proxy in started:
            proxy.close()


# --- looking at processes --------------------------------------------------------------


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


# --- 1. worker kill -9 storm -----------------------------------------------------------


@KINDS_IN_SOAK
def test_worker_kill_9_storm(scenario: Scenario) -> None:
    """Three workers, one killed with SIGKILL every ~2 s (preferably one that is running
    tasks) and restarted at once, while tasks come due throughout. Proves that no task
    is lost, none runs early, only tasks interrupted by a kill run again, and the
    dispatcher reaps every killed worker, leaving a consistent, empty queue."""
    scenario.configure(STORM_ENV)
    rng, ledger = scenario.rng, scenario.ledger
    count, duration = pick(350, 10_000), pick(5.0, 30.0)
    dispatchers, workers = scenario.start_fleet(dispatchers=1, workers=3, concurrency=pick(10, 20))
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
    with scenario.queue() as queue:
        queue.schedule_many(jobs)
        spacing = pick((1.2, 2.2), (1.5, 2.5))  # ~2 s; a little tighter in the short run
        moment = begin + rng.uniform(*spacing)
        while moment < begin + duration:
            pause_until(moment)
            # Prefer a worker in the middle of a task, so that kills interrupt work.
            victim = scenario.busy_worker(workers)
            kills.append((victim.pid, scenario.fleet.replace(victim, workers)))
            moment += rng.uniform(*spacing)
        end = scenario.end(
            queue,
            scheduled,
            workers=workers,
            dispatchers=dispatchers,
            timeout=duration + 60,
            faults=[Fault("kill -9", at, at, frozenset({pid})) for pid, at in kills],
        )

    # Recovery: from each kill to the next start of every task that was mid-run in it.
    by_task = ledger.runs_by_task()
    recoveries = []
    for pid, at in kills:
        for task_id in ledger.in_flight(pid):
            later = [r.started_ms / 1000 for r in by_task[task_id] if r.started_ms / 1000 > at]
            recoveries.append(min(later) - at)
    end.judge(
        "worker kill -9 storm",
        kind=scenario.server.kind,
        tasks=count,
        seconds=duration,
        kills=len(kills),
        interrupted=len(recoveries),
        recovery_max_s=round(max(recoveries, default=0), 2),
        recovery_p50_s=round(sorted(recoveries)[len(recoveries) // 2] if recoveries else 0, 2),
    )
    counters = end.counters
    assert counters.get("completed") == count, counters
    assert promotion_surplus(counters) == 0, counters
    # Each killed worker that had registered is reaped once, never a live one.
    assert counters.get("reaped_workers", 0) <= len(kills), counters
    assert recoveries, "no kill interrupted a running task: the scenario proved nothing"


# --- 2. dispatcher kill -9 and multiplicity ---------------------------------------------


@KINDS_IN_SOAK
def test_dispatcher_kill_9_with_three_dispatchers(scenario: Scenario) -> None:
    """Three dispatchers race for the same queue while one of them is killed with SIGKILL
    every ~3 s and restarted, and tasks are scheduled continuously, each due within
    1.5 s (so the wake alarm matters). Proves that no task is promoted twice (each runs
    exactly once, as attempt 1, with no worker fault at all), none is lost or stuck,
    and none runs early."""
    scenario.configure(CALM_ENV)  # workers are never faulted here
    rng = scenario.rng
    duration = pick(5.0, 60.0)
    dispatchers, workers = scenario.start_fleet(dispatchers=3, workers=2, concurrency=20)
    feeder = scenario.feed(
        rate=pick(60.0, 300.0), lead=(0.05, 1.5), work=(0.0, 0.02), batch=3, prefix="d"
    )
    kills = 0
    began = time.time()
    moment = began + rng.uniform(1.5, 2.5)
    while moment < began + duration:
        pause_until(moment)
        scenario.fleet.replace(rng.choice(dispatchers), dispatchers)
        kills += 1
        moment += rng.uniform(2.0, 4.0)
    pause_until(began + duration)
    feeder.halt()
    with scenario.queue() as queue:
        # No faults are passed: any second start of a task is unexplained.
        end = scenario.end(
            queue, feeder.acked, workers=workers, dispatchers=dispatchers, maybe=feeder.maybe
        )
    end.judge(
        "dispatcher kill -9, three dispatchers",
        kind=scenario.server.kind,
        seconds=duration,
        kills=kills,
    )
    assert feeder.failures == [] and feeder.errors == 0, feeder.failures
    counters = end.counters
    assert counters.get("completed") == len(feeder.acked), counters
    # Promotion moves each task once: a task promoted twice would show here even if the
    # second copy had not run yet. (A task already due when scheduled skips promotion.)
    assert promotion_surplus(counters) <= 0, counters
    assert not counters.get("expired_leases") and not counters.get("reaped_workers"), counters
    # "None stuck": the wake alarm one killed dispatcher took is covered by the others'
    # idle passes (one per block_timeout); far more than that would be a stuck task.
    assert end.verdict.percentile(1.0) < 10_000, end.verdict.summary()


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
def test_redis_restart_loses_no_acknowledged_task(servers: Servers, scenario: Scenario) -> None:
    """Redis with ``appendonly yes`` and ``appendfsync always`` is restarted mid-run, by
    SIGTERM and by SIGKILL in turn, while tasks are scheduled one call at a time and run;
    some outages are brief, some outlast a lease and a worker TTL. Proves that every
    schedule call that returned completes, that dispatchers and workers wait while the
    server is down (back off, not spin) and reconnect on their own (each has a
    connection to the new server within a bound), that work resumes, and that tasks run
    again only around an outage. The ledger lives on another server, which stays up."""
    durable = servers.start("--appendonly", "yes", "--appendfsync", "always")
    scenario.use_server(durable.url, servers.client(durable))
    env = scenario.configure(RESTART_ENV)
    rng, ledger = scenario.rng, scenario.ledger
    lease, ttl = float(env["DUETIME_LEASE_DURATION"]), float(env["DUETIME_WORKER_TTL"])
    duration = pick(6.5, 60.0)
    dispatchers, workers = scenario.start_fleet(dispatchers=2, workers=2)
    feeder = scenario.feed(rate=pick(80.0, 200.0), lead=(0.2, 2.0), work=(0.0, 0.05), prefix="r")
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
    with scenario.queue() as queue:
        # A task running, or just finished, when the server went down may run again.
        end = scenario.end(
            queue,
            feeder.acked,
            workers=workers,
            dispatchers=dispatchers,
            maybe=feeder.maybe,
            faults=faults,
            before=lease,
            after=lease + ttl + 1.0,
        )
    end.judge(
        "redis restart (appendfsync always)",
        seconds=duration,
        restarts=[f"{fault.what} {fault.end - fault.start:.1f}s" for fault in faults],
        acknowledged=len(feeder.acked),
        unacknowledged=len(feeder.maybe),
        reconnect_max_s=round(max(reconnects), 2),
        cpu_share_max_while_down=cpu_shares,
        resume_max_s=round(max(resumes), 2),
    )
    assert feeder.failures == [], feeder.failures
    counters = end.counters
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
def test_network_stall_cut_and_dead_sockets(proxies: list[FaultyProxy], scenario: Scenario) -> None:
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
    proxy = FaultyProxy(scenario.server.port)
    proxies.append(proxy)
    proxy.start()
    env = scenario.configure(NETWORK_ENV)  # the ledger goes direct
    ledger = scenario.ledger
    lease, ttl = float(env["DUETIME_LEASE_DURATION"]), float(env["DUETIME_WORKER_TTL"])
    direct_dispatcher = scenario.start("dispatcher")
    proxied_dispatcher = scenario.start("dispatcher", url=proxy.url)
    direct_worker = scenario.start("worker", "-c", "8")
    proxied_worker = scenario.start("worker", "-c", "8", url=proxy.url)
    proxied = frozenset({proxied_worker.pid, proxied_dispatcher.pid})
    scenario.wait_for_workers(2)
    feeder = scenario.feed(rate=pick(12.0, 20.0), lead=(0.1, 0.5), work=(0.2, 0.4), prefix="n")
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
    scenario.fleet.stop(direct_worker, direct_dispatcher)
    frozen_at = time.time()
    frozen = proxy.freeze_existing()
    # A task scheduled now can only be promoted by the proxied dispatcher and run by the
    # proxied worker: both must have dropped their frozen sockets.
    with scenario.queue() as queue:
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
    with scenario.queue() as queue:
        end = scenario.end(
            queue,
            scheduled,
            workers=[proxied_worker],
            dispatchers=[proxied_dispatcher],
            maybe=feeder.maybe,
            faults=faults,
            before=lease,
            after=lease + ttl + 1.0,
        )
    end.judge(
        "network stall, cut, dead sockets",
        cycles=cycles,
        stall_s=stall,
        recovered_during_stall=len(recovered_during_stall),
        resume_after_stall_max_s=round(max(resume_after_stall), 2),
        frozen_connections=frozen,
        resume_after_freeze_s=round(resume_after_freeze, 2),
    )
    assert feeder.failures == [] and feeder.errors == 0, feeder.failures
    counters = end.counters
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
def test_hung_handler_is_timed_out_and_retried(scenario: Scenario) -> None:
    """One worker with two slots gets handlers that never return (a thread blocked for
    good), timeout 0.5 s, among ordinary tasks. Proves that each hung attempt is timed
    out and failed (not left holding its lease), that the task is retried and succeeds,
    that one that always hangs ends in ``dead`` with a TaskTimeoutError, that the
    worker keeps processing other tasks although more threads hang than it has slots,
    and that it still stops on SIGTERM."""
    scenario.configure(HANG_ENV)
    rng, ledger = scenario.rng, scenario.ledger
    hung_count, others, spread = pick(3, 40), pick(50, 1000), pick(2.0, 20.0)
    dispatchers, workers = scenario.start_fleet(dispatchers=1, workers=1, concurrency=2)
    [worker] = workers
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
    with scenario.queue() as queue:
        queue.schedule_many([*jobs, always])

        def only_forever_dead() -> None:
            dead = queue.dead_tasks()
            assert [task.id for task in dead] == ["forever"], dead
            assert "TaskTimeoutError" in dead[0].error and dead[0].attempts == 2, dead[0]
            assert queue.purge_dead(["forever"]) == 1

        end = scenario.end(
            queue,
            scheduled,
            workers=workers,
            dispatchers=dispatchers,
            timeout=spread + 60,
            settled=only_forever_dead,
            maybe={"forever"},
            faults=[Fault("hung handler", begin, float("inf"), task_ids=hung)],
        )
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
    end.judge(
        "hung handler",
        hung_tasks=len(hung),
        other_tasks=others,
        hung_threads=hung_count + 2,
        slots=2,
        tasks_after_last_hang=len(after_hangs),
        retry_after_timeout_max_s=round(max(retries), 2),
    )
    counters = end.counters
    # Timed-out attempts fail (the fail script applies under the still-valid lease).
    assert counters.get("retried") == hung_count + 1, counters
    assert counters.get("dead") == 1 and counters.get("failed") == hung_count + 2, counters
    assert not counters.get("fenced") and not counters.get("expired_leases"), counters
    assert counters.get("completed") == hung_count + others, counters
    assert promotion_surplus(counters) == 0, counters


# --- 6. slow consumers on a large backlog ------------------------------------------------

# --- 6. slow consumers on a large backlog ------------------------------------------------

BACKLOG_ENV = {"DUETIME_SHUTDOWN_GRACE": "5", "DUETIME_BLOCK_TIMEOUT": "1.0"}


@REDIS_ONLY
def test_large_backlog_worker_memory_stays_flat(scenario: Scenario) -> None:
    """A large backlog of ready tasks, drained by several workers. Samples each worker's
    resident memory (VmRSS) while it drains: after a warm-up (the first quarter of the
    backlog), no worker grows by more than 30 %. Nothing per task may accumulate in a
    worker. Default lease settings: nothing is faulted, so nothing may run twice."""
    scenario.configure(BACKLOG_ENV)
    count, worker_count = pick(8_000, 200_000), pick(3, 10)
    now = time.time()
    with scenario.queue() as queue:
        scheduled: dict[str, float] = {}
        for first in range(0, count, 20_000):
            jobs = [
                Job({}, at=now, task="ledger", id=f"b{i}")
                for i in range(first, min(count, first + 20_000))
            ]
            queue.schedule_many(jobs)
            scheduled.update((str(job.id), now) for job in jobs)
        assert queue.stats().ready == count
        dispatcher = scenario.start("dispatcher")
        workers = [scenario.start("worker", "-c", "10") for _ in range(worker_count)]
        began = time.time()
        keys = QueueKeys(scenario.queue_name)
        samples: dict[int, list[tuple[int, int]]] = {w.pid: [] for w in workers}  # (left, kib)
        deadline = time.monotonic() + pick(120.0, 900.0)
        while (left := int(scenario.client.llen(keys.ready))) > 0:
            assert time.monotonic() < deadline, f"backlog not drained: {left} left"
            assert all(w.alive() for w in workers), scenario.fleet.crashes()
            for worker in workers:
                samples[worker.pid].append((left, rss_kib(worker.pid)))
            time.sleep(0.2)  # the sampling period
        drained = time.time() - began
        end = scenario.end(queue, scheduled, workers=workers, dispatchers=[dispatcher])
    # Per worker: resident memory when a quarter of the backlog was done (imports, pools
    # and buffers are in place by then), and the highest value after that.
    rss: dict[int, tuple[int, int]] = {}
    for pid, series in samples.items():
        warm = [kib for left, kib in series if left <= 0.75 * count]
        if len(warm) >= 2:
            rss[pid] = (warm[0], max(warm))
    growth = {pid: high / base - 1 for pid, (base, high) in rss.items()}
    end.judge(
        "backlog, slow consumers",
        tasks=count,
        workers=worker_count,
        drain_s=round(drained, 1),
        tasks_per_s=round(count / drained),
        rss_kib_warm_and_max=sorted(rss.values()),
        rss_growth_max_pct=round(100 * max(growth.values(), default=0.0), 1),
    )
    counters = end.counters
    assert counters.get("completed") == count and end.verdict.duplicates == 0, counters
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
def test_worker_paused_past_its_lease_and_ttl_then_resumed(scenario: Scenario) -> None:
    """Two workers; now and then one (preferably busy) is frozen with SIGSTOP for longer
    than its lease and its worker TTL, then resumed with SIGCONT, while tasks come due
    throughout. The frozen worker is reaped and its tasks run elsewhere; when it wakes,
    its late outcomes are fenced, its pending BLMOVE may have caught a re-entered task,
    and it must carry on working. Proves: nothing lost, nothing early, every duplicate
    explained by a pause, no task started more than once more per pause it lived
    through (a late "lost" report must not cancel a newer attempt), and a consistent,
    empty queue at the end."""
    scenario.configure(PAUSE_ENV)
    rng, ledger = scenario.rng, scenario.ledger
    # Work to match the slots: the long run keeps one worker of two frozen much of the
    # time, so about 0.3 s of work a task on 2 x 10 slots leaves room to catch up.
    count, duration, concurrency = pick(100, 1500), pick(8.0, 60.0), pick(5, 10)
    dispatchers, workers = scenario.start_fleet(dispatchers=1, workers=2, concurrency=concurrency)
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
    with scenario.queue() as queue:
        queue.schedule_many(jobs)
        moment = begin + 1.0
        try:
            while moment < begin + duration - 2:
                pause_until(moment)
                victim = scenario.busy_worker(workers)
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
        end = scenario.end(
            queue,
            scheduled,
            workers=workers,
            dispatchers=dispatchers,
            timeout=duration + 120,
            faults=pauses,
            after=lease + ttl + 2,
        )

    # One pause costs a task at most one extra start: count the pauses each task's runs
    # lived through: its process frozen while the run was not done, or just before it
    # started (an attempt claimed before the pause can start as the process wakes, if the
    # pause fell between its lease check and its handler's first line).
    too_many = []
    for task_id, runs in ledger.runs_by_task().items():
        lived_through = {id(fault) for run in runs for fault in pauses if fault.hits(run, 1.0, 1.0)}
        if len(runs) > 1 + len(lived_through):
            too_many.append(f"{task_id}: {len(runs)} starts, {len(lived_through)} pause(s)")
    end.judge(
        "workers paused by SIGSTOP",
        tasks=count,
        seconds=duration,
        pauses=len(pauses),
        paused_s=[round(p.end - p.start, 1) for p in pauses],
    )
    fail_on(too_many)
    assert pauses, "no pause was injected"
    # Each paused worker was reaped while frozen, and came back to work.
    assert end.counters.get("reaped_workers", 0) >= 1, end.counters
    assert all(w.alive() is False and w.process.returncode == 0 for w in workers)
