"""Flow control under SIGKILL and SIGSTOP: a kill storm on a queue with a cap, per-key
concurrency, per-key rates and one key with limits of its own; a worker killed while it
holds a key's only slot; and one frozen past its lease while it holds it.

Both use the machinery of scenario.py (daemons as ``python -m duetime`` processes, the
handlers' ledger, its comparison with what was scheduled) and end with its verdict:
nothing lost, nothing early, a task run again only where a kill (or its failure on
purpose) explains it, ``queue.check() == []`` and nothing left in Redis but counters,
limits and spent rates. On top, from the ledger:

- Per limit key, and over the queue, attempts running at once never exceed the limit.
  An attempt runs from its handler's start to its end, or to the SIGKILL of its worker:
  its slot is held from its claim until its outcome is written or its lease is reaped,
  which covers that span, so the count is exact. (A worker that outlives its lease,
  hung rather than killed, may still run while its slot is given away: the documented
  bound, which the SIGSTOP test checks. In the others every worker that ends early ends
  by SIGKILL.)
- Per rate-limited key, the cost started within any span shorter than the rate's period
  never exceeds count + burst, as ``Rate`` promises (a start a moment late keeps its
  place in the schedule). A rate counts claims, by the
  server time each claim script was given; the handler records it (tests/apps.py:
  ``flow_ledger``), since a handler starts a varying delay after its claim, and two
  starts at a saturated rate can be closer than their claims were. The claims of
  attempts that were then killed count too: the rate counts starts, not successes.

A third test, with no process at all, pins down a fault the storm found: a dispatcher
whose estimate of the server's clock reads ahead of a worker's must not forget a spent
rate too soon (promote_due.lua drops spent rates a minute late).
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import redis

from duetime import Job, KeyLimits, Limits, ManualClock, Queue, Rate, Settings
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from duetime.store.redis.runner import SyncRunner
from tests.apps import FLOW_LEDGER
from tests.helpers import decoded, wait_until_sync
from tests.reliability.ledger import Fault, Ledger
from tests.reliability.scenario import (
    STORM_ENV,
    Daemon,
    Fleet,
    Scenario,
    leftovers,
    pause_until,
    pick,
    promotion_surplus,
)

FLOW_APP = "tests.apps:flow_app"
#: The claim time a handler records is the claim script's ``now`` before that was cut
#: to whole milliseconds (so up to 1 ms later), or a little more where the worker's
#: clock took a fresh sample between the claim and the handler's start.
CLAIM_CLOCK_SLACK_MS = 2.0
#: A task is killed or fails on purpose a few times at most; it must not run out.
MAX_ATTEMPTS = 10


# --- what ran when, from the ledger ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class FlowRecords:
    """The flow ledger (tests/apps.py: FLOW_LEDGER), by (task id, attempt)."""

    claimed_ms: dict[tuple[str, int], float]  # the claim script's now (server ms)
    failed_ms: dict[tuple[str, int], float]  # when a failing attempt ended (wall ms)


def read_flow_records(client: redis.Redis) -> FlowRecords:
    claimed: dict[tuple[str, int], float] = {}
    failed: dict[tuple[str, int], float] = {}
    for line in decoded(client.lrange(FLOW_LEDGER, 0, -1)):
        kind, task_id, attempt, _pid, at_ms = line.split()
        (claimed if kind == "claim" else failed)[task_id, int(attempt)] = float(at_ms)
    return FlowRecords(claimed, failed)


@dataclass(frozen=True, slots=True)
class Span:
    """One attempt's handler, from its start to its end (wall ms; inf: never ended)."""

    task_id: str
    attempt: int
    pid: int
    start_ms: float
    end_ms: float


def spans(ledger: Ledger, records: FlowRecords, killed_ms: Mapping[int, float]) -> list[Span]:
    """Every attempt the ledger saw start. One that neither finished nor failed ends when
    its process was killed (``killed_ms``: pid -> wall ms of the SIGKILL)."""
    found = []
    for (task_id, attempt), runs in ledger.attempts.items():
        for run in runs:
            end = run.done_ms
            if end is None:
                end = records.failed_ms.get((task_id, attempt))
            if end is None and run.pid in killed_ms:
                end = max(run.started_ms, killed_ms[run.pid])
            found.append(
                Span(task_id, attempt, run.pid, run.started_ms, math.inf if end is None else end)
            )
    return found


