"""What the workers page and the overview's worker figures show: each worker by its
freshest heartbeat (alive, late, silent, or gone: holding tasks while no longer
registered), the ids it holds, the workers taken for dead in the last hour with the
tasks taken back from them, and a queue's tally by state.

Nothing here writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from duetime import AsyncQueue, GoneWorker, QueueStats, Settings, TaskSummary
from duetime.client.reports import recently_gone
from duetime.dashboard.views import RUNNING_SCAN
from duetime.states import WorkerState, worker_state

#: Ids of the tasks a late or silent worker holds shown on its row.
HELD_SHOWN = 10


@dataclass
class WorkerRow:
    id: str
    state: WorkerState = WorkerState.ALIVE  # by its freshest heartbeat, set by ``workers``
    heartbeats: dict[str, float] = field(default_factory=dict)  # queue -> seconds since
    running: dict[str, int] = field(default_factory=dict)  # queue -> tasks it holds
    held: dict[str, list[str]] = field(default_factory=dict)  # queue -> the first ids

    @property
    def freshest(self) -> float:
        return min(self.heartbeats.values(), default=0.0)


@dataclass(frozen=True, slots=True)
class GoneRow:
    """A worker taken for dead in the last hour (``recently_gone``), on one queue."""

    queue: str
    worker: GoneWorker


@dataclass(frozen=True, slots=True)
class WorkersView:
    rows: list[WorkerRow]  # registered, or holding tasks while not registered
    gone: list[GoneRow]  # newest first


@dataclass(frozen=True, slots=True)
class WorkerTally:
    """A queue's workers by state, for its card on the overview."""

    alive: int
    late: int
    silent: int
    gone: int  # taken for dead in the last hour, and not back since (recently_gone)


def worker_tally(stats: QueueStats, settings: Settings, now: float) -> WorkerTally:
    states = [
        worker_state(age, settings.heartbeat_interval, settings.worker_ttl)
        for age in stats.workers.values()
    ]
    return WorkerTally(
        alive=states.count(WorkerState.ALIVE),
        late=states.count(WorkerState.LATE),
        silent=states.count(WorkerState.SILENT),
        gone=len(recently_gone(stats, now)),
    )


async def workers(queues: Mapping[str, AsyncQueue], settings: Settings, now: float) -> WorkersView:
    rows: dict[str, WorkerRow] = {}
    gone: list[GoneRow] = []

    async def one(name: str, queue: AsyncQueue) -> tuple[str, QueueStats, list[TaskSummary]]:
        stats, listed = await asyncio.gather(queue.stats(), queue.tasks("running", RUNNING_SCAN))
        return name, stats, listed

    for name, stats, listed in await asyncio.gather(*(one(n, q) for n, q in queues.items())):
        for worker, age in stats.workers.items():
            rows.setdefault(worker, WorkerRow(worker)).heartbeats[name] = age
        for task in listed:
            if task.worker is not None:
                row = rows.setdefault(task.worker, WorkerRow(task.worker))
                row.running[name] = row.running.get(name, 0) + 1
                held = row.held.setdefault(name, [])
                if len(held) < HELD_SHOWN:
                    held.append(task.id)
        gone += [GoneRow(name, worker) for worker in recently_gone(stats, now)]
    for row in rows.values():
        row.state = (
            worker_state(row.freshest, settings.heartbeat_interval, settings.worker_ttl)
            if row.heartbeats
            else WorkerState.GONE  # holding tasks, no longer registered: reaped soon
        )
    gone.sort(key=lambda row: -row.worker.reaped_at)
    return WorkersView(sorted(rows.values(), key=lambda row: row.id), gone)
