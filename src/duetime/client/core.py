"""``QueueCore``: the validation and the plans that ``Queue`` and ``AsyncQueue`` share, so
both behave the same by construction. Each kind of plan has its module; this joins them.
"""

from __future__ import annotations

from duetime.client.control import Control
from duetime.client.cron import CronPlans
from duetime.client.history import HistoryPlans
from duetime.client.limiting import Limiting


class QueueCore(CronPlans, Limiting, HistoryPlans, Control):
    """Validation and plans shared by ``Queue`` and ``AsyncQueue``: checking and writing
    tasks (``Preparing``, ``Producing``), reading the queue (``Inspection``), changing it
    (``Control``), its cron jobs (``CronPlans``), its limits (``Limiting``) and its
    history of finished attempts (``HistoryPlans``), all on its shards
    (``QueueShards``). Every input is checked before anything is written."""
