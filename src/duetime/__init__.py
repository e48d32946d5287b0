"""duetime: punctual, at-least-once scheduled tasks on Redis or Valkey.

import duetime
queue = duetime.Queue("emails", redis="redis://localhost:6379/0")
task_id = queue.schedule_task(1795320000, {"to": "a@example.com"})
"""

from duetime.app import App
from duetime.clock import ManualClock, ServerClock
from duetime.dispatcher import Dispatcher
from duetime.scheduler import (
    AsyncQueue,
    CronInfo,
    CronRun,
    DeadTask,
    Job,
    Queue,
    QueueStats,
    TaskStatus,
)
from duetime.settings import Settings
from duetime.worker import TaskContext, Worker, current_task

__version__ = "0.1.0"

__all__ = [
    "App",
    "AsyncQueue",
    "CronInfo",
    "CronRun",
    "DeadTask",
    "Dispatcher",
    "Job",
    "ManualClock",
    "Queue",
    "QueueStats",
    "ServerClock",
    "Settings",
    "TaskContext",
    "TaskStatus",
    "Worker",
    "__version__",
    "current_task",
]