def peak(found: Iterable[Span]) -> tuple[int, float]:
    """The most spans open at once, and when that was first reached (wall ms). An end at
    the very moment of a start counts first: that slot was freed before it was taken."""
    events = sorted((at, step) for s in found for at, step in ((s.start_ms, 1), (s.end_ms, -1)))
    most, when, now = 0, 0.0, 0
    for at, step in events:
        now += step
        if now > most:
            most, when = now, at
    return most, when


def tightest(starts: Sequence[tuple[float, int]], amount: int) -> float:
    """The shortest time (ms) from the first to the last of starts (ms and cost) that
    together spend ``amount`` or more; inf when all of them spend less."""
    ordered = sorted(starts)
    shortest, total, first = math.inf, 0, 0
    for at, cost in ordered:
        total += cost
        while total - ordered[first][1] >= amount:
            total -= ordered[first][1]
            first += 1
        if total >= amount:
            shortest = min(shortest, at - ordered[first][0])
    return shortest


def remains(client: redis.Redis, queue: Queue, rate_keys: int) -> list[str]:
    """What is left in Redis once every task finished and every daemon stopped: nothing
    but counters, the limits (declared, kept), and at most one spent rate per rate limit
    (each forgotten by the next promotion after it lapses)."""
    keys = QueueKeys(queue.name)
    found = [
        key for key in leftovers(client, queue.name) if key not in (keys.limits, keys.rate_state)
    ]
    spent = client.zcard(keys.rate_state)
    if spent > rate_keys:
        found.append(f"{keys.rate_state} holds {spent} spent rates, for {rate_keys} limits")
    state = queue.flow()
    if state.due or state.running or state.groups:
        found.append(f"flow: {state.due} due, {state.running} running, {state.groups[:5]}")
    return found


# --- 1. a kill storm on a limited queue ------------------------------------------------

STORM_LIMITS = Limits(
    cap=10,
    each_key=KeyLimits(concurrency=2),
    keys={
        # 12/s: under a loaded machine a key's share of the cap runs about 16 a second,
        # so at 20/s the rates were not always reached and the storm proved nothing of them.
        "rate-a": KeyLimits(rate=Rate(12, per=1.0)),
        "rate-b": KeyLimits(rate=Rate(12, per=1.0)),
        "burst": KeyLimits(rate=Rate(20, per=1.0, burst=3)),
        "wide": KeyLimits(concurrency=4),  # its own concurrency, over each key's
    },
)


@dataclass(frozen=True, slots=True)
class KeyLoad:
    """The tasks one limit key (None: no key) is given in the storm."""

    key: str | None
    tasks: int  # in the short run; four times as many in the soak run
    work: tuple[float, float]  # seconds, uniform
    double_cost: float = 0.0  # share of tasks of cost 2 (never above the burst)


#: The rate-limited keys work briefly, so that their rate binds rather than their two
#: slots; the others work longer, so that their slots and the queue's cap bind.
STORM_LOADS = (
    KeyLoad("rate-a", 180, (0.002, 0.02)),
    KeyLoad("rate-b", 180, (0.002, 0.02)),
    KeyLoad("burst", 140, (0.002, 0.02), double_cost=0.2),
    KeyLoad("wide", 300, (0.02, 0.12)),
    *(KeyLoad(f"plain-{n}", 250, (0.01, 0.08)) for n in range(4)),
    KeyLoad(None, 150, (0.01, 0.05)),
)


@dataclass(slots=True)
class StormPlan:
    """The storm's tasks and what the test must remember of each."""

    jobs: list[Job]
    key_of: dict[str, str | None]
    cost_of: dict[str, int]
    failing: set[str]  # fail their first attempt on purpose

    @property
    def run_at(self) -> dict[str, float]:
        return {str(job.id): float(job.at) for job in self.jobs}  # type: ignore[arg-type]


