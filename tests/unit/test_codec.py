from __future__ import annotations

import pickle
from datetime import datetime
from typing import Any

import msgpack
import pytest

from duetime import codec
from duetime.codec import Envelope, ErrorRecord, ResultRecord
from duetime.errors import DecodeError, InvalidPayloadError
from duetime.settings import DEFAULT_SETTINGS


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
    blob = msgpack.packb([codec.ENVELOPE_VERSION + 1, "t", {}, 0, 1, 1, 0, "future field"])
    with pytest.raises(DecodeError, match="newer than this worker"):
        codec.decode_envelope(blob)


# --- envelope format version 2 ---------------------------------------------------------

DEFAULT_LIMITS = (
    codec.V2_DEFAULT_MAX_ATTEMPTS,
    codec.V2_DEFAULT_TIMEOUT_MS,
    codec.V2_DEFAULT_RESULT_TTL_MS,
)


def test_v2_defaults_equal_the_settings_defaults() -> None:
    """The format's defaults are fixed; they only save bytes while they match the library's
    defaults, so a change of either must be a deliberate change of both (or a version 3)."""
    assert DEFAULT_SETTINGS.max_attempts == codec.V2_DEFAULT_MAX_ATTEMPTS
    assert round(DEFAULT_SETTINGS.task_timeout * 1000) == codec.V2_DEFAULT_TIMEOUT_MS
    assert codec.V2_DEFAULT_RESULT_TTL_MS == 0


@pytest.mark.parametrize(
    ("limits", "stored"),
    [
        (DEFAULT_LIMITS, []),
        ((3, codec.V2_DEFAULT_TIMEOUT_MS, 0), [3]),
        ((codec.V2_DEFAULT_MAX_ATTEMPTS, 1000, 0), [codec.V2_DEFAULT_MAX_ATTEMPTS, 1000]),
        (
            (codec.V2_DEFAULT_MAX_ATTEMPTS, codec.V2_DEFAULT_TIMEOUT_MS, 60_000),
            [*DEFAULT_LIMITS[:2], 60_000],
        ),
        ((1, 2, 3), [1, 2, 3]),
    ],
)
def test_v2_omits_only_trailing_defaults_and_round_trips(
    limits: tuple[int, int, int], stored: list[int]
) -> None:
    envelope = Envelope("send", {"to": "a@b"}, 1_763_800_000_123, *limits)
    blob = codec.encode_envelope(envelope)
    assert blob[0] == 0x90 | (4 + len(stored))
    assert msgpack.unpackb(blob) == [2, "send", {"to": "a@b"}, 1_763_800_000_123, *stored]
    assert codec.decode_envelope(blob) == envelope


@pytest.mark.parametrize("run_at_ms", [0, 1_763_800_000_123, 1_763_800_000_123.457, 0.001])
def test_v2_run_at_round_trips_as_int_or_float(run_at_ms: float) -> None:
    envelope = Envelope("", {"i": 1}, run_at_ms, *DEFAULT_LIMITS)
    decoded = codec.decode_envelope(codec.encode_envelope(envelope))
    assert decoded.run_at_ms == run_at_ms
    assert type(decoded.run_at_ms) is type(run_at_ms)


def test_v2_whole_float_run_at_is_stored_as_an_int() -> None:
    blob = codec.envelope_from_packed_data("", codec.pack({}), 1_763_800_000_123.0, *DEFAULT_LIMITS)
    run_at = codec.decode_envelope(blob).run_at_ms
    assert run_at == 1_763_800_000_123
    assert isinstance(run_at, int)


def test_v2_envelope_of_the_benchmark_payload_is_38_bytes() -> None:
    """Array header 1 + version 1 + empty task name 1 + data 26 + run-at 9 (a float64 or
    uint64 for today's epoch ms); version 1 added 7 bytes of limits (attempts 1, timeout
    300,000 as uint32 5, result TTL 1) for 45."""
    data = codec.pack({"i": 65000, "to": "user@example.com"})
    assert len(data) == 26
    for run_at_ms in (1_763_800_000_123, 1_763_800_000_123.457):
        blob = codec.envelope_from_packed_data("", data, run_at_ms, *DEFAULT_LIMITS)
        assert len(blob) == 38
    version_1 = msgpack.packb(
        [1, "", {"i": 65000, "to": "user@example.com"}, 1_763_800_000_123, *DEFAULT_LIMITS]
    )
    assert len(version_1) == 45


