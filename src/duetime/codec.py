"""The msgpack envelope a task travels in, and the records stored beside it.

An envelope is written by the client, and scripts move task ids between structures and
keep per-attempt state (attempt counts, errors) in their own hashes. The one count a
script writes into an envelope is its snoozes (version 4, below): it sits before the
data, so a script rewrites the envelope's head and never decodes or re-encodes user data.
Pickle is never used; only msgpack types round-trip (tuples come back as lists).
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import msgpack

from duetime.errors import DecodeError, InvalidPayloadError

#: Bumped when the envelope layout changes; a worker refuses envelopes newer than it knows.
#: Version 1: [1, task, data, run_at_ms, max_attempts, timeout_ms, result_ttl_ms].
#: Version 2: the same with 2 first, and trailing limits equal to the V2 defaults left out.
#: Version 3: version 2 with an eighth element, expires_after_ms (above 0), written only
#: for a task given ``expires``: every other task is still written as version 2, which
#: workers from before version 3 read (they refuse a version 3 one with a clear error).
#: Version 4: [4, task, snoozes, ...] then data, run-at and the limits as in version 2 or
#: 3: the times the task was snoozed (above 0). Written by the snooze script
#: (lua/include/snoozes.lua) into the envelope it rewrites, never by a client for a new
#: task, so a task that never snoozed is still read by workers from before version 4.
ENVELOPE_VERSION = 4

#: What a version 2 envelope means by an omitted max_attempts, timeout_ms or result_ttl_ms.
#: Fixed forever for version 2, and deliberately not read from Settings: a later change of
#: the library's defaults must not change how envelopes already in Redis decode. They equal
#: today's Settings defaults, so a task scheduled with defaults stores none of them.
V2_DEFAULT_MAX_ATTEMPTS = 5
V2_DEFAULT_TIMEOUT_MS = 300_000
V2_DEFAULT_RESULT_TTL_MS = 0
_V2_DEFAULT_LIMITS = (V2_DEFAULT_MAX_ATTEMPTS, V2_DEFAULT_TIMEOUT_MS, V2_DEFAULT_RESULT_TTL_MS)
#: Elements of a version 2 envelope: version, task, data and run-at always; then the limits.
_V2_REQUIRED = 4
_V3_SIZE = _V2_REQUIRED + len(_V2_DEFAULT_LIMITS) + 1


@dataclass(frozen=True, slots=True)
class Envelope:
    """What a worker needs to run one task."""

    task: str  # registered handler name; "" means the queue's default handler
    data: Any
    run_at_ms: float  # an int when whole; a float keeps sub-millisecond precision
    max_attempts: int
    timeout_ms: int
    result_ttl_ms: int  # 0: keep no result
    #: How late after its run-at an attempt may still start; past that the task is
    #: dropped unstarted (``expires``). 0: never.
    expires_after_ms: int = 0
    #: How many times a handler snoozed the task (``Snooze``), counted by the snooze
    #: script: the worker ends a task that snoozes past its limit.
    snoozes: int = 0


@dataclass(frozen=True, slots=True)
class ErrorRecord:
    """The last failure of a task, kept while it is retried or dead."""

    error: str
    traceback: str
    attempt: int
    failed_at_ms: int
    worker: str


@dataclass(frozen=True, slots=True)
class ResultRecord:
    """A finished task's outcome, stored with a TTL when the task asked for it."""

    ok: bool
    value: Any  # the handler's return value, or the error text when not ok
    started_ms: int = 0  # server clock, when the attempt started (0: unknown)
    finished_ms: int = 0
    attempt: int = 0  # the attempt that finished (0: unknown, a record from before 0.2)
    ended: str = ""  # "cancelled" or "expired": how a task ended unfinished (not ok)


#: What msgpack raises for a value it cannot represent natively.
PACK_ERRORS = (TypeError, ValueError, OverflowError)


def pack(value: Any) -> bytes:
    """Encode with msgpack, refusing anything msgpack cannot represent natively."""
    try:
        return packed(value)
    except PACK_ERRORS as error:
        raise unpackable(error) from error


def unpackable(error: Exception) -> InvalidPayloadError:
    """The error for task data msgpack refused with ``error`` (one of PACK_ERRORS)."""
    return InvalidPayloadError(
        f"task data cannot be encoded with msgpack ({error}); use dicts, lists, str, "
        "bytes, int, float, bool and None only"
    )


