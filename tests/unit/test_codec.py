from __future__ import annotations

import pickle
from datetime import datetime

import msgpack
import pytest

from duetime import codec
from duetime.codec import Envelope, ErrorRecord, ResultRecord
from duetime.errors import DecodeError, InvalidPayloadError


def test_envelope_round_trip_keeps_bytes_and_text_apart() -> None:
    envelope = Envelope(
        "send", {"to": "a@b", "blob": b"\x00\xff", "n": [1, 2.5, None]}, 5, 3, 1000, 0
    )
    assert codec.decode_envelope(codec.encode_envelope(envelope)) == envelope


def test_tuples_come_back_as_lists() -> None:
    envelope = Envelope("", (1, 2), 0, 1, 1, 0)
    assert codec.decode_envelope(codec.encode_envelope(envelope)).data == [1, 2]


@pytest.mark.parametrize("data", [datetime(2026, 1, 1), {1, 2}, object(), 2**64])
def test_unencodable_data_is_refused(data: object) -> None:
    with pytest.raises(InvalidPayloadError, match="msgpack"):
        codec.pack(data)


def test_newer_envelope_version_is_refused_with_upgrade_hint() -> None:
    blob = msgpack.packb([2, "t", {}, 0, 1, 1, 0, "future field"])
    with pytest.raises(DecodeError, match="newer than this worker"):
        codec.decode_envelope(blob)


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\xc1",  # reserved msgpack byte
        b"not msgpack at all \xff\xfe",
        msgpack.packb({"a": 1}),
        msgpack.packb([1, "t", {}]),
        msgpack.packb([1, 5, {}, 0, 1, 1, 0]),
        pickle.dumps({"a": 1}),
    ],
)
def test_garbage_envelopes_raise_decode_error(blob: bytes) -> None:
    with pytest.raises(DecodeError):
        codec.decode_envelope(blob)


def test_error_record_round_trip_and_unreadable_record() -> None:
    record = ErrorRecord("ValueError: x", "Traceback...", 2, 123, "w1")
    assert codec.decode_error(codec.encode_error(record)) == record
    assert codec.decode_error(b"\xc1").error == "(unreadable error record)"


def test_unstorable_result_does_not_fail_the_task() -> None:
    stored = codec.decode_result(codec.encode_result(ResultRecord(True, object())))
    assert stored.ok is True
    assert "result not storable" in stored.value
