"""Finding tasks by what they are, whatever their state: by id prefix, handler, last
error text, limit key and a field of their data, in a bounded walk of the queue's hash
of tasks that a cursor continues.

A search walks the hash that holds every live task's envelope (or, when it looks for an
error text, the smaller hash of last errors; for a limit key, that of flow records) with
``HSCAN``, a page of ``SCAN_PAGE``
entries per round trip, and stops once it has asked the server to look at ``budget``
entries or found ``limit`` matches. Envelopes are msgpack, so the criteria are checked
here, on the client; only the matches cost more: where each one is, read in one round
trip per page (a task_status call each). What a call looked at is in its answer, and its
cursor goes on from there. A call returns ``limit`` matches at most, earliest run-at
first: when a page holds more, the cursor goes on inside that page (see
``SearchCursor``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from duetime import codec, flow, validation
from duetime.client.models import LISTED_STATES, TaskStatus
from duetime.client.reports import task_status
from duetime.client.shards import QueueShards
from duetime.errors import DecodeError, InvalidInputError
from duetime.states import TaskState
from duetime.store.plans.operations import QueueOperations
from duetime.store.plans.requests import Plan
from duetime.store.plans.searching import Walked

#: Entries the server is asked to look at per HSCAN (its COUNT): one short step each.
SCAN_PAGE = 1000
#: Entries a search call looks at by default, and at most.
DEFAULT_BUDGET = 10_000
MOST_BUDGET = 1_000_000
#: Matches a search call stops at by default, and the most it may be asked for.
DEFAULT_LIMIT = 100
MOST_LIMIT = 10_000
#: How long each criterion may be (characters).
MOST_CRITERION = 1000

#: The cursor's text: hash, shard, HSCAN cursor; inside a page, also where that page
#: ended when read and the last id returned from it (hex of its bytes).
_CURSOR = re.compile(
    r"([tek])([0-9]{1,3})\.([0-9]{1,20})(?:\.([0-9]{1,20})\.((?:[0-9a-f]{2}){1,500}))?"
)
#: A state a search takes besides those of ``LISTED_STATES``: ready tasks that wait under
#: flow control, in the due set, for their turn or a limit (``waiting_for`` says which).
WAITING = "waiting"
#: The states a search can be asked for.
SEARCH_STATES = (*LISTED_STATES, WAITING)


@dataclass(frozen=True, slots=True)
class TaskSearch:
    """What to look for; every criterion given must hold, and one at least is needed.

    ``id_prefix``: the id starts with it. ``task``: the handler's name, exactly ("" for
    the default handler). ``error``: a part of the last error's text, in any case (only
    a task that failed an attempt has one). ``data_field``: a path into the task's data,
    keys and list positions joined by dots (``customer.id``, ``items.0.sku``); with
    ``data_value``, the value there, as text (a string as it is, a number, true, false
    or null as JSON), must equal it; without, the field must exist. ``limit_key``: the
    task's flow control key, exactly. ``state``: only tasks in this state (scheduled,
    ready, running or dead; or ``waiting``: the ready tasks that wait under flow control
    for their turn or a limit), checked on the matches.
    """

    id_prefix: str | None = None
    task: str | None = None
    error: str | None = None
    data_field: str | None = None
    data_value: str | None = None
    state: TaskState | str | None = None
    limit_key: str | None = None
    path: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        given = {
            "id_prefix": self.id_prefix,
            "task": self.task,
            "error": self.error,
            "data_field": self.data_field,
            "data_value": self.data_value,
            "limit_key": self.limit_key,
        }
        for name, value in given.items():
            if value is not None and (not isinstance(value, str) or len(value) > MOST_CRITERION):
                raise InvalidInputError(
                    f"{name} must be text of at most {MOST_CRITERION} characters, "
                    f"got {validation.shown(value)}"
                )
        if self.data_value is not None and self.data_field is None:
            raise InvalidInputError("data_value needs a data_field: the path it is found at")
        path = tuple(self.data_field.split(".")) if self.data_field is not None else ()
        if self.data_field is not None and not all(path):
            raise InvalidInputError(
                f"data_field must be keys joined by dots, none empty, got "
                f"{validation.shown(self.data_field)}"
            )
        object.__setattr__(self, "path", path)
        if self.state is not None:
            if self.state not in SEARCH_STATES:
                states = ", ".join(SEARCH_STATES)
                raise InvalidInputError(f"state must be one of {states}, got {self.state!r}")
            if self.state != WAITING:
                object.__setattr__(self, "state", TaskState(self.state))
        given_one = self.task is not None or self.limit_key is not None
        if not (given_one or self.id_prefix or self.error or self.data_field):
            raise InvalidInputError(
                "give at least one of id_prefix, task, error, data_field or limit_key to "
                "search by "
                "(to list the tasks of one state, use tasks(state))"
            )

    @property
    def walked(self) -> Walked:
        """The hash a search walks: the last errors when it looks for an error text (a
        task without one cannot match), the flow records for a limit key, else every
        task."""
        if self.error:
            return "errors"
        return "keys" if self.limit_key is not None else "tasks"

    def matches_record(self, walked: Walked, record: bytes) -> bool:
        """Whether the entry a walk of errors or flow records read meets its criterion."""
        if walked == "errors":
            return self.matches_error(record)
        return self.matches_key(record)

    def matches_key(self, record: bytes) -> bool:
        if self.limit_key is None:
            return True
        return flow.record_parts(record.decode("utf-8", "surrogateescape"))[2] == self.limit_key

    def matches_id(self, task_id: str) -> bool:
        return task_id.startswith(self.id_prefix or "")

    def matches_state(self, status: TaskStatus) -> bool:
        """Whether a match is in the state asked (any, when none is)."""
        if self.state == WAITING:
            return status.waiting_for is not None
        return self.state is None or status.state == self.state

    def matches_error(self, record: bytes) -> bool:
        if not self.error:
            return True
        try:
            text = codec.decode_error_checked(record).error
        except DecodeError:
            return False
        return self.error.casefold() in text.casefold()

    def matches_envelope(self, envelope: bytes) -> bool:
        """Whether the handler and data criteria hold (True when neither is given); an
        envelope that does not decode matches neither."""
        if self.task is None and self.data_field is None:
            return True
        try:
            decoded = codec.decode_envelope(envelope)
        except DecodeError:
            return False
        if self.task is not None and decoded.task != self.task:
            return False
        return self.data_field is None or self._matches_data(decoded.data)

    def _matches_data(self, data: Any) -> bool:
        for part in self.path:
            if isinstance(data, dict):
                key: Any = int(part) if validation.is_whole(part) and part not in data else part
                if key not in data:
                    return False
                data = data[key]
            elif isinstance(data, list) and validation.is_whole(part) and int(part) < len(data):
                data = data[int(part)]
            else:
                return False
        return self.data_value is None or value_text(data) == self.data_value


def value_text(value: Any) -> str | None:
    """A value of task data as a search compares it: a string as it is, bytes as UTF-8
    text, a number, a boolean or null as JSON; None for a map or a list."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    return None