def new_packer() -> Callable[[Any], bytes]:
    """The pack method of a Packer of one's own, as ``pack`` encodes (but raising
    PACK_ERRORS): for a loop over many values in one thread."""
    return msgpack.Packer(use_bin_type=True, datetime=False).pack  # type: ignore[no-any-return]


_PER_THREAD = threading.local()


def packed(value: Any, use_bin_type: bool = True) -> bytes:
    """``value`` in msgpack, by a Packer this thread keeps: making one costs far more than
    packing a small value with it (0.3 µs against 0.05). A Packer empties its buffer
    after every pack, failed or not; one in use is not lent again (a pack that somehow
    packs again inside, from a hook or a finalizer, gets a Packer of its own)."""
    try:
        spare = _PER_THREAD.spare
    except AttributeError:
        spare = _PER_THREAD.spare = {True: [], False: []}
    packers = spare[use_bin_type]
    packer = packers.pop() if packers else msgpack.Packer(use_bin_type=use_bin_type, datetime=False)
    try:
        return packer.pack(value)  # type: ignore[no-any-return]
    finally:
        packers.append(packer)


def unpack(blob: bytes) -> Any:
    try:
        return msgpack.unpackb(blob, raw=False, strict_map_key=False, timestamp=0)
    except Exception as error:  # msgpack raises several unrelated types on bad input
        raise DecodeError(
            f"not a valid msgpack document ({type(error).__name__}: {error})"
        ) from error


def unpack_written_by_lua(blob: bytes) -> Any:
    """A record a script packed: Lua strings are bytes, so text that is not UTF-8 (an id
    written by hand) is read as ids are read (surrogateescape), not refused."""
    try:
        return msgpack.unpackb(
            blob, raw=False, strict_map_key=False, timestamp=0, unicode_errors="surrogateescape"
        )
    except Exception as error:  # msgpack raises several unrelated types on bad input
        raise DecodeError(
            f"not a valid msgpack document ({type(error).__name__}: {error})"
        ) from error


def encode_envelope(envelope: Envelope) -> bytes:
    blob = envelope_from_packed_data(
        envelope.task,
        pack(envelope.data),
        envelope.run_at_ms,
        envelope.max_attempts,
        envelope.timeout_ms,
        envelope.result_ttl_ms,
        envelope.expires_after_ms,
    )
    return with_snoozes(blob, envelope.task, envelope.snoozes) if envelope.snoozes else blob


def with_snoozes(blob: bytes, task: str, snoozes: int) -> bytes:
    """The version 2 or 3 envelope ``blob`` of ``task`` as version 4, counting ``snoozes``:
    what snoozes.lua writes (one more element in the array header, the version 4, the
    count after the task name)."""
    name: bytes = msgpack.packb(task, use_bin_type=True)
    count: bytes = msgpack.packb(snoozes)
    head = 2 + len(name)  # the array header, the version (a fixint), the name
    return bytes([blob[0] + 1, 4]) + name + count + blob[head:]


def rescheduled_envelope(blob: bytes, run_at_ms: float) -> bytes:
    """The envelope ``blob`` with another run-at, the rest kept: what a reschedule writes."""
    return encode_envelope(replace(decode_envelope(blob), run_at_ms=run_at_ms))


def envelope_from_packed_data(
    task: str,
    packed_data: bytes,
    run_at_ms: float,
    max_attempts: int,
    timeout_ms: int,
    result_ttl_ms: int,
    expires_after_ms: int = 0,
) -> bytes:
    """The version 2 envelope around data already packed (when validated): msgpack
    elements concatenate, so the data is encoded once. The [1:] slices drop the headers
    of the two short lists packed around the data; 0x90 | n heads an n-element array.
    With ``expires_after_ms``, the version 3 one."""
    if expires_after_ms:
        front, back = envelope_parts(
            task, max_attempts, timeout_ms, result_ttl_ms, expires_after_ms
        )
        return front + packed_data + packed_run_at(run_at_ms) + back
    if (max_attempts, timeout_ms, result_ttl_ms) == _V2_DEFAULT_LIMITS:
        limits = []  # the usual case, a third of the time of the loop below
    else:
        limits = [max_attempts, timeout_ms, result_ttl_ms]
        # Only trailing defaults can go: an element in the middle has no position to skip.
        while limits and limits[-1] == _V2_DEFAULT_LIMITS[len(limits) - 1]:
            limits.pop()
    head = _ENVELOPE_HEADS.get(task)
    if head is None:
        head = msgpack.packb([2, task], use_bin_type=True)[1:]
        if len(_ENVELOPE_HEADS) < _MOST_HEADS:
            _ENVELOPE_HEADS[task] = head
    run_at = _run_at_number(run_at_ms)
    tail: bytes
    if limits:
        tail = msgpack.packb([run_at, *limits])[1:]
    elif type(run_at) is float:  # a run-at to the µs: msgpack writes a float64
        tail = _FLOAT64 + _DOUBLE(run_at)
    elif type(run_at) is int and _UINT32_END <= run_at < _UINT64_END:  # today's epoch ms
        tail = _UINT64 + run_at.to_bytes(8, "big")
    else:
        tail = msgpack.packb([run_at])[1:]
    return _ARRAY_HEADS[_V2_REQUIRED + len(limits)] + head + packed_data + tail


