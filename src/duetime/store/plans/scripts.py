"""The Lua scripts, read once from the package's .lua files and called by SHA.

A line ``-- @include <name>`` in a script is replaced by ``lua/include/<name>.lua``:
functions several scripts share are written once. The server sees one whole script.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

_INCLUDE = re.compile(r"^-- @include (\w+)$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str


def _read(*path: str) -> str:
    return resources.files("duetime.store.plans").joinpath("lua", *path).read_text("utf-8")


def expanded(source: str) -> str:
    """A script's source with its includes in place."""
    return _INCLUDE.sub(lambda match: _read("include", f"{match[1]}.lua").rstrip("\n"), source)


def _load(name: str) -> Script:
    source = expanded(_read(f"{name}.lua"))
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


SCHEDULE_TASKS = _load("schedule_tasks")
SCHEDULE_TASK = _load("schedule_task")
PROMOTE_DUE = _load("promote_due")
CLAIM_TASKS = _load("claim_tasks")
HEARTBEAT = _load("heartbeat")
ACK_TASKS = _load("ack_tasks")
FAIL_TASK = _load("fail_task")
REAP_EXPIRED_LEASES = _load("reap_expired_leases")
REAP_WORKER = _load("reap_worker")
RELEASE_WORKER = _load("release_worker")
GIVE_BACK_TASK = _load("give_back_task")
CANCEL_TASK = _load("cancel_task")
RESCHEDULE_TASK = _load("reschedule_task")
REQUEUE_DEAD = _load("requeue_dead")
PURGE_DEAD = _load("purge_dead")
TASK_STATUS = _load("task_status")
DECLARE_CRON = _load("declare_cron")
SET_CRON_NEXT = _load("set_cron_next")
REMOVE_CRON = _load("remove_cron")
DUE_CRON = _load("due_cron")
FIRE_CRON = _load("fire_cron")
START_BACKFILL = _load("start_backfill")
FIRE_BACKFILL = _load("fire_backfill")
SET_LIMITS = _load("set_limits")
SNOOZE_TASK = _load("snooze_task")
DEBOUNCE_TASK = _load("debounce_task")
THROTTLE_TASK = _load("throttle_task")
SCHEDULE_UNIQUE = _load("schedule_unique")
SWEEP_KEYED = _load("sweep_keyed")
KEYED_STATUS = _load("keyed_status")
SET_HISTORY = _load("set_history")
HISTORY_PAGE = _load("history_page")
TASK_HISTORY = _load("task_history")