@dataclass(frozen=True, slots=True)
class SearchPage:
    """What one search call found. ``tasks``: the matches, each as ``status`` reads
    it, at most the limit asked, earliest run-at first (time of death for a dead task;
    those without a time last). ``cursor``: give it to the next call to go on, None
    once the walk is over.
    ``scanned``: entries this call read; ``total``: entries the whole walk covers now
    (tasks, or last errors: see ``walked``)."""

    tasks: list[TaskStatus]
    cursor: str | None
    scanned: int
    total: int
    walked: Walked


@dataclass(frozen=True, slots=True)
class SearchCursor:
    """Where a walk stands: the hash, the shard, and HSCAN's cursor in it. A call that
    reached its limit inside a page stays at that page: ``returned`` is the last id it
    returned of it (in id order) and ``ended`` where the page ended. Read again, the page
    gives the ids after ``returned`` only if it ends at ``ended`` again (it covered the
    same part of the hash); if not, the hash changed meanwhile, and the page is given
    whole (a match may then come twice, as after a resize, never not at all)."""

    walked: Walked
    shard: int
    position: int
    ended: int | None = None
    returned: str | None = None

    @classmethod
    def parse(cls, text: str | None, walked: Walked, shards: int) -> SearchCursor:
        if text is None or text == "":
            return cls(walked, 0, 0)
        found = _CURSOR.fullmatch(text) if isinstance(text, str) else None
        if found is None or int(found[2]) >= shards:
            raise InvalidInputError(
                f"not a search cursor of this queue: {validation.shown(text)} (give the "
                "cursor a search returned, or none to start)"
            )
        if found[1] != walked[0]:
            raise InvalidInputError(
                "this cursor belongs to a search by another kind of criteria (with or "
                "without an error text): start again without a cursor"
            )
        if found[4] is None:
            return cls(walked, int(found[2]), int(found[3]))
        returned = bytes.fromhex(found[5]).decode("utf-8", "surrogateescape")
        return cls(walked, int(found[2]), int(found[3]), int(found[4]), returned)

    def within(self, position: int, returned: str) -> SearchCursor:
        """Where a call that stopped inside the page it read from here goes on."""
        return SearchCursor(self.walked, self.shard, self.position, position, returned)

    def next(self, position: int, shards: int) -> SearchCursor | None:
        """Where the walk goes after a page that answered ``position``."""
        if position != 0:
            return SearchCursor(self.walked, self.shard, position)
        if self.shard + 1 < shards:
            return SearchCursor(self.walked, self.shard + 1, 0)
        return None

    @property
    def text(self) -> str:
        text = f"{self.walked[0]}{self.shard}.{self.position}"
        if self.returned is None:
            return text
        return f"{text}.{self.ended}.{self.returned.encode('utf-8', 'surrogateescape').hex()}"


