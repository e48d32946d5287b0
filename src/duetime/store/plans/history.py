"""The history's plans: read a run of a queue's finished attempts, newest first, or one
task's; read and change how many the history keeps. The scripts that end attempts write
it (``lua/include/history.lua``); this module reads what they wrote."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from duetime import codec
from duetime.errors import DecodeError
from duetime.states import HistoryOutcome
from duetime.store.plans import scripts
from duetime.store.plans.base import QueuePlans
from duetime.store.plans.replies import as_text, count_or_none
from duetime.store.plans.requests import Batch, Command, Eval, Plan, wire_id

#: How many entries a queue's history (each shard's, when sharded) keeps unless told
#: otherwise: HISTORY_DEFAULT_SIZE in history.lua.
DEFAULT_HISTORY_SIZE = 1000
#: The most a history may keep: a filtered listing reads it whole at worst.
MOST_HISTORY_SIZE = 100_000
#: The log is trimmed back to the history's size once it holds this many entries more
#: (HISTORY_TRIM_STEP in history.lua): one trim per so many entries, not one per ack.
#: Readers see only the first ``size``.
HISTORY_TRIM_STEP = 64
#: The outcome codes entries store (history.lua: HISTORY_*), one byte each.
OUTCOME_CODES = {
    1: HistoryOutcome.SUCCEEDED,
    2: HistoryOutcome.RETRIED,
    3: HistoryOutcome.DEAD,
    4: HistoryOutcome.SNOOZED,
    5: HistoryOutcome.LOST,
    6: HistoryOutcome.CANCELLED,
    7: HistoryOutcome.EXPIRED,
}
SUCCEEDED_CODE = 1
_FIELDS = 9  # task id ... error text; trailing empty fields are left out
#: And two more in an entry that stands for a run of snoozes (history.lua: record_snooze):
#: how many, and when the latest was.
_COALESCED_FIELDS = 11


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One entry as stored: ``number`` orders the entries of one shard's history (a
    larger one is newer); times are server-clock ms, durations µs; None: not known."""

    number: int
    task_id: str
    task: str | None  # the handler's name ("" the default one); None: unreadable envelope
    outcome: HistoryOutcome
    attempt: int
    finished_ms: int
    worker: str | None
    duration_us: int | None
    lateness_us: int | None
    error: str | None
    previous: int | None  # the number of the task's entry before this one
    count: int = 1  # the endings it stands for: a run of snoozes of the task is one entry
    last_ms: int | None = None  # when the latest of them was (count above 1)


def packed_record(
    task_id: str,
    task: str,
    attempt: int,
    finished_ms: int,
    worker: str,
    duration_us: int,
    lateness_us: int,
) -> bytes:
    """The record of a success, as history.lua's history_record packs any ending (text
    as Lua strings, an id that is not UTF-8 as its bytes): what a worker sends with each
    ack, so that the ack script only prefixes and pushes it."""
    return codec.packed(
        [
            wire_id(task_id),
            task,
            SUCCEEDED_CODE,
            attempt,
            finished_ms,
            worker,
            max(0, duration_us),
            max(0, lateness_us),
        ],
        use_bin_type=False,
    )


def read_entry(number: int, blob: bytes) -> HistoryEntry:
    """The entry ``blob`` ("<previous>|<record>", history.lua), numbered ``number``;
    DecodeError if it is not one duetime wrote."""
    before, bar, record = blob.partition(b"|")
    fields = codec.unpack_written_by_lua(record) if bar else None
    if not isinstance(fields, list) or not 5 <= len(fields) <= _COALESCED_FIELDS:
        raise DecodeError("not a history entry")
    count, last = 1, None
    if len(fields) > _FIELDS:
        count, last = [*fields[_FIELDS:], None][:2]
        fields = fields[:_FIELDS]
        if not _whole(count) or count < 1 or not (last is None or _whole(last)):
            raise DecodeError("history entry fields have the wrong types")
    if before and not before.isdigit():  # bytes: ASCII digits only
        raise DecodeError("a history entry's link to the one before is not a number")
    task_id, task, code, attempt, finished, *rest = fields + [None] * (_FIELDS - len(fields))
    worker, duration, lateness, error = (None if v is False else v for v in rest)
    if (
        not isinstance(task_id, str)
        or code not in OUTCOME_CODES
        or not all(_whole(v) for v in (attempt, finished))
        or not all(v is None or _whole(v) for v in (duration, lateness))
    ):
        raise DecodeError("history entry fields have the wrong types")
    return HistoryEntry(
        number=number,
        task_id=task_id,
        task=task if isinstance(task, str) else None,
        outcome=OUTCOME_CODES[code],
        attempt=attempt,
        finished_ms=finished,
        worker=None if worker is None else str(worker),
        duration_us=duration,
        lateness_us=lateness,
        error=None if error is None else str(error),
        previous=int(before) if before else None,
        count=count,
        last_ms=last,
    )


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _readable(number: int, blob: bytes) -> HistoryEntry | None:
    try:
        return read_entry(number, blob)
    except DecodeError:
        return None  # written by hand: the invariant checker reports it


class HistoryPlans(QueuePlans):
    """The plans that read a queue's history, and set its size."""

    def history_run(self, below: int, count: int) -> Plan[tuple[list[HistoryEntry], int]]:
        """Up to ``count`` entries, newest first, from the newest numbered below
        ``below`` (0: the newest of all); and the ``below`` that reads on from there
        (0 when the history is read to its end). Unreadable entries are left out."""
        k = self.keys
        first, blobs = yield Eval(
            scripts.HISTORY_PAGE, (k.history_state, k.history), (below, count)
        )
        first = int(first)
        found = [_readable(first - n, blob) for n, blob in enumerate(blobs)]
        onward = first - len(blobs) + 1 if len(blobs) == count and first - len(blobs) > 0 else 0
        return [entry for entry in found if entry is not None], onward

    def task_history(self, task_id: str, most: int) -> Plan[list[HistoryEntry]]:
        """The entries of one task still kept, newest first."""
        k = self.keys
        number, blobs = yield Eval(scripts.TASK_HISTORY, k.history_keys, (task_id, most))
        found: list[HistoryEntry] = []
        number = int(number)
        for blob in blobs:  # each names the one after it (the script walked that way)
            entry = _readable(number, blob)
            if entry is None:
                break
            found.append(entry)
            number = entry.previous or 0
        return found

    def history_size(self) -> Plan[tuple[int, int]]:
        """How many entries the history keeps (0: it is off), and how many it holds."""
        k = self.keys
        size, length = yield Batch(
            (Command(("HGET", k.history_state, "size")), Command(("LLEN", k.history)))
        )
        # As the scripts read it: a size that is not a whole number turns the history off.
        kept = DEFAULT_HISTORY_SIZE if size is None else count_or_none(as_text(size))
        return max(0, kept or 0), int(length)

    def set_history_size(self, size: int | None) -> Plan[int]:
        """Keep ``size`` entries from now on (None: the default; 0: none, and delete
        what is kept), trimming at once; the size now in force."""
        k = self.keys
        reply = yield Eval(scripts.SET_HISTORY, k.history_keys, (-1 if size is None else size,))
        return int(reply)