def test_v1_envelopes_still_decode() -> None:
    blob = msgpack.packb([1, "send", {"to": "a@b"}, 1_763_800_000_123, 3, 1000, 0])
    assert codec.decode_envelope(blob) == Envelope(
        "send", {"to": "a@b"}, 1_763_800_000_123, 3, 1000, 0
    )
    with_defaults = msgpack.packb([1, "", {}, 5, *DEFAULT_LIMITS])
    assert codec.decode_envelope(with_defaults) == Envelope("", {}, 5, *DEFAULT_LIMITS)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ([1, "t", {}, 0, 1, 1], "expected 7"),  # version 1 never omits anything
        ([1, "t", {}, 0], "expected 7"),
        ([1, "t", {}, 0, 1, 1, 0, 0], "expected 7"),
        ([2, "t", {}], "expected 4 to 7"),
        ([2, "t", {}, 0, 1, 1, 0, 0], "expected 4 to 7"),
        ([2], "expected 4 to 7"),
        ([2, b"t", {}, 0], "wrong types"),
        ([2, "t", {}, "0"], "wrong types"),
        ([2, "t", {}, None], "wrong types"),
        ([2, "t", {}, True], "wrong types"),
        ([2, "t", {}, float("nan")], "wrong types"),
        ([2, "t", {}, float("inf")], "wrong types"),
        ([2, "t", {}, 0, 1.5], "wrong types"),
        ([2, "t", {}, 0, 5, None], "wrong types"),
        ([2, "t", {}, 0, 5, 1000, False], "wrong types"),
        ([True, "t", {}, 0], "not a duetime envelope"),
        ([0, "t", {}, 0], "version 0"),
        ([-1, "t", {}, 0], "not a version duetime ever wrote"),
    ],
)
def test_malformed_envelopes_are_refused(fields: list[object], message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        codec.decode_envelope(msgpack.packb(fields))


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


def test_a_pack_inside_a_pack_does_not_share_the_packer() -> None:
    """Packers are kept per thread; one in use is never lent to a pack made inside it
    (here by a mapping whose items() packs), which would empty the outer one's buffer."""
    inner: list[bytes] = []

    class Packing(dict[str, int]):
        def items(self) -> Any:
            inner.append(codec.pack(["inside", 1]))
            return super().items()

    outer = codec.pack(["outside", Packing(a=1)])
    assert codec.unpack(outer) == ["outside", {"a": 1}]
    assert codec.unpack(inner[0]) == ["inside", 1]


# --- envelope format version 3: expires ------------------------------------------------


def test_an_envelope_with_expires_is_version_3_and_round_trips() -> None:
    envelope = Envelope("send", {"n": 1}, 1_800_000_000_123, 5, 300_000, 0, 2500)
    blob = codec.encode_envelope(envelope)
    assert msgpack.unpackb(blob)[0] == 3 and len(msgpack.unpackb(blob)) == 8
    assert codec.decode_envelope(blob) == envelope
    head, limits = codec.envelope_parts("send", 5, 300_000, 0, 2500)
    assert head + codec.pack({"n": 1}) + msgpack.packb(1_800_000_000_123) + limits == blob
    plain = codec.encode_envelope(Envelope("send", {"n": 1}, 1_800_000_000_123, 5, 300_000, 0))
    assert msgpack.unpackb(plain)[0] == 2  # without expires: as before


@pytest.mark.parametrize(
    "fields",
    [
        [3, "t", {}, 0, 5, 1, 0, 0],  # expires 0 is never written
        [3, "t", {}, 0, 5, 1, 0, -5],
        [3, "t", {}, 0, 5, 1, 0, "soon"],
        [3, "t", {}, 0, 5, 1, 0],  # version 3 always has all eight
    ],
)
def test_a_version_3_envelope_with_a_bad_expiry_is_refused(fields: list[object]) -> None:
    with pytest.raises(DecodeError):
        codec.decode_envelope(msgpack.packb(fields))


@pytest.mark.parametrize("ended", ["cancelled", "expired"])
def test_a_result_record_says_how_an_unfinished_task_ended(ended: str) -> None:
    blob = msgpack.packb([False, ended, 0, 1_800_000_000_000, 2, ended])
    assert codec.decode_result(blob) == ResultRecord(False, ended, 0, 1_800_000_000_000, 2, ended)
    with pytest.raises(DecodeError):
        codec.decode_result(msgpack.packb([False, ended, 0, 1, 2, "other"]))