def _moment(status: TaskStatus) -> float:
    """What results are sorted by: the run-at (the time of death of a dead task)."""
    moment = status.died_at if status.state == TaskState.DEAD else status.run_at
    return math.inf if moment is None else moment


def by_run_at(found: Sequence[TaskStatus]) -> list[TaskStatus]:
    """Search results in the order they are shown: earliest run-at first (a dead task by
    its time of death), those without a time last, then by id."""
    return sorted(found, key=lambda status: (_moment(status), status.id))


class Searching:
    """The search plan of ``QueueCore``."""

    def __init__(self, queue: QueueShards) -> None:
        self.queue = queue

    def search_plan(
        self, criteria: TaskSearch, cursor: str | None, budget: int, limit: int
    ) -> Plan[SearchPage]:
        """Walk from ``cursor`` until the server was asked to look at ``budget`` entries,
        ``limit`` tasks matched, or the walk is over."""
        if not isinstance(criteria, TaskSearch):
            raise InvalidInputError(f"criteria must be a TaskSearch, got {criteria!r}")
        validation.whole_number(budget, "budget", 1, MOST_BUDGET)
        validation.whole_number(limit, "limit", 1, MOST_LIMIT)
        walked = criteria.walked
        at: SearchCursor | None = SearchCursor.parse(cursor, walked, len(self.queue.shards))
        total = 0
        for shard in self.queue.shards:
            total += yield from shard.search.walk_size(walked)
        found: list[TaskStatus] = []
        looked = scanned = 0
        while at is not None and looked < budget and len(found) < limit:
            shard = self.queue.shards[at.shard]
            count = min(SCAN_PAGE, budget - looked)
            position, entries = yield from shard.search.scan_page(walked, at.position, count)
            looked += count
            scanned += len(entries)
            if at.returned is not None and position == at.ended:
                returned = at.returned  # the same part of the hash: go on after that id
                entries = [entry for entry in entries if entry[0] > returned]
            matches = yield from self._matches(shard, criteria, entries)
            room = limit - len(found)
            if len(matches) > room:
                # Stop inside this page: the matches first in id order, and the cursor
                # goes on after the last of them.
                matches = sorted(matches, key=lambda status: status.id)[:room]
                found += matches
                at = at.within(position, matches[-1].id)
                break
            found += matches
            at = at.next(position, len(self.queue.shards))
        cursor_text = None if at is None else at.text
        return SearchPage(by_run_at(found), cursor_text, scanned, total, walked)

    def _matches(
        self,
        shard: QueueOperations,
        criteria: TaskSearch,
        entries: Sequence[tuple[str, bytes]],
    ) -> Plan[list[TaskStatus]]:
        """The tasks of one page that meet every criterion, as ``status`` reads them."""
        walked = criteria.walked
        if walked != "tasks":
            picked = [
                task_id
                for task_id, record in entries
                if criteria.matches_id(task_id) and criteria.matches_record(walked, record)
            ]
            envelopes = (yield from shard.producer.envelopes(picked)) if picked else []
            candidates = [
                task_id
                for task_id, envelope in zip(picked, envelopes, strict=True)
                if envelope is not None and criteria.matches_envelope(envelope)
            ]
        else:
            candidates = [
                task_id
                for task_id, envelope in entries
                if criteria.matches_id(task_id) and criteria.matches_envelope(envelope)
            ]
        replies = yield from shard.search.statuses(candidates)
        found: list[TaskStatus] = []
        waiting: list[int] = []  # where the matches that wait under flow control are
        for task_id, reply in zip(candidates, replies, strict=True):
            status = task_status(task_id, reply)
            # Gone since the page was read (finished, cancelled).
            if status is None or status.state not in LISTED_STATES:
                continue
            if criteria.limit_key is not None and status.limit_key != criteria.limit_key:
                continue  # an error walk's match with another key
            if reply.waiting:
                waiting.append(len(found))
            found.append(status)
        if waiting:
            # What holds them, as ``status`` says it: one read per limit key among them.
            keys = list(dict.fromkeys(found[n].limit_key or "" for n in waiting))
            holds = dict(zip(keys, (yield from shard.flow.holds(keys)), strict=True))
            for n in waiting:
                hold = holds[found[n].limit_key or ""]
                found[n] = dataclasses.replace(found[n], waiting_for=hold.reason())
        return [status for status in found if criteria.matches_state(status)]
