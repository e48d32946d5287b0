"""A prepared task: one task checked and ready to write, what it is made of, when it
runs and the envelope it is written in.
"""

from __future__ import annotations

from typing import Final

from duetime import codec
from duetime.keyed import KeyedMode

#: One task checked and ready to write: (id, run-at in whole µs or None, delay in ms,
#: task name, packed data, max_attempts, timeout_ms, result_ttl_ms, whether duetime made
#: the id, so it may be replaced if it collides, its flow record: "" for none, see
#: ``duetime.flow.flow_record``; its debounce, throttle or unique mode, or None: see
#: ``duetime.keyed``; how late after its run-at it may still start, ms, 0: no limit,
#: see ``expires``). A plain tuple, not an object: the
#: garbage collector stops tracking a tuple of plain values, where the 200,000 objects
#: of a large schedule_many made its full collections walk them again and again (0.6 µs
#: a task, a tenth of the call). A NamedTuple is not an exact tuple, so it stays tracked
#: (a schedule_many of 200,000 ran at 165,000 tasks/s against 210,000): made by
#: ``prepared_task``, read through the positions below.
PreparedTask = tuple[
    str, int | None, int, str, bytes, int, int, int, bool, str, KeyedMode | None, int
]
#: Positions in a PreparedTask.
TASK_ID: Final = 0
AT_US: Final = 1
DELAY_MS: Final = 2
TASK_NAME: Final = 3
PACKED_DATA: Final = 4
MAX_ATTEMPTS: Final = 5
TIMEOUT_MS: Final = 6
RESULT_TTL_MS: Final = 7
GENERATED: Final = 8
FLOW: Final = 9
KEYED: Final = 10
EXPIRES_MS: Final = 11


def prepared_task(
    task_id: str,
    at_us: int | None,
    delay_ms: int,
    task_name: str,
    packed_data: bytes,
    max_attempts: int,
    timeout_ms: int,
    result_ttl_ms: int,
    generated: bool,
    flow: str = "",
    keyed: KeyedMode | None = None,
    expires_ms: int = 0,
) -> PreparedTask:
    """A prepared task of these parts (``at_us`` None: it runs ``delay_ms`` from now)."""
    return (
        task_id,
        at_us,
        delay_ms,
        task_name,
        packed_data,
        max_attempts,
        timeout_ms,
        result_ttl_ms,
        generated,
        flow,
        keyed,
        expires_ms,
    )


def run_at_us_of(item: PreparedTask, now_ms: int) -> int:
    """When a prepared task runs, in whole µs, given its server's clock. A run-at in the
    past is stored as now: the task is due from the moment it is scheduled, and its
    lateness counts from there (a task dated 2020 is not years late), for free: no note
    beside it, no other command."""
    at_us = item[AT_US]
    now_us = now_ms * 1000
    return now_us + item[DELAY_MS] * 1000 if at_us is None else max(at_us, now_us)


def envelope_of(item: PreparedTask, run_at_ms: float) -> bytes:
    """The envelope a prepared task is written in, to run at ``run_at_ms``."""
    _, _, _, task_name, packed_data, max_attempts, timeout_ms, result_ttl_ms, _, _, _, expires = (
        item
    )
    return codec.envelope_from_packed_data(
        task_name, packed_data, run_at_ms, max_attempts, timeout_ms, result_ttl_ms, expires
    )
