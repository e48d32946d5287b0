"""duetime: punctual, at-least-once scheduled tasks on Redis or Valkey.

import duetime
queue = duetime.Queue("emails", redis="redis://localhost:6379/0")
task_id = queue.schedule_task(1795320000, {"to": "a@example.com"})
"""

from duetime.app import App
from duetime.client import (
    AsyncQueue,
    CronInfo,
    CronRun,
    DeadTask,
    FinishedAttempt,
    Job,
    MinuteFigures,
    Queue,
    QueueStats,
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
from duetime.settings import Settings
from duetime.states import HistoryOutcome
from duetime.worker import TaskContext, Worker, current_task
from duetime.worker.context import Snooze

__version__ = "0.1.0"

__all__ = [
    "App",
    "AsyncQueue",
    "AttemptInfo",
    "AttemptOutcome",
    "AttemptResult",
    "CronInfo",
    "CronRun",
    "DeadTask",
    "DeadTaskInfo",
    "Dispatcher",
    "FinishedAttempt",
    "HistoryOutcome",
    "Hooks",
    "Job",
    "KeyLimits",
    "Limits",
    "ManualClock",
    "MinuteFigures",
    "Queue",
    "QueueStats",
    "Rate",
    "ScheduledTask",
    "ServerClock",
    "Settings",
    "Snooze",
    "TaskContext",
    "TaskStatus",
    "TaskSummary",
    "Worker",
    "__version__",
    "current_task",
    "known_queues",
]