def storm_plan(rng: random.Random, begin: float, spread: float) -> StormPlan:
    """Over a third of each key's tasks due at ``begin``, so that limits bind from the
    start, the rest delayed, spread over ``spread`` seconds; priorities from -5 to 5; one
    task in 25 fails its first attempt."""
    plan = StormPlan([], {}, {}, set())
    for load in STORM_LOADS:
        for n in range(pick(load.tasks, 4 * load.tasks)):
            task_id = f"{load.key or 'none'}-{n}"
            fail_first = rng.random() < 0.04
            cost = 2 if rng.random() < load.double_cost else 1
            at = begin if rng.random() < 0.35 else begin + rng.uniform(0, spread)
            data = {"work": round(rng.uniform(*load.work), 4), "fail_first": fail_first}
            plan.jobs.append(
                Job(data, at=at, task="flow_ledger", id=task_id, max_attempts=MAX_ATTEMPTS,
                    priority=rng.randint(-5, 5), limit_key=load.key, cost=cost)
            )  # fmt: skip
            plan.key_of[task_id], plan.cost_of[task_id] = load.key, cost
            if fail_first:
                plan.failing.add(task_id)
    rng.shuffle(plan.jobs)
    return plan


def rate_problem(
    key: str, rate: Rate, plan: StormPlan, found: Sequence[Span], records: FlowRecords
) -> tuple[str | None, str, bool]:
    """The rate of ``key`` checked against the claims of its attempts (``found``): what
    broke it, if anything; the figure (how fast ``bound + 1`` were claimed, and started);
    and whether the rate was reached (``bound - 1`` claimed in less than its period)."""
    bound = rate.count + rate.burst
    claims = [
        (records.claimed_ms[s.task_id, s.attempt], plan.cost_of[s.task_id])
        for s in found
        if (s.task_id, s.attempt) in records.claimed_ms
    ]
    fastest = tightest(claims, bound + 1)
    by_start = tightest([(s.start_ms, plan.cost_of[s.task_id]) for s in found], bound + 1)
    figure = f"{bound + 1} claimed in {fastest:.1f} ms at the least, started in {by_start:.1f}"
    problem = None
    if fastest < rate.period_ms - CLAIM_CLOCK_SLACK_MS:
        problem = f"key {key}: {bound + 1} started in {fastest:.1f} ms, under {rate}"
    # Reached: as many claimed within one period as strict GCRA lets through.
    return problem, figure, tightest(claims, bound - 1) < rate.period_ms


def limit_problems(
    plan: StormPlan, found: Sequence[Span], records: FlowRecords
) -> tuple[list[str], dict[str, object], set[str]]:
    """Every limit of STORM_LIMITS checked against what ran: what broke one, the figures
    (the peak of each key and of the queue, how fast each rate let its most start), and
    the limits that were reached ("cap", "concurrency:<key>", "rate:<key>")."""
    problems: list[str] = []
    figures: dict[str, object] = {}
    reached: set[str] = set()
    by_key: dict[str | None, list[Span]] = {}
    for span in found:
        by_key.setdefault(plan.key_of[span.task_id], []).append(span)
    never_ended = [s for s in found if s.end_ms == math.inf]
    if never_ended:
        problems.append(f"attempts that never ended, in no killed worker: {never_ended[:5]}")
    most, when = peak(found)
    figures["queue_peak"] = most
    if most == STORM_LIMITS.cap:
        reached.add("cap")
    if STORM_LIMITS.cap is not None and most > STORM_LIMITS.cap:
        problems.append(f"{most} attempts ran at once at {when / 1000:.3f}, over the cap")
    for key, spans_of_key in by_key.items():
        if key is None:
            continue
        limits = STORM_LIMITS.keys.get(key, KeyLimits())
        allowed = limits.concurrency or STORM_LIMITS.each_key.concurrency
        most, when = peak(spans_of_key)
        figures[f"peak:{key}"] = f"{most}/{allowed}"
        if most == allowed:
            reached.add(f"concurrency:{key}")
        if allowed is not None and most > allowed:
            problems.append(f"key {key}: {most} attempts ran at once at {when / 1000:.3f}")
        if limits.rate is not None:
            problem, figures[f"rate:{key}"], binding = rate_problem(
                key, limits.rate, plan, spans_of_key, records
            )
            problems += [problem] if problem else []
            if binding:
                reached.add(f"rate:{key}")
    return problems, figures, reached


