"""The Lua scripts, read once from the package's .lua files and called by SHA.

A line ``-- @include <name>`` in a script is replaced by ``lua/include/<name>.lua``:
functions several scripts share are written once. An include may include others the
same way; each include is put in a script once, where it is first asked for (a later
line asking for it again is dropped), so every include's own includes come before it.
An include that does not exist, or one that comes back to itself through those it
includes, is refused (IncludeError) as the scripts load. The server sees one whole
script.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from duetime.errors import DuetimeError

_INCLUDE = re.compile(r"-- @include (\w+)")


class IncludeError(DuetimeError):
    """A script of the package asks for an include that does not exist, or its includes
    form a cycle: the package itself is broken."""


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str


def _read(*path: str) -> str:
    return resources.files("duetime.store.plans").joinpath("lua", *path).read_text("utf-8")


def _include(name: str, script: str, chain: tuple[str, ...]) -> str:
    if name in chain:
        raise IncludeError(f"{script}: include cycle {' -> '.join((*chain, name))}")
    try:
        return _read("include", f"{name}.lua")
    except FileNotFoundError:
        asker = chain[-1] if chain else script
        raise IncludeError(f"{script}: {asker} includes {name}, which does not exist") from None


def _expand(source: str, script: str, chain: tuple[str, ...], placed: list[str]) -> list[str]:
    """The lines of ``source`` with its includes in place, recursively. ``script``: the
    script's name; ``chain``: the includes being expanded, outermost first; ``placed``:
    the includes put in the script so far, in order (filled in)."""
    lines: list[str] = []
    for line in source.splitlines():
        match = _INCLUDE.fullmatch(line)
        if not match:
            lines.append(line)
            continue
        name = match[1]
        text = _include(name, script, chain)
        if name in placed:
            continue  # in place already, above
        placed.append(name)
        lines.extend(_expand(text, script, (*chain, name), placed))
    return lines


def expanded(source: str, script: str = "a script") -> str:
    """A script's source with its includes in place (``script``: its name, for an
    IncludeError)."""
    return "\n".join(_expand(source, script, (), [])) + "\n"


def includes(source: str, script: str = "a script") -> tuple[str, ...]:
    """The includes a script's source ships, directly or through others, in the order
    they are put in place."""
    placed: list[str] = []
    _expand(source, script, (), placed)
    return tuple(placed)


def _load(name: str) -> Script:
    source = expanded(_read(f"{name}.lua"), name)
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
