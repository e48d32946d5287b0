"""What every system's adapter shares: the payload, the handler, stamps and job lists.

Standard library only: this module is imported in each system's own virtualenv (by
producer and worker processes) and in the runner's.

How runs are observed: a handler appends one fixed-size record (task index, the time it
started, its pid) to the file named by ``$BENCH_STAMP_FILE``, opened with O_APPEND. Linux
makes each such small append atomic, so threads, forked children (RQ's work horse, a
celery pool process) and separate workers can share one file. Counting completions is then
a ``stat()`` (size / record size), and recording costs one write(2) per task and no Redis
traffic, the same for every system.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

#: One stamp: index (11), start time (20), pid (8), separated by spaces, newline-ended.
RECORD_SIZE = 42
WARM_UP = -1  # index of the readiness probe task
QUEUE = "bench"  # queue name every system uses (where it lets us choose)

#: How long the "hang" handler runs: a task that is still running when its worker is
#: killed (recovery scenario). Shorter than every system's default job timeout.
HANG_SECONDS = 5.0
IO_SECONDS = 0.001  # the simulated I/O of the "io" handler

#: The limits of the opt-in flow scenario (flow.py), known to producers and workers alike:
#: a rate of FLOW_RATE starts a second on one key; at most FLOW_CONCURRENCY tasks of a key
#: running at once, over FLOW_KEYS keys, each task taking FLOW_TASK_SECONDS.
FLOW_RATE = 50
FLOW_CONCURRENCY = 2
FLOW_KEYS = 4
FLOW_TASK_SECONDS = 0.02


@dataclass(frozen=True, slots=True)
class Profile:
    """How a scenario wants a system's workers to run."""

    handler: str  # noop | io | hang
    concurrency: int | None  # tasks at once per worker process; None: the system default


PROFILES: dict[str, Profile] = {
    "punctual": Profile("noop", 50),  # punctuality and scale
    "noop": Profile("noop", 50),  # throughput, no-op handler
    "io": Profile("io", 50),  # throughput, 1 ms of simulated I/O per task
    "recovery": Profile("hang", None),  # recovery: every default left alone
    "flow-rate": Profile("noop", 50),  # flow: a rate limit on one key
    "flow-concurrency": Profile("flow", 50),  # flow: a concurrency limit per key
}


def key_of(index: int, keys: int) -> str:
    """The limit key of task ``index`` when tasks are spread over ``keys`` keys."""
    return f"key-{index % max(1, keys)}"


def payload(index: int) -> dict[str, Any]:
    """The same small task data for every system (about 30 bytes as JSON/msgpack)."""
    return {"i": index, "to": "user@example.com"}


# --- the handler ---------------------------------------------------------------------

_fd: tuple[int, int] | None = None  # (pid, fd): reopened in a forked child