def test_kill_storm_on_a_limited_queue(scenario: Scenario) -> None:
    """Three workers and two dispatchers; every ~1.7 s one of them (three times in four a
    worker, preferably one running tasks) is killed with SIGKILL and restarted at once,
    while some 2,000 tasks come due (8,000 in the soak run) over eight limit keys and
    none, with priorities, one in 25 failing once. Proves that no task is lost or starts
    early, that no limit is passed while killed workers' slots wait to be reaped, and
    that the queue ends consistent and empty, its flow control with nothing due or
    running."""
    scenario.configure(STORM_ENV)
    rng, ledger, fleet = scenario.rng, scenario.ledger, scenario.fleet
    spread = pick(8.0, 32.0)
    with scenario.queue() as queue:
        queue.set_limits(STORM_LIMITS)
        dispatchers, workers = scenario.start_fleet(
            dispatchers=2, workers=3, concurrency=6, app=FLOW_APP
        )
        begin = time.time() + 1.0
        plan = storm_plan(rng, begin, spread)
        queue.schedule_many(plan.jobs)
        killed_ms: dict[int, float] = {}
        faults: list[Fault] = []
        dispatcher_kills = 0
        moment = begin + rng.uniform(1.2, 2.2)
        # Kills go on while tasks come due, and after, until nine in ten are done.
        while moment < begin + spread or (
            len(ledger.done) < 0.9 * len(plan.jobs) and moment < begin + spread + 60
        ):
            pause_until(moment)
            ledger.refresh()
            if (len(killed_ms) + dispatcher_kills) % 4 == 3:
                fleet.replace(rng.choice(dispatchers), dispatchers)
                dispatcher_kills += 1
            else:
                victim = scenario.busy_worker(workers)
                at = fleet.replace(victim, workers)
                killed_ms[victim.pid] = at * 1000
                faults.append(Fault("kill -9", at, at, frozenset({victim.pid})))
            moment += rng.uniform(1.2, 2.2)
        on_purpose = Fault("fails once on purpose", 0.0, math.inf, task_ids=frozenset(plan.failing))
        rate_keys = sum(1 for limits in STORM_LIMITS.keys.values() if limits.rate is not None)
        end = scenario.end(
            queue,
            plan.run_at,
            workers=workers,
            dispatchers=dispatchers,
            timeout=spread + 90,
            faults=[*faults, on_purpose],
            left_behind=lambda: remains(scenario.client, queue, rate_keys),
        )
    records = read_flow_records(scenario.client)
    found = spans(ledger, records, killed_ms)
    broken, figures, reached = limit_problems(plan, found, records)
    interrupted = [s for s in found if s.pid in killed_ms and s.end_ms == killed_ms[s.pid]]
    end.problems += broken
    end.judge(
        "flow control: kill storm on a limited queue",
        kind=scenario.server.kind,
        tasks=len(plan.jobs),
        seconds=spread,
        worker_kills=len(killed_ms),
        dispatcher_kills=dispatcher_kills,
        interrupted=len(interrupted),
        **figures,
    )
    counters = end.counters
    assert counters.get("completed") == len(plan.jobs), counters
    # A task taken back from a killed worker goes straight back among the due at its rank
    # (issue #41, point 9), never through scheduled: every other entry is promoted once.
    re_entered = counters.get("reaped_tasks", 0) + counters.get("expired_leases", 0)
    assert promotion_surplus(counters) == -re_entered, counters
    assert counters.get("reaped_workers", 0) <= len(killed_ms), counters
    # Each kind of limit held the queue back at some point: else the scenario proved
    # nothing of it.
    assert "cap" in reached, figures
    assert any(limit.startswith("concurrency:") for limit in reached), figures
    assert any(limit.startswith("rate:") for limit in reached), figures
    assert interrupted, "no kill interrupted a running task: the scenario proved nothing"


