"""The ledger of handler runs (written by the handlers in tests/apps.py) and its
comparison with what the test scheduled and the faults it injected.

The ledger lives in Redis so that processes killed with SIGKILL still leave their
records behind, and it is read incrementally while a scenario runs.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from tests.apps import LEDGER


@dataclass(frozen=True, slots=True)
class Entry:
    kind: str  # "start", "done", or "stopped" (the attempt saw its task cancelled)
    task_id: str
    attempt: int
    pid: int
    at_ms: float  # wall clock when recorded
    run_at_ms: float  # the task's run-at, as the worker read it from the envelope


def parse(raw: bytes | str) -> Entry:
    text = raw.decode() if isinstance(raw, bytes) else raw
    kind, task_id, attempt, pid, at_ms, run_at_ms = text.split()
    return Entry(kind, task_id, int(attempt), int(pid), float(at_ms), float(run_at_ms))


@dataclass(slots=True)
class Attempt:
    """One attempt as the ledger saw it: when its handler started and, if it got
    that far, when it finished."""

    task_id: str
    attempt: int
    pid: int
    started_ms: float
    run_at_ms: float
    done_ms: float | None = None


class Ledger:
    """Reads the ledger list, appending only what is new on each ``refresh``."""

    def __init__(self, client: redis.Redis, key: str = LEDGER) -> None:
        self.client = client
        self.key = key
        self.entries: list[Entry] = []
        self.attempts: dict[tuple[str, int], list[Attempt]] = {}
        self.done: set[str] = set()
        self.stopped: dict[str, float] = {}  # task id -> when a cancelled attempt stopped

    def refresh(self) -> list[Entry]:
        new = [parse(raw) for raw in self.client.lrange(self.key, len(self.entries), -1)]
        self.entries.extend(new)
        for entry in new:
            runs = self.attempts.setdefault((entry.task_id, entry.attempt), [])
            if entry.kind == "start":
                runs.append(
                    Attempt(entry.task_id, entry.attempt, entry.pid, entry.at_ms, entry.run_at_ms)
                )
            else:
                if entry.kind == "stopped":
                    self.stopped.setdefault(entry.task_id, entry.at_ms)
                else:
                    self.done.add(entry.task_id)
                for run in runs:
                    if run.pid == entry.pid and run.done_ms is None:
                        run.done_ms = entry.at_ms
                        break
        return new

    def all_done(self, task_ids: Collection[str]) -> bool:
        self.refresh()
        return all(task_id in self.done for task_id in task_ids)

    def in_flight(self, pid: int) -> set[str]:
        """Tasks whose handler started in process ``pid`` and has not finished there."""
        return {
            run.task_id
            for runs in self.attempts.values()
            for run in runs
            if run.pid == pid and run.done_ms is None
        }

    def runs_by_task(self) -> dict[str, list[Attempt]]:
        by_task: dict[str, list[Attempt]] = {}
        for runs in self.attempts.values():
            for run in runs:
                by_task.setdefault(run.task_id, []).append(run)
        for runs in by_task.values():
            runs.sort(key=lambda run: run.started_ms)
        return by_task


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault the test injected: the wall-clock window (epoch seconds) it was in effect
    and whom it could hit: only processes in ``pids`` / tasks in ``task_ids``, or all."""

    what: str
    start: float
    end: float
    pids: frozenset[int] | None = None
    task_ids: frozenset[str] | None = None

    def hits(self, run: Attempt, before: float, after: float) -> bool:
        """Whether ``run`` was exposed to this fault: it was in the fault's process set
        and its life overlapped the window, widened by ``before`` (an outcome finished
        just before the fault may not have been acknowledged yet) and ``after`` (a
        lease lost during the fault is noticed up to a lease and a worker TTL later)."""
        if self.pids is not None and run.pid not in self.pids:
            return False
        if self.task_ids is not None and run.task_id not in self.task_ids:
            return False
        ended = math.inf if run.done_ms is None else run.done_ms / 1000
        return run.started_ms / 1000 <= self.end + after and ended >= self.start - before


