"""``QueueCore``: the validation and the plans that ``Queue`` and ``AsyncQueue`` share, so
both behave the same by construction. Each kind of plan has its module and its class;
this makes one of each around the queue's shards, and holds them by name.
"""

from __future__ import annotations

from collections.abc import Iterable

from duetime.client.backfill import BackfillPlans
from duetime.client.bulk import BulkControl
from duetime.client.control import Control
from duetime.client.cron import CronPlans
from duetime.client.history import HistoryPlans
from duetime.client.inspection import Inspection
from duetime.client.keyed import KeyedScheduling
from duetime.client.limiting import Limiting
from duetime.client.preparing import Preparing
from duetime.client.producing import Producing
from duetime.client.searching import Searching
from duetime.client.shards import QueueShards
from duetime.clock import Clock
from duetime.hooks import Hooks
from duetime.settings import Settings


class QueueCore:
    """Validation and plans shared by ``Queue`` and ``AsyncQueue``, one group each:
    checking calls (``preparing``), writing tasks (``producing``, and ``keyed`` for those
    with a debounce, throttle or unique key), reading the queue (``inspection``), finding
    tasks (``search``), changing them one or many at a time (``control``, ``bulk``), its
    cron jobs (``cron``, ``backfill``), its limits (``limits``) and its history of
    finished attempts (``history``), all on its shards (``queue``). Every input is
    checked before anything is written."""

    __slots__ = (
        "backfill",
        "bulk",
        "control",
        "cron",
        "history",
        "inspection",
        "keyed",
        "limits",
        "preparing",
        "producing",
        "queue",
        "search",
    )

    def __init__(
        self,
        name: str,
        settings: Settings,
        clock: Clock | None,
        result_ttl: float | None,
        durable: bool | None = None,
        shards: int = 1,
        hooks: Iterable[Hooks] = (),
    ) -> None:
        self.queue = queue = QueueShards(name, settings, clock, durable, shards, hooks)
        self.preparing = Preparing(settings, result_ttl)
        self.keyed = KeyedScheduling(queue)
        self.producing = Producing(queue, self.keyed)
        self.inspection = Inspection(queue)
        self.control = Control(queue, self.inspection)
        self.bulk = BulkControl(queue, self.control)
        self.search = Searching(queue)
        self.limits = Limiting(queue)
        self.cron = CronPlans(queue, self.producing)
        self.backfill = BackfillPlans(queue)
        self.history = HistoryPlans(queue)