# --- 2. a worker killed while it holds a key's only slot -------------------------------

SOLO_LIMITS = Limits(each_key=KeyLimits(concurrency=2), keys={"solo": KeyLimits(concurrency=1)})


@dataclass(frozen=True, slots=True)
class SoloKill:
    """One kill of the worker running the solo key's task, and what followed."""

    pid: int
    task_id: str
    killed_ms: float  # wall ms
    reap_not_before_ms: float  # server ms: no reap can come earlier (lease or worker TTL)
    held: tuple[int, int]  # the key's (running, due) seen right after the kill
    next_start_ms: float  # the key's first start after the kill (wall ms)
    reaped: int  # reaps (of a worker or a lease) between the kill and that start


def solo_holder(
    ledger: Ledger, workers: Sequence[Daemon], solo: set[str]
) -> tuple[Daemon, str] | None:
    """A live worker running a solo task, and that task."""
    ledger.refresh()
    for worker in workers:
        running = ledger.in_flight(worker.pid) & solo
        if running:
            return worker, min(running)
    return None


def start_solo_fleet(scenario: Scenario, queue: Queue) -> tuple[list[Daemon], list[Daemon]]:
    """SOLO_LIMITS on ``queue``, a dispatcher and two workers (4 slots each), registered."""
    queue.set_limits(SOLO_LIMITS)
    return scenario.start_fleet(dispatchers=1, workers=2, concurrency=4, app=FLOW_APP)


def wait_for_solo_holder(
    ledger: Ledger, workers: Sequence[Daemon], solo: set[str]
) -> tuple[Daemon, str]:
    """solo_holder, once there is one."""
    holder: tuple[Daemon, str] | None = None

    def found() -> bool:
        nonlocal holder
        holder = solo_holder(ledger, workers, solo)
        return holder is not None

    wait_until_sync(found, timeout=30, what="a live worker running a solo task")
    assert holder is not None
    return holder


def reap_not_before(
    client: redis.Redis, queue: str, pid: int, task_id: str, ttl_ms: float
) -> float:
    """The earliest server time (ms) a dispatcher may take back the attempt of ``task_id``
    that the worker of process ``pid`` holds: when its lease runs out, or when the worker
    has been silent for its TTL, whichever comes first. Read after the kill, so neither
    moves again."""
    keys = QueueKeys(queue)
    [worker] = [name for name in decoded(client.zrange(keys.workers, 0, -1)) if f".{pid}." in name]
    deadline = client.zscore(keys.leases, f"{worker}|{task_id}")
    beat = client.zscore(keys.workers, worker)
    assert deadline is not None and beat is not None, (worker, deadline, beat)
    return min(deadline, beat + ttl_ms)


def live_workers(client: redis.Redis, queue: Queue) -> list[str]:
    return decoded(client.zrange(QueueKeys(queue.name).workers, 0, -1))


def reaps(queue: Queue) -> int:
    counters = queue.stats().counters
    return counters.get("reaped_workers", 0) + counters.get("expired_leases", 0)


def first_start_after(ledger: Ledger, task_ids: set[str], after_ms: float) -> float | None:
    """The earliest start of any of ``task_ids`` after ``after_ms`` (wall ms), if any."""
    ledger.refresh()
    starts = [
        run.started_ms
        for (task_id, _), runs in ledger.attempts.items()
        if task_id in task_ids
        for run in runs
        if run.started_ms > after_ms
    ]
    return min(starts, default=None)


def kill_solo_holder(
    fleet: Fleet, ledger: Ledger, workers: list[Daemon], solo: set[str]
) -> tuple[Daemon, str, float]:
    """Kill a worker running a solo task, once one is, and start another in its place.
    Returns the victim, its solo task and the wall time of the kill."""
    victim, task_id = wait_for_solo_holder(ledger, workers, solo)
    return victim, task_id, fleet.replace(victim, workers)


