"""The msgpack envelope a task travels in, and the records stored beside it.

An envelope is written once by the client and never rewritten by Lua: scripts
move task ids between structures and keep per-attempt state (attempt counts,
errors) in their own hashes, so they never need to decode or re-encode user data.
Pickle is never used; only msgpack types round-trip (tuples come back as lists).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from duetime.errors import DecodeError, InvalidPayloadError

#: Bumped when the envelope layout changes; a worker refuses envelopes newer than it knows.
ENVELOPE_VERSION = 1


@dataclass(frozen=True, slots=True)
class Envelope:
    """What a worker needs to run one task."""

    task: str  # registered handler name; "" means the queue's default handler
    data: Any
    run_at_ms: int
    max_attempts: int
    timeout_ms: int
    result_ttl_ms: int  # 0: keep no result


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


def pack(value: Any) -> bytes:
    """Encode with msgpack, refusing anything msgpack cannot represent natively."""
    try:
        return msgpack.packb(value, use_bin_type=True, datetime=False)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as error:
        raise InvalidPayloadError(
            f"task data cannot be encoded with msgpack ({error}); use dicts, lists, str, "
            "bytes, int, float, bool and None only"
        ) from error


def unpack(blob: bytes) -> Any:
    try:
        return msgpack.unpackb(blob, raw=False, strict_map_key=False, timestamp=0)
    except Exception as error:  # msgpack raises several unrelated types on bad input
        raise DecodeError(
            f"not a valid msgpack document ({type(error).__name__}: {error})"
        ) from error


def encode_envelope(envelope: Envelope) -> bytes:
    return envelope_from_packed_data(
        envelope.task,
        pack(envelope.data),
        envelope.run_at_ms,
        envelope.max_attempts,
        envelope.timeout_ms,
        envelope.result_ttl_ms,
    )


def envelope_from_packed_data(
    task: str,
    packed_data: bytes,
    run_at_ms: int,
    max_attempts: int,
    timeout_ms: int,
    result_ttl_ms: int,
) -> bytes:
    """The envelope around data already packed (when validated): msgpack elements
    concatenate, so the data is encoded once. 0x97 heads a 7-element array; the
    [1:] slices drop the headers of the two short lists packed around the data."""
    head: bytes = msgpack.packb([ENVELOPE_VERSION, task], use_bin_type=True)
    tail: bytes = msgpack.packb([run_at_ms, max_attempts, timeout_ms, result_ttl_ms])
    return b"\x97" + head[1:] + packed_data + tail[1:]


def decode_envelope(blob: bytes) -> Envelope:
    """Read an envelope, or raise DecodeError saying why it cannot be run."""
    fields = unpack(blob)
    if not isinstance(fields, list) or not fields or not isinstance(fields[0], int):
        raise DecodeError("envelope is not a duetime envelope (expected a versioned msgpack array)")
    version = fields[0]
    if version > ENVELOPE_VERSION:
        raise DecodeError(
            f"envelope format version {version} is newer than this worker understands "
            f"({ENVELOPE_VERSION}); upgrade duetime on the workers"
        )
    if version < 1:
        raise DecodeError(f"envelope version {version} is not a version duetime ever wrote")
    if len(fields) != 7:
        raise DecodeError(f"envelope version {version} has {len(fields)} fields, expected 7")
    _, task, data, run_at_ms, max_attempts, timeout_ms, result_ttl_ms = fields
    if not isinstance(task, str) or not all(
        isinstance(number, int) for number in (run_at_ms, max_attempts, timeout_ms, result_ttl_ms)
    ):
        raise DecodeError("envelope fields have the wrong types")
    return Envelope(task, data, run_at_ms, max_attempts, timeout_ms, result_ttl_ms)


def encode_error(record: ErrorRecord) -> bytes:
    return pack(
        [record.error, record.traceback, record.attempt, record.failed_at_ms, record.worker]
    )


def decode_error(blob: bytes) -> ErrorRecord:
    try:
        error, traceback, attempt, failed_at_ms, worker = unpack(blob)
        return ErrorRecord(str(error), str(traceback), int(attempt), int(failed_at_ms), str(worker))
    except (DecodeError, ValueError, TypeError):
        return ErrorRecord("(unreadable error record)", "", 0, 0, "")


def encode_result(record: ResultRecord) -> bytes:
    try:
        return pack([record.ok, record.value, record.started_ms, record.finished_ms])
    except InvalidPayloadError as error:
        # A return value msgpack cannot hold must not fail a task that succeeded.
        text = f"<result not storable: {error}>"
        return pack([record.ok, text, record.started_ms, record.finished_ms])


def decode_result(blob: bytes) -> ResultRecord:
    fields = unpack(blob)
    if not isinstance(fields, list) or len(fields) not in (2, 4):
        raise DecodeError("not a result record")
    return ResultRecord(bool(fields[0]), *fields[1:])
