"""``QueueCore``: the validation and the plans that ``Queue`` and ``AsyncQueue`` share, so
both behave the same by construction. Each kind of plan has its module; this joins them.
"""

from __future__ import annotations

from duetime.client.backfill import BackfillPlans
from duetime.client.bulk import BulkControl
from duetime.client.cron import CronPlans
from duetime.client.history import HistoryPlans
from duetime.client.keyed import KeyedScheduling
from duetime.client.limiting import Limiting
from duetime.client.searching import Searching


class QueueCore(
    KeyedScheduling, CronPlans, BackfillPlans, Limiting, HistoryPlans, BulkControl, Searching
):
    """Validation and plans shared by ``Queue`` and ``AsyncQueue``: checking and writing
    tasks (``Preparing``, ``Producing``, and ``KeyedScheduling`` for those with a
    debounce, throttle or unique key), reading the queue (``Inspection``), finding tasks
    (``Searching``), changing them one or many at a time (``Control``, ``BulkControl``),
    its cron jobs (``CronPlans``, ``BackfillPlans``), its limits (``Limiting``) and its
    history of finished attempts (``HistoryPlans``), all on its shards (``QueueShards``).
    Every input is checked before anything is written."""