def watch_solo_slot(
    queue: Queue, client: redis.Redis, ledger: Ledger, solo: set[str], victim: int,
    task_id: str, killed_at: float,
) -> SoloKill | None:  # fmt: skip
    """After the kill of process ``victim`` running ``task_id``: what holds the solo key,
    then its next start. None when the task had just finished as it was killed (no slot
    was held then): once that worker is reaped, so that its reap is not counted with the
    next kill's."""
    reaps_before = reaps(queue)  # the victim is reaped a worker TTL after the kill
    ledger.refresh()
    if task_id not in ledger.in_flight(victim):
        wait_until_sync(
            lambda: not any(f".{victim}." in name for name in live_workers(client, queue)),
            timeout=30,
            what=f"killed worker {victim} reaped",
        )
        return None
    ttl_ms = float(STORM_ENV["DUETIME_WORKER_TTL"]) * 1000
    not_before = reap_not_before(client, queue.name, victim, task_id, ttl_ms)
    [group] = [g for g in queue.flow().groups if g.key == "solo"]
    killed_ms = killed_at * 1000
    wait_until_sync(
        lambda: first_start_after(ledger, solo, killed_ms) is not None,
        timeout=30,
        what="the solo key's next start after the kill",
    )
    next_start = first_start_after(ledger, solo, killed_ms)
    assert next_start is not None
    held = (group.running, group.due)
    reaped = reaps(queue) - reaps_before
    return SoloKill(victim, task_id, killed_ms, not_before, held, next_start, reaped)


def test_a_worker_killed_holding_a_keys_only_slot(scenario: Scenario) -> None:
    """The key "solo" may run one task at a time, while other keys keep two workers
    busy. Three times (eight in the soak run) the worker running solo's task is killed
    with SIGKILL and restarted at once. Each time, the dead attempt keeps solo's only
    slot, with solo's other tasks waiting: solo's next task starts only once a
    dispatcher may take that lease back (its deadline, or the worker's last heartbeat
    plus its TTL), after one reap; two solo tasks never run at once, and every task
    completes."""
    scenario.configure(STORM_ENV)
    rng, ledger = scenario.rng, scenario.ledger
    cycles, spread = pick(3, 8), pick(8.0, 25.0)
    with scenario.queue() as queue:
        dispatchers, workers = start_solo_fleet(scenario, queue)
        begin = time.time() + 0.5
        solo_jobs = [
            Job({"work": 0.3}, at=begin, task="flow_ledger", id=f"solo-{n}",
                max_attempts=MAX_ATTEMPTS, priority=rng.randint(-2, 2), limit_key="solo")
            for n in range(pick(20, 50))
        ]  # fmt: skip
        other_jobs = [
            Job({"work": round(rng.uniform(0.05, 0.2), 3)}, at=begin + rng.uniform(0, spread),
                task="flow_ledger", id=f"other-{n}", max_attempts=MAX_ATTEMPTS,
                limit_key=f"other-{n % 3}")
            for n in range(pick(150, 450))
        ]  # fmt: skip
        jobs = [*solo_jobs, *other_jobs]
        queue.schedule_many(jobs)
        solo = {str(job.id) for job in solo_jobs}
        kills: list[SoloKill] = []
        faults: list[Fault] = []
        killed_ms: dict[int, float] = {}
        pause_until(begin)
        while len(kills) < cycles:
            victim, task_id, at = kill_solo_holder(scenario.fleet, ledger, workers, solo)
            killed_ms[victim.pid] = at * 1000
            faults.append(Fault("kill -9", at, at, frozenset({victim.pid})))
            kill = watch_solo_slot(queue, scenario.client, ledger, solo, victim.pid, task_id, at)
            if kill is not None:
                kills.append(kill)
            pause_until(time.time() + rng.uniform(0.2, 1.0))
        run_at = {str(job.id): float(job.at) for job in jobs}  # type: ignore[arg-type]
        end = scenario.end(
            queue,
            run_at,
            workers=workers,
            dispatchers=dispatchers,
            timeout=spread + 60,
            faults=faults,
            left_behind=lambda: remains(scenario.client, queue, rate_keys=0),
        )
    records = read_flow_records(scenario.client)
    found = [s for s in spans(ledger, records, killed_ms) if s.task_id in solo]
    most, when = peak(found)
    problems = end.problems
    if most > 1:
        problems.append(f"{most} solo tasks ran at once at {when / 1000:.3f}")
    for kill in kills:
        if kill.held[0] != 1 or kill.held[1] == 0:
            problems.append(f"solo's (running, due) right after the kill: {kill.held} ({kill})")
        if kill.next_start_ms < kill.reap_not_before_ms:
            problems.append(f"solo's next task started before its slot could be reaped: {kill}")
        if kill.reaped != 1:
            problems.append(f"{kill.reaped} reaps between the kill and solo's next start: {kill}")
    end.judge(
        "flow control: a worker killed holding a key's only slot",
        kind=scenario.server.kind,
        tasks=len(jobs),
        kills=len(faults),
        kills_of_the_holder=len(kills),
        next_start_after_kill_s=[round((k.next_start_ms - k.killed_ms) / 1000, 2) for k in kills],
        next_start_after_earliest_reap_ms=[
            round(k.next_start_ms - k.reap_not_before_ms, 1) for k in kills
        ],
    )
    assert end.counters.get("completed") == len(jobs), end.counters