def envelope_parts(
    task: str, max_attempts: int, timeout_ms: int, result_ttl_ms: int, expires_after_ms: int = 0
) -> tuple[bytes, bytes]:
    """The version 2 (with ``expires_after_ms``, 3) envelope around some data and run-at,
    as the two parts a script puts around them: the head (array header, version, task
    name) and the limits after the run-at. ``head + data + run-at + limits`` is the
    envelope that ``envelope_from_packed_data`` makes (the keyed scripts write the run-at
    in Lua)."""
    limits = [max_attempts, timeout_ms, result_ttl_ms]
    version = 2
    if expires_after_ms:
        limits.append(expires_after_ms)
        version = 3
    else:
        while limits and limits[-1] == _V2_DEFAULT_LIMITS[len(limits) - 1]:
            limits.pop()
    head = _ARRAY_HEADS[_V2_REQUIRED + len(limits)]
    head += msgpack.packb([version, task], use_bin_type=True)[1:]
    return head, b"".join(msgpack.packb(limit) for limit in limits)


#: The packed [version, task] pair of each task name seen, without its array header:
#: every envelope of a task starts with the same bytes. Bounded, for odd callers that
#: make up names (each name must be registered by a worker anyway).
_ENVELOPE_HEADS: dict[str, bytes] = {}
_MOST_HEADS = 1024
#: 0x90 | n heads an n-element array; 0xcf a uint64, 0xcb a float64 (big-endian both).
_ARRAY_HEADS = [bytes([0x90 | size]) for size in range(16)]
_UINT64, _FLOAT64 = b"\xcf", b"\xcb"
_DOUBLE = struct.Struct(">d").pack
_UINT32_END, _UINT64_END = 2**32, 2**64


@lru_cache(maxsize=1024)
def packed_run_at(run_at_ms: float) -> bytes:
    """A run-at as an envelope holds it, between the data and the limits of
    ``envelope_parts``. Cached: the ticks of many cron jobs run at the same moment."""
    packed: bytes = msgpack.packb(_run_at_number(run_at_ms))
    return packed


def _run_at_number(run_at_ms: float) -> float:
    """A whole run-at as an int: the same 9 bytes as a float64 for today's epoch, but
    exact and readable as an int by anyone who decodes it."""
    if isinstance(run_at_ms, float) and run_at_ms.is_integer():
        return int(run_at_ms)
    return run_at_ms


def _is_integer(value: object) -> bool:
    # bool is an int subclass in Python, but msgpack true/false is never a number here.
    return isinstance(value, int) and not isinstance(value, bool)