@dataclass(slots=True)
class Verdict:
    """The ledger compared with what was scheduled. ``problems`` lists what breaks
    duetime's guarantees; the rest is measurement."""

    scheduled: int
    completed: int = 0
    runs: int = 0
    duplicates: int = 0  # starts beyond the first, over all tasks
    explained: int = 0  # ... of which an injected fault made possible
    missing: list[str] = field(default_factory=list)  # scheduled, acknowledged, never done
    early: list[str] = field(default_factory=list)  # started before its run-at
    unknown: list[str] = field(default_factory=list)  # ran, but was never scheduled
    repeated: list[str] = field(default_factory=list)  # one attempt number started twice
    unexplained: list[str] = field(default_factory=list)  # duplicates no fault explains
    lateness_ms: list[float] = field(default_factory=list)  # first start minus run-at

    @property
    def problems(self) -> list[str]:
        return self.problems_but(())

    def problems_but(self, skip: Collection[str]) -> list[str]:
        """The problems, less those of the kinds in ``skip`` (judged by the caller)."""
        found = []
        for name in ("missing", "early", "unknown", "repeated", "unexplained"):
            items: list[str] = getattr(self, name)
            if items and name not in skip:
                found.append(f"{len(items)} {name}: {items[:10]}")
        return found

    def percentile(self, fraction: float) -> float:
        if not self.lateness_ms:
            return 0.0
        ordered = sorted(self.lateness_ms)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    def summary(self) -> dict[str, Any]:
        return {
            "scheduled": self.scheduled,
            "completed": self.completed,
            "lost": len(self.missing),
            "runs": self.runs,
            "duplicates": self.duplicates,
            "duplicates_explained": self.explained,
            "early": len(self.early),
            "lateness_p50_ms": round(self.percentile(0.5), 1),
            "lateness_p99_ms": round(self.percentile(0.99), 1),
            "lateness_max_ms": round(max(self.lateness_ms, default=0.0), 1),
        }


def compare(
    ledger: Ledger,
    scheduled: Mapping[str, float],
    *,
    maybe: Collection[str] = (),
    faults: Sequence[Fault] = (),
    before: float = 1.0,
    after: float = 5.0,
) -> Verdict:
    """Check the ledger against ``scheduled`` (task id -> run-at in epoch seconds, for
    every schedule call that was acknowledged). ``maybe`` holds ids whose schedule call
    failed: they may run or not. A task that started more than once is a duplicate;
    it is explained when an earlier attempt was exposed to one of ``faults``."""
    ledger.refresh()
    verdict = Verdict(scheduled=len(scheduled))
    by_task = ledger.runs_by_task()
    for task_id, at in scheduled.items():
        runs = by_task.get(task_id, [])
        if task_id not in ledger.done:
            verdict.missing.append(task_id)
            continue
        verdict.completed += 1
        verdict.lateness_ms.append(runs[0].started_ms - at * 1000)
    for task_id, runs in sorted(by_task.items()):
        if task_id not in scheduled and task_id not in maybe:
            verdict.unknown.append(task_id)
            continue
        verdict.runs += len(runs)
        due = scheduled.get(task_id)
        for run in runs:
            # Never early, by the run-at we asked for or the one the envelope holds
            # (duetime rounds it up to the next microsecond). No tolerance: both clocks
            # are this host's, and a late start is all that scheduling noise can cause.
            if (due is not None and run.started_ms < due * 1000) or run.started_ms < run.run_at_ms:
                verdict.early.append(
                    f"{task_id} attempt {run.attempt} started {run.started_ms:.3f}, "
                    f"run-at {run.run_at_ms}"
                )
        numbers = [run.attempt for run in runs]
        if len(set(numbers)) != len(numbers):
            verdict.repeated.append(f"{task_id} attempts {numbers}")
        # In claim order (the attempt number), not start order: a worker frozen between
        # its claim and its handler's first line starts an older attempt after a newer
        # one ran elsewhere, and it is that older attempt the fault hit.
        claimed = sorted(runs, key=lambda run: (run.attempt, run.started_ms))
        for index, run in enumerate(claimed[1:], start=1):
            verdict.duplicates += 1
            if any(
                fault.hits(earlier, before, after)
                for earlier in claimed[:index]
                for fault in faults
            ):
                verdict.explained += 1
            else:
                history = ", ".join(
                    f"#{r.attempt} pid {r.pid} {r.started_ms / 1000:.3f}-"
                    f"{'' if r.done_ms is None else f'{r.done_ms / 1000:.3f}'}"
                    for r in runs
                )
                verdict.unexplained.append(
                    f"{task_id} ran again as attempt {run.attempt} ({history})"
                )
    return verdict