# --- 2b. a worker paused past its lease while it holds a key's only slot -----------------


def pause_solo_holder(
    ledger: Ledger, workers: list[Daemon], solo: set[str], frozen_for: float
) -> tuple[Fault, tuple[str, int]]:
    """Freeze a worker running a solo task with SIGSTOP for ``frozen_for`` seconds (past
    its lease and its TTL), then resume it. Returns the fault and the frozen attempt."""
    while True:
        victim, task_id = wait_for_solo_holder(ledger, workers, solo)
        start = time.time()
        victim.process.send_signal(signal.SIGSTOP)
        ledger.refresh()
        if task_id in ledger.in_flight(victim.pid):
            break
        # Its attempt ended between the look and the stop (a loaded machine): a frozen
        # worker holding nothing proves nothing, so let it go and take the next holder.
        victim.process.send_signal(signal.SIGCONT)
    try:
        pause_until(start + frozen_for)
    finally:
        victim.process.send_signal(signal.SIGCONT)
    attempt = max(a for (t, a), runs in ledger.attempts.items()
                  if t == task_id and any(r.pid == victim.pid for r in runs))  # fmt: skip
    return Fault("SIGSTOP", start, time.time(), frozenset({victim.pid})), (task_id, attempt)


def test_a_worker_paused_past_its_lease_overlaps_a_keys_limit_by_its_own_attempt_only(
    scenario: Scenario,
) -> None:
    """The documented bound of a concurrency limit (docs/flow.md): a worker that is hung,
    not killed, past its lease gives its slot away while its handler may still run, and
    that is the only way a key runs more than its limit. The key "solo" may run one task
    at a time; twice (five times in the soak run) the worker running solo's task is
    frozen with SIGSTOP past its lease and its TTL, then resumed, so that its handler
    finishes after the next solo task started. Leaving out the frozen attempts, solo
    never runs two at once; with them, never more than one more; each frozen attempt's
    outcome is refused (fenced) and its task runs again; nothing is lost or early."""
    scenario.configure(STORM_ENV)
    rng, ledger = scenario.rng, scenario.ledger
    lease = float(STORM_ENV["DUETIME_LEASE_DURATION"])
    cycles = pick(2, 5)
    with scenario.queue() as queue:
        dispatchers, workers = start_solo_fleet(scenario, queue)
        begin = time.time() + 0.5
        jobs = [
            Job({"work": 0.6}, at=begin, task="flow_ledger", id=f"solo-{n}",
                max_attempts=MAX_ATTEMPTS, limit_key="solo")
            for n in range(pick(12, 30))
        ] + [
            Job({"work": round(rng.uniform(0.05, 0.2), 3)}, at=begin + rng.uniform(0, 8.0),
                task="flow_ledger", id=f"other-{n}", max_attempts=MAX_ATTEMPTS,
                limit_key=f"other-{n % 3}")
            for n in range(pick(100, 250))
        ]  # fmt: skip
        queue.schedule_many(jobs)
        solo = {str(job.id) for job in jobs if job.limit_key == "solo"}
        faults: list[Fault] = []
        frozen: list[tuple[str, int]] = []
        pause_until(begin)
        try:
            for _ in range(cycles):
                fault, attempt = pause_solo_holder(ledger, workers, solo, lease + 1.5)
                faults.append(fault)
                frozen.append(attempt)
                pause_until(time.time() + rng.uniform(0.5, 1.5))
        finally:
            for worker in workers:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGCONT)
        run_at = {str(job.id): float(job.at) for job in jobs}  # type: ignore[arg-type]
        end = scenario.end(
            queue,
            run_at,
            workers=workers,
            dispatchers=dispatchers,
            faults=faults,
            after=lease + 4.0,
            left_behind=lambda: remains(scenario.client, queue, rate_keys=0),
        )
    found = [s for s in spans(ledger, read_flow_records(scenario.client), {}) if s.task_id in solo]
    stale = [s for s in found if (s.task_id, s.attempt) in frozen]
    most_others, when = peak(s for s in found if s not in stale)
    most, _ = peak(found)
    problems = end.problems
    if most_others > 1:
        problems.append(f"{most_others} solo tasks ran at once at {when / 1000:.3f}")
    if most > 2:
        problems.append(f"{most} solo tasks ran at once, frozen attempts included")
    overlapped = [s for s in stale if any(o.start_ms < s.end_ms and o.start_ms > s.start_ms
                                          for o in found if o not in stale)]  # fmt: skip
    runs = ledger.runs_by_task()
    for task_id, _ in frozen:
        if len(runs.get(task_id, [])) < 2:
            problems.append(f"{task_id} was frozen past its lease but did not run again")
    end.judge(
        "flow control: a worker paused past its lease holding a key's only slot",
        kind=scenario.server.kind,
        tasks=len(jobs),
        pauses=len(faults),
        frozen_attempts_overlapped_by_the_next=len(overlapped),
        most_solo_at_once=most,
    )
    assert overlapped, "no frozen attempt ran on beside the next solo task: nothing tested"
    assert end.counters.get("fenced", 0) >= len(overlapped), end.counters


