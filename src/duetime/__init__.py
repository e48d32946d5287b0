"""duetime: punctual, at-least-once scheduled tasks on Redis or Valkey.

import duetime
queue = duetime.Queue("emails", redis="redis://localhost:6379/0")
task_id = queue.schedule_task(1795320000, {"to": "a@example.com"})
"""

from duetime.app import App
from duetime.client import (
    AsyncQueue,
    AsyncTaskHandle,
    BulkOutcome,
    CronBackfillInfo,
    CronInfo,
    CronRun,
    DeadTask,
    FinishedAttempt,
    GoneWorker,
    Job,
    MinuteFigures,
    Queue,
    QueueStats,
    SearchPage,
    TaskHandle,
    TaskSearch,
    TaskStatus,
    TaskSummary,
    known_queues,
)
from duetime.clock import ManualClock, ServerClock
from duetime.dispatcher import Dispatcher
from duetime.flow import KeyLimits, Limits, Rate
from duetime.hooks import (
    AttemptInfo,
    AttemptOutcome,
    AttemptResult,
    DeadTaskInfo,
    Hooks,
    ScheduledTask,
)
from duetime.keyed import Debounce, KeyedState, Scheduled, Throttle, Unique
from duetime.settings import Settings
from duetime.states import HistoryOutcome, WorkerState
from duetime.task_context import TaskContext, current_task
from duetime.worker import Worker
from duetime.worker.context import Snooze

__version__ = "0.1.0"

__all__ = [
    "App",
    "AsyncQueue",
    "AsyncTaskHandle",
    "AttemptInfo",
    "AttemptOutcome",
    "AttemptResult",
    "BulkOutcome",
    "CronBackfillInfo",
    "CronInfo",
    "CronRun",
    "DeadTask",
    "DeadTaskInfo",
    "Debounce",
    "Dispatcher",
    "FinishedAttempt",
    "GoneWorker",
    "HistoryOutcome",
    "Hooks",
    "Job",
    "KeyLimits",
    "KeyedState",
    "Limits",
    "ManualClock",
    "MinuteFigures",
    "Queue",
    "QueueStats",
    "Rate",
    "Scheduled",
    "ScheduledTask",
    "SearchPage",
    "ServerClock",
    "Settings",
    "Snooze",
    "TaskContext",
    "TaskHandle",
    "TaskSearch",
    "TaskStatus",
    "TaskSummary",
    "Throttle",
    "Unique",
    "Worker",
    "WorkerState",
    "__version__",
    "current_task",
    "known_queues",
]