def _stamp_fd() -> int:
    global _fd
    pid = os.getpid()
    if _fd is None or _fd[0] != pid:
        path = os.environ["BENCH_STAMP_FILE"]
        _fd = (pid, os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    return _fd[1]


def stamp(index: int) -> None:
    """Record that task ``index`` started now."""
    record = f"{index:>11d} {time.time():>20.6f} {os.getpid():>8d}\n".encode()
    os.write(_stamp_fd(), record)


#: Where a task's end is stamped too, when a scenario needs it (flow: how many of a key
#: run at once); read once, so that the other scenarios pay nothing for it.
_END_FILE = os.environ.get("BENCH_END_FILE")
_end_fd: tuple[int, int] | None = None


def stamp_end(index: int) -> None:
    """Record that task ``index`` ended now (a record like ``stamp``'s, in its own file)."""
    global _end_fd
    if _END_FILE is None:
        return
    pid = os.getpid()
    if _end_fd is None or _end_fd[0] != pid:
        _end_fd = (pid, os.open(_END_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    os.write(_end_fd[1], f"{index:>11d} {time.time():>20.6f} {pid:>8d}\n".encode())


def handler_kind() -> str:
    return os.environ.get("BENCH_HANDLER", "noop")


def _start_task(data: dict[str, Any]) -> float:
    """Stamp the task's start; returns how long its body then waits (simulated I/O)."""
    index = int(data["i"])
    stamp(index)
    if index < 0:
        return 0.0
    return {"io": IO_SECONDS, "hang": HANG_SECONDS, "flow": FLOW_TASK_SECONDS}.get(
        handler_kind(), 0.0
    )


def run_task(data: dict[str, Any]) -> None:
    """The body of every system's task, for workers that run plain functions."""
    if seconds := _start_task(data):
        time.sleep(seconds)
    stamp_end(int(data["i"]))


async def run_task_async(data: dict[str, Any]) -> None:
    """The same for asyncio workers: the I/O is awaited, so the loop runs other tasks."""
    if seconds := _start_task(data):
        await asyncio.sleep(seconds)
    stamp_end(int(data["i"]))


@dataclass(frozen=True, slots=True)
class Stamp:
    index: int
    started: float
    pid: int


def read_stamps(path: Path) -> list[Stamp]:
    if not path.exists():
        return []
    stamps = []
    for line in path.read_bytes().splitlines():
        index, started, pid = line.split()
        stamps.append(Stamp(int(index), float(started), int(pid)))
    return stamps


def count_stamps(path: Path) -> int:
    try:
        return path.stat().st_size // RECORD_SIZE
    except FileNotFoundError:
        return 0


# --- what to enqueue -------------------------------------------------------------------

Item = tuple[int, float | None]  # (task index, run-at epoch seconds or None for "now")


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A list of tasks described compactly, so it can pass on a command line.

    ``kind``: ``now`` (due immediately), ``spread`` (run-at uniform over
    [start, start + spread) with ``seed``), ``burst`` (all at ``start``) or ``later``
    (from ``start`` on, one per millisecond). ``start`` is relative to the moment the
    producer is connected and ready when ``relative`` is set (the producer reports the
    absolute start it used).
    """

    count: int
    kind: str = "now"
    start: float = 0.0
    spread: float = 0.0
    seed: int = 0
    first_index: int = 0
    relative: bool = False
    #: The flow scenario: "rate" or "concurrency" (which limit the tasks answer to, see
    #: ``Producer.enqueue_limited``), the tasks spread over ``keys`` limit keys.
    flow: str = ""
    keys: int = 1

    def items(self, start: float | None = None) -> list[Item]:
        base = self.start if start is None else start
        indexes = range(self.first_index, self.first_index + self.count)
        if self.kind == "now":
            return [(i, None) for i in indexes]
        if self.kind == "spread":
            rng = random.Random(self.seed)
            return [(i, base + rng.uniform(0, self.spread)) for i in indexes]
        if self.kind == "burst":
            return [(i, base) for i in indexes]
        if self.kind == "later":
            return [(i, base + n / 1000) for n, i in enumerate(indexes)]
        raise ValueError(f"unknown job spec kind {self.kind!r}")


# --- the adapter interface ---------------------------------------------------------------


class Producer(Protocol):
    """The client side of one system, created in that system's own virtualenv."""

    def enqueue(self, items: Sequence[Item], mode: str) -> None:
        """Schedule ``items`` with the system's documented delayed-task API (run-at None:
        due now). ``mode``: ``single`` (one call per task, one after the other), ``bulk``
        (the system's bulk API; only if ``Adapter.bulk`` names one) or ``fill`` (the
        fastest documented way, for setting up a backlog; not a measured figure)."""

    def close(self) -> None: ...


class LimitedProducer(Producer, Protocol):
    """A producer of a system with flow control of its own (``Adapter.flow`` not empty)."""

    def enqueue_limited(self, items: Sequence[Item], mode: str, limit: str, keys: int) -> None:
        """Schedule ``items`` (due now) as tasks under the system's ``limit`` ("rate":
        FLOW_RATE starts a second; "concurrency": FLOW_CONCURRENCY at once), per limit key
        (``key_of(index, keys)``), declaring the limit first if the system asks for that."""


class Adapter(Protocol):
    """What a module under ``peers/adapters`` provides (as its ``ADAPTER`` object)."""

    name: str
    #: How the bulk API is called, or "" when the system has none. (An adapter of a
    #: system with flow control also has ``flow``: how it limits "rate" and
    #: "concurrency" per key, in words, a limit it lacks left out; read with getattr.)
    bulk: str

    def producer(self, url: str) -> Producer: ...

    def roles(self, profile: Profile) -> list[str]:
        """Process kinds to start per "worker", e.g. ["dispatcher", "worker"]. Every
        role except "worker" is started once; "worker" as many times as asked."""

    def command(self, role: str, profile: Profile, url: str, number: int) -> list[str]:
        """The argv that starts one process of ``role`` (the system's own CLI when it
        has one). ``number`` tells several workers apart (node names)."""

    def settings(self, profile: Profile) -> dict[str, str]:
        """Every setting that matters for ``profile``, written next to the results."""

    def versions(self) -> dict[str, str]: ...


async def run_concurrently(
    call: Callable[[Item], Awaitable[object]], items: Sequence[Item], limit: int = 64
) -> None:
    """``call`` for each item, ``limit`` at a time (how an asyncio client fills a backlog
    fast when its library has no bulk API)."""
    feed = iter(items)

    async def drain() -> None:
        for item in feed:
            await call(item)

    await asyncio.gather(*(drain() for _ in range(limit)))


def enqueue_on(
    loop: asyncio.AbstractEventLoop,
    call: Callable[[Item], Awaitable[object]],
    items: Sequence[Item],
    mode: str,
) -> None:
    """An asyncio producer's enqueue: 64 calls at a time to fill a backlog, otherwise
    one after the other (the single-call figure)."""
    loop.run_until_complete(run_concurrently(call, items, limit=64 if mode == "fill" else 1))
