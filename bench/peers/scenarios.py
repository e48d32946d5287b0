"""The six scenarios. Each function runs ONE measurement of one system (or, for recovery,
of every system at once) and returns a JSON-ready dict; ``suite.py`` repeats, interleaves
and summarises them."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import percentile

from peers.common import WARM_UP, JobSpec, Stamp, count_stamps, read_stamps
from peers.harness import ChildError, Harness, Proc, System, warn

RSS_CAP = 8 * 2**30  # a worker holding a backlog in memory is stopped past this


@dataclass(frozen=True, slots=True)
class Sizes:
    punctuality_tasks: int
    punctuality_spread: float  # run-at times spread over this many seconds
    lead: float  # seconds from "producer ready" to the first possible run-at
    throughput_tasks: int
    enqueue_single: int
    enqueue_bulk: int
    memory_tasks: int
    scale_levels: tuple[int, ...]
    scale_due: int
    recovery_cap: float
    grace: float  # how long after the last run-at a task may still start before "lost"
    throughput_cap: float  # seconds of work per throughput run; the rate is from what ran
    fill_budget: float  # a scale level whose backlog would take longer to build is skipped
    scale_grace: float  # how long after its due instant a burst task may start before "lost"


FULL = Sizes(2_000, 5.0, 4.0, 20_000, 5_000, 20_000, 100_000,
             (10_000, 100_000, 1_000_000, 10_000_000), 2_000, 120.0, 30.0, 20.0, 600.0,
             15.0)  # fmt: skip
QUICK = Sizes(500, 2.0, 3.0, 5_000, 1_000, 5_000, 20_000,
              (10_000, 100_000), 500, 60.0, 15.0, 15.0, 60.0, 10.0)  # fmt: skip


def lateness_summary(late_ms: list[float], expected: int) -> dict[str, Any]:
    if not late_ms:
        return {"p50": None, "p90": None, "p99": None, "max": None, "min": None,
                "early": 0, "lost": expected, "ran": 0}  # fmt: skip
    return {
        "p50": percentile(late_ms, 50),
        "p90": percentile(late_ms, 90),
        "p99": percentile(late_ms, 99),
        "max": max(late_ms),
        "min": min(late_ms),
        "early": sum(1 for x in late_ms if x < 0),
        "lost": expected - len(late_ms),
        "ran": len(late_ms),
    }


def first_starts(stamps: list[Stamp]) -> tuple[dict[int, float], int]:
    """First start per task index (warm-up left out), and how many runs were repeats."""
    first: dict[int, float] = {}
    repeats = 0
    for s in stamps:
        if s.index == WARM_UP:
            continue
        if s.index in first:
            repeats += 1
            first[s.index] = min(first[s.index], s.started)
        else:
            first[s.index] = s.started
    return first, repeats


def warm_up(h: Harness, system: System, stamps: Any, procs: list[Proc], cap: float) -> float:
    """Run one task through the started workers: they are up once it has run. Returns
    the seconds it took, or raises ChildError."""
    began = time.time()
    h.produce(system, JobSpec(1, "now", first_index=WARM_UP), "single", timeout=cap)
    why = h.wait_stamps(stamps, 1, began + cap, procs)
    if why:
        raise ChildError(f"warm-up task did not run: {why}")
    return time.time() - began


# --- 1. punctuality ------------------------------------------------------------------


def punctuality(h: Harness, system: System, sizes: Sizes, seed: int) -> dict[str, Any]:
    h.server.reset()
    stamps = h.stamp_file(f"{system.name}-punctuality")
    procs = h.start(system, "punctual", stamps)
    try:
        warm = warm_up(h, system, stamps, procs, 60.0)
        spec = JobSpec(sizes.punctuality_tasks, "spread", sizes.lead,
                       sizes.punctuality_spread, seed, relative=True)  # fmt: skip
        produced = h.produce(system, spec, system.fill_mode())
        run_at = {i: at for i, at in spec.items(produced["start"]) if at is not None}
        scheduled_by = produced["began"] + produced["seconds"]
        if scheduled_by > produced["start"]:
            warn(f"{system.name}: scheduling ended {scheduled_by - produced['start']:.2f} s "
                 "after the first run-at")  # fmt: skip
        deadline = produced["start"] + sizes.punctuality_spread + sizes.grace
        why = h.wait_stamps(stamps, len(run_at) + 1, deadline, procs)
    finally:
        h.stop(procs)
    first, repeats = first_starts(read_stamps(stamps))
    # A task whose run-at passed before the producer had finished scheduling (a slow
    # client on a busy machine) is left out: its lateness would measure the enqueue rate,
    # which has a scenario of its own.
    counted = {i: at for i, at in run_at.items() if at >= scheduled_by}
    late = [(first[i] - at) * 1000 for i, at in counted.items() if i in first]
    return {
        **lateness_summary(late, len(counted)),
        "left_out_scheduled_late": len(run_at) - len(counted),
        "duplicate_runs": repeats,
        "lateness_ms": sorted(late),
        "warm_up_s": warm,
        "scheduling_s": produced["seconds"],
        "scheduling_mode": system.fill_mode(),
        "scheduling_margin_s": produced["start"] - scheduled_by,
        "stopped_early": why if why != "timed out" else "",
    }


# --- 2. throughput -------------------------------------------------------------------


def throughput(h: Harness, system: System, sizes: Sizes, profile: str) -> dict[str, Any]:
    h.server.reset()
    n = sizes.throughput_tasks
    stamps = h.stamp_file(f"{system.name}-throughput-{profile}")
    produced = h.produce(system, JobSpec(n, "now"), system.fill_mode())
    redis_cpu = h.server.cpu_seconds()
    h.server.redis.config_resetstat()
    launched = time.time()
    procs = h.start(system, profile, stamps)
    try:
        # Up to 10 s of start-up, then at most throughput_cap seconds of work.
        why = h.wait_stamps(stamps, n, launched + 10 + sizes.throughput_cap, procs)
    finally:
        redis_cpu = h.server.cpu_seconds() - redis_cpu
        commands = h.server.command_stats()
        h.stop(procs)
    starts = sorted(s.started for s in read_stamps(stamps))
    done = len(starts)
    span = starts[-1] - starts[0] if done > 1 else float("nan")
    return {
        "tasks": n,
        "completed": done,
        # Steady state: from the first task's start to the last one's (worker start-up,
        # which for some systems takes seconds, is left out)...
        "per_second": (done - 1) / span if done > 1 and span > 0 else 0.0,
        # ...and from launching the worker processes, start-up included.
        "per_second_from_launch": done / (starts[-1] - launched) if done else 0.0,
        "fill_s": produced["seconds"],
        "redis_cpu_s": redis_cpu,
        "redis_calls_per_task": sum(v["calls"] for v in commands.values()) / max(done, 1),
        "command_stats": dict(list(commands.items())[:8]),
        "stopped_early": why,
    }


# --- 3. enqueue rate -----------------------------------------------------------------


def enqueue(h: Harness, system: System, sizes: Sizes) -> dict[str, Any]:
    h.server.reset()
    later = 3600.0
    spec = JobSpec(sizes.enqueue_single, "later", later, relative=True)
    single = h.produce(system, spec, "single")
    # The same number of bare LPUSH calls through this system's redis-py, right after:
    # no single call acknowledged by the server can be faster from this process.
    roundtrip = h.produce(system, spec, "roundtrip")
    result: dict[str, Any] = {
        "single_tasks": sizes.enqueue_single,
        "single_per_second": sizes.enqueue_single / single["seconds"],
        "roundtrip_per_second": sizes.enqueue_single / roundtrip["seconds"],
        "bulk_tasks": None,
        "bulk_per_second": None,
    }
    if system.bulk:
        h.server.reset()
        bulk = h.produce(system, JobSpec(sizes.enqueue_bulk, "later", later, relative=True),
                         "bulk")  # fmt: skip
        result["bulk_tasks"] = sizes.enqueue_bulk
        result["bulk_per_second"] = sizes.enqueue_bulk / bulk["seconds"]
    return result


# --- 4. memory -----------------------------------------------------------------------


def used_memory(h: Harness) -> int:
    return int(h.server.redis.info("memory")["used_memory"])


def memory(h: Harness, system: System, sizes: Sizes) -> dict[str, Any]:
    h.server.reset()
    before = used_memory(h)
    n = sizes.memory_tasks
    produced = h.produce(system, JobSpec(n, "later", 3600.0, relative=True), system.fill_mode())
    after = used_memory(h)
    return {
        "tasks": n,
        "bytes_per_task": (after - before) / n,
        "keys": int(h.server.redis.dbsize()),
        "fill_s": produced["seconds"],
    }


# --- 5. scale ------------------------------------------------------------------------


def scale_level(
    h: Harness, system: System, sizes: Sizes, backlog: int, repeats: int
) -> dict[str, Any]:
    """A backlog of ``backlog`` tasks an hour out, then ``repeats`` bursts of
    ``scale_due`` tasks all due at one instant, each measured on its own."""
    h.server.reset()
    produced = h.produce(system, JobSpec(backlog, "later", 3600.0, relative=True),
                         system.fill_mode(), timeout=3600)  # fmt: skip
    memory_after_fill = used_memory(h)
    stamps = h.stamp_file(f"{system.name}-scale-{backlog}")
    procs = h.start(system, "punctual", stamps)
    runs: list[dict[str, Any]] = []
    level: dict[str, Any] = {
        "backlog": backlog,
        "fill_s": produced["seconds"],
        "fill_mode": system.fill_mode(),
        "used_memory": memory_after_fill,
        "runs": runs,
    }
    try:
        try:
            level["warm_up_s"] = warm_up(h, system, stamps, procs, 60.0)
        except ChildError as error:
            level["warm_up_s"] = None
            level["warm_up_problem"] = str(error)
            warn(f"{system.name} backlog {backlog:,}: {error}")
        seen = count_stamps(stamps)
        for r in range(repeats):
            n = sizes.scale_due
            spec = JobSpec(n, "burst", sizes.lead, first_index=r * n, relative=True)
            burst = h.produce(system, spec, system.fill_mode())
            due = burst["start"]
            why = h.wait_stamps(stamps, seen + n, due + sizes.scale_grace, procs, RSS_CAP)
            all_stamps = read_stamps(stamps)
            seen = len(all_stamps)
            first, _ = first_starts(all_stamps)
            starts = [first[i] for i in range(r * n, (r + 1) * n) if i in first]
            late = [(s - due) * 1000 for s in starts]
            summary = lateness_summary(late, n)
            last = max(starts, default=due)
            summary["per_second"] = len(starts) / (last - due) if last > due else None
            summary["stopped_early"] = why if why != "timed out" else ""
            runs.append(summary)
            if why and why != "timed out":
                level["problem"] = why
                break
    finally:
        h.stop(procs)
    return level


# --- 6. recovery ---------------------------------------------------------------------


@dataclass(slots=True)
class RecoveryRun:
    system: System
    procs: list[Proc]
    stamps: Any
    killed_at: float | None = None
    killed_role: str = ""
    seconds: float | None = None
    problem: str = ""


def recovery(h: Harness, systems: list[System], cap: float) -> dict[str, dict[str, Any]]:
    """Every system at once (their keys do not overlap): two workers each, one task that
    runs for a few seconds; the worker running it is killed (SIGKILL to its process group)
    and the time until the task starts again anywhere is measured, up to ``cap``."""
    h.server.reset()
    runs = []
    for system in systems:
        stamps = h.stamp_file(f"{system.name}-recovery")
        runs.append(RecoveryRun(system, h.start(system, "recovery", stamps, workers=2), stamps))
    try:
        for run in runs:  # warm up one after the other: start-ups overlap anyway
            try:
                warm_up(h, run.system, run.stamps, run.procs, 90.0)
            except ChildError as error:
                run.problem = str(error)
        producers = {
            run.system.name: h.produce_start(run.system, JobSpec(1, "now"), "single")
            for run in runs
            if not run.problem
        }
        for run in runs:
            if run.system.name in producers:
                try:
                    h.produce_wait(producers[run.system.name], 60)
                except ChildError as error:
                    run.problem = str(error)
        started = time.time()
        while time.time() < started + cap + 60:
            pending = False
            for run in runs:
                if run.problem or run.seconds is not None:
                    continue
                task_runs = [s for s in read_stamps(run.stamps) if s.index == 0]
                if run.killed_at is None:
                    if task_runs:
                        kill_runner(run, task_runs[0])
                    elif time.time() > started + 60:
                        run.problem = "the task never started"
                        continue
                    pending = True
                elif len(task_runs) > 1:
                    run.seconds = task_runs[1].started - run.killed_at
                elif time.time() > run.killed_at + cap:
                    run.problem = f"> {cap:g} s"
                else:
                    pending = True
            if not pending:
                break
            time.sleep(0.01)
    finally:
        for run in runs:
            h.stop(run.procs)
    return {
        run.system.name: {
            "seconds": run.seconds,
            "problem": run.problem,
            "killed_role": run.killed_role,
        }
        for run in runs
    }


def ancestors(pid: int) -> list[int]:
    """``pid`` and its parents, nearest first (from /proc)."""
    chain = []
    while pid > 1:
        chain.append(pid)
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            break
        pid = next(int(line.split()[1]) for line in status.splitlines()
                   if line.startswith("PPid:"))  # fmt: skip
    return chain


def kill_runner(run: RecoveryRun, first: Stamp) -> None:
    """SIGKILL the worker that ran the task: its process group, and the process itself
    when it left the group (RQ's work horse starts a session of its own)."""
    chain = ancestors(first.pid)
    if not chain:
        run.problem = "the process that ran the task was already gone"
        return
    for proc in run.procs:
        if proc.pid in chain:
            for pid in chain[: chain.index(proc.pid)]:  # a work horse outside the group
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            os.killpg(proc.pid, signal.SIGKILL)
            run.killed_at = time.time()
            run.killed_role = f"{proc.role}{proc.number}"
            return
    run.problem = f"pid {first.pid} belongs to no started worker"