def decode_envelope(blob: bytes) -> Envelope:
    """Read an envelope of version 1 to 4, or raise DecodeError saying why it cannot be run."""
    fields = unpack(blob)
    # The usual envelope, checked at a glance: version 2, default limits, a whole run-at
    # (type() is, so a bool is not taken for an int). Anything else: the full checks.
    if (
        type(fields) is list
        and len(fields) == _V2_REQUIRED
        and type(fields[0]) is int
        and fields[0] == 2
        and type(fields[1]) is str
        and type(fields[3]) is int
    ):
        return Envelope(fields[1], fields[2], fields[3], *_V2_DEFAULT_LIMITS)
    if not isinstance(fields, list) or not fields or not _is_integer(fields[0]):
        raise DecodeError("envelope is not a duetime envelope (expected a versioned msgpack array)")
    version = fields[0]
    if version > ENVELOPE_VERSION:
        raise DecodeError(
            f"envelope format version {version} is newer than this worker understands "
            f"({ENVELOPE_VERSION}); upgrade duetime on the workers"
        )
    if version < 1:
        raise DecodeError(f"envelope version {version} is not a version duetime ever wrote")
    expires_after_ms = snoozes = 0
    if version == 4:
        # The snooze count, taken out; the rest is read as version 2 or 3.
        if len(fields) < 3 or not _is_integer(fields[2]) or fields[2] <= 0:
            raise DecodeError("envelope version 4 has no snooze count")
        snoozes = fields.pop(2)
        version = 3 if len(fields) == _V3_SIZE else 2
    if version == 1:
        if len(fields) != 7:
            raise DecodeError(f"envelope version 1 has {len(fields)} fields, expected 7")
    elif version == 3:
        if len(fields) != _V3_SIZE:
            raise DecodeError(f"envelope version 3 has {len(fields)} fields, expected 8")
        expires_after_ms = fields.pop()
        if not _is_integer(expires_after_ms) or expires_after_ms <= 0:
            raise DecodeError("envelope fields have the wrong types")
    elif not _V2_REQUIRED <= len(fields) <= _V2_REQUIRED + len(_V2_DEFAULT_LIMITS):
        raise DecodeError(f"envelope version 2 has {len(fields)} fields, expected 4 to 7")
    given = fields[_V2_REQUIRED:]
    max_attempts, timeout_ms, result_ttl_ms = given + list(_V2_DEFAULT_LIMITS[len(given) :])
    task, data, run_at_ms = fields[1:_V2_REQUIRED]
    run_at_is_number = _is_integer(run_at_ms) or (
        isinstance(run_at_ms, float) and math.isfinite(run_at_ms)
    )
    if not (
        isinstance(task, str)
        and run_at_is_number
        and all(_is_integer(number) for number in (max_attempts, timeout_ms, result_ttl_ms))
    ):
        raise DecodeError("envelope fields have the wrong types")
    return Envelope(
        task, data, run_at_ms, max_attempts, timeout_ms, result_ttl_ms, expires_after_ms, snoozes
    )


def encode_error(record: ErrorRecord) -> bytes:
    return pack(
        [record.error, record.traceback, record.attempt, record.failed_at_ms, record.worker]
    )


def decode_error(blob: bytes) -> ErrorRecord:
    """The error record, or a stand-in saying it is unreadable (for lists and waits)."""
    try:
        return decode_error_checked(blob)
    except DecodeError:
        return ErrorRecord("(unreadable error record)", "", 0, 0, "")


def decode_error_checked(blob: bytes) -> ErrorRecord:
    """The error record; DecodeError saying why when it cannot be read."""
    try:
        error, traceback, attempt, failed_at_ms, worker = unpack(blob)
        return ErrorRecord(str(error), str(traceback), int(attempt), int(failed_at_ms), str(worker))
    except (ValueError, TypeError) as wrong:
        raise DecodeError(f"not an error record ({wrong})") from None


def encode_result(record: ResultRecord) -> bytes:
    times = [record.started_ms, record.finished_ms, record.attempt]
    try:
        return pack([record.ok, record.value, *times])
    except InvalidPayloadError as error:
        # A return value msgpack cannot hold must not fail a task that succeeded.
        return pack([record.ok, f"<result not storable: {error}>", *times])


def decode_result(blob: bytes) -> ResultRecord:
    """A result record: [ok, value] or [ok, value, started, finished] as older versions
    wrote it, [ok, value, started, finished, attempt], or that and how a task ended
    unfinished, "cancelled" or "expired" (written by the scripts: cancelling.lua)."""
    fields = unpack(blob)
    if not isinstance(fields, list) or len(fields) not in (2, 4, 5, 6):
        raise DecodeError("not a result record")
    if not all(_is_integer(number) for number in fields[2:5]):
        raise DecodeError("result record fields have the wrong types")
    ended = fields[5] if len(fields) == 6 else ""
    if ended not in ("", "cancelled", "expired"):
        raise DecodeError("result record fields have the wrong types")
    record = ResultRecord(bool(fields[0]), *fields[1:5])
    return replace(record, ended=ended) if ended else record