# --- 3. a rate limit between clocks that disagree --------------------------------------

T0 = 1_800_000_000_000  # ms; the server time the clocks are set to


def test_a_dispatcher_clock_ahead_of_a_workers_does_not_lift_a_rate_limit(
    redis_url: str, queue_name: str
) -> None:
    """Each process estimates the server's clock, trailing it by up to one sample's round
    trip, so a dispatcher's reads a few ms ahead of a worker's. A key may start one task a
    second: after a start at T0, a dispatcher's pass at its T0 + 1 s must leave the spent
    rate in place for a worker whose clock reads T0 + 995 ms."""
    keys = QueueKeys(queue_name)
    worker_clock, dispatcher_clock = ManualClock(T0), ManualClock(T0 + 1000)
    worker = QueueOperations(keys, worker_clock)
    dispatcher = QueueOperations(keys, dispatcher_clock)
    runner = SyncRunner(redis_url, Settings())
    with Queue(queue_name, redis_url, clock=worker_clock) as queue:
        try:
            queue.set_limits(Limits(each_key=KeyLimits(rate=Rate(1, per=1.0))))
            queue.schedule_many([Job(n, at=T0 / 1000, limit_key="k") for n in range(2)])
            runner.run(worker.dispatcher.promote_due(100))
            assert len(runner.run(worker.worker.claim("w1", 60_000, 2)) or []) == 1
            runner.run(dispatcher.dispatcher.promote_due(100))
            worker_clock.set(T0 + 995)
            started = runner.run(worker.worker.claim("w2", 60_000, 2)) or []
        finally:
            runner.close()
    assert started == [], "a second start 995 ms after the first, under 1/s"
