"""Debounce, throttle and unique by key, as a program states them: ``Debounce``,
``Throttle`` and ``Unique``, each checked when made, and what a keyed schedule call
answers (``Scheduled``) or a task's status shows of its key (``KeyedState``). How they
act is the Lua side's (store/lua/debounce_task.lua, throttle_task.lua,
schedule_unique.lua); docs/timing-control.md says what a user gets."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Final

from duetime.errors import InvalidOptionError
from duetime.states import KeyedOutcome, TaskState
from duetime.validation import milliseconds, shown, whole_number

#: A key's longest UTF-8 form: it is stored in the key's record, once.
KEY_BYTES: Final = 200
#: Most calls one debounced task collects with collect="all" (the list's msgpack header
#: holds up to 65,535).
MOST_COLLECTED: Final = 10_000
DEFAULT_COLLECTED: Final = 100
COLLECT_MODES: Final = ("last", "all")
UNTIL_MODES: Final = ("started", "finished")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

Seconds = int | float | timedelta


def keyed_key(value: object, mode: str) -> str:
    """A debounce, throttle or unique key: 1 to 200 bytes of UTF-8, no control
    characters (the rule of a limit key)."""
    if not isinstance(value, str) or not value:
        raise InvalidOptionError(f"a {mode} key must be a non-empty string, got {shown(value)}")
    if _CONTROL.search(value):
        raise InvalidOptionError(f"a {mode} key may not hold control characters: {shown(value)}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > KEY_BYTES:
        raise InvalidOptionError(
            f"a {mode} key is {size} bytes; at most {KEY_BYTES}: {shown(value, 40)}"
        )
    return value


def _choice(value: object, what: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        choices = " or ".join(repr(choice) for choice in allowed)
        raise InvalidOptionError(f"{what} must be {choices}, got {shown(value)}")
    return str(value)


@dataclass(frozen=True, slots=True)
class Debounce:
    """Trailing debounce: calls with this key collapse into one task, which runs once the
    key has been quiet for ``window`` seconds after the last call's run-at. ``max_wait``
    (seconds from the first call's run-at, at least the window) caps how far calls can
    push it; the first call fixes that deadline. ``collect``: the task gets the last
    call's data ("last"), or the list of every call's data in call order ("all", at most
    ``most`` calls and Settings.max_payload_bytes of data: past either, the task runs at
    once with what it holds and the call starts a new one)."""

    key: str
    window: Seconds
    max_wait: Seconds | None = None
    collect: str = "last"
    most: int = DEFAULT_COLLECTED
    window_ms: int = field(init=False, repr=False, compare=False)
    max_wait_ms: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        keyed_key(self.key, "debounce")
        window_ms = milliseconds(self.window, "a debounce window")
        max_wait_ms = 0
        if self.max_wait is not None:
            max_wait_ms = milliseconds(self.max_wait, "a debounce max_wait")
            if max_wait_ms < window_ms:
                raise InvalidOptionError(
                    f"a debounce max_wait ({shown(self.max_wait)} s) must be at least its "
                    f"window ({shown(self.window)} s): the first call's task would never "
                    "wait out its window"
                )
        _choice(self.collect, "a debounce collect", COLLECT_MODES)
        whole_number(self.most, "a debounce most", 1, MOST_COLLECTED)
        object.__setattr__(self, "window_ms", window_ms)
        object.__setattr__(self, "max_wait_ms", max_wait_ms)


@dataclass(frozen=True, slots=True)
class Throttle:
    """Leading throttle: the first call with this key runs at its run-at and opens a
    window of ``window`` seconds; calls whose run-at falls in it are dropped, or with
    ``trailing=True`` folded into one run at the window's end with the last such call's
    data (that run opens the next window)."""

    key: str
    window: Seconds
    trailing: bool = False
    window_ms: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        keyed_key(self.key, "throttle")
        if not isinstance(self.trailing, bool):
            trailing = shown(self.trailing)
            raise InvalidOptionError(f"throttle trailing must be True or False, got {trailing}")
        object.__setattr__(self, "window_ms", milliseconds(self.window, "a throttle window"))


@dataclass(frozen=True, slots=True)
class Unique:
    """At most one live task per key: while the key's task has not started
    (``until="started"``) or has not finished (``until="finished"``: dead counts as
    finished), another call makes nothing and answers with that task."""

    key: str
    until: str = "started"

    def __post_init__(self) -> None:
        keyed_key(self.key, "unique")
        _choice(self.until, "unique until", UNTIL_MODES)


#: One of the three modes of a keyed schedule call.
KeyedMode = Debounce | Throttle | Unique
#: The mode of each kind, by the letter its records' fields start with.
MODE_NAMES: Final = {"d": "debounce", "t": "throttle", "u": "unique"}


def field_of(mode: KeyedMode) -> str:
    """The field of a key's record in the keyed hash: "<mode letter>:<key>"."""
    letter = "d" if isinstance(mode, Debounce) else "t" if isinstance(mode, Throttle) else "u"
    return f"{letter}:{mode.key}"


def checked_mode(
    debounce: object = None, throttle: object = None, unique: object = None, task_id: object = None
) -> KeyedMode | None:
    """The one keyed mode of a schedule call (None when it has none), checked; a keyed
    call takes no ``id`` of its own."""
    if debounce is None and throttle is None and unique is None:
        return None
    given = [
        (name, value, kind)
        for name, value, kind in (
            ("debounce", debounce, Debounce),
            ("throttle", throttle, Throttle),
            ("unique", unique, Unique),
        )
        if value is not None
    ]
    if not given:
        return None
    if len(given) > 1:
        names = " and ".join(name for name, _, _ in given)
        raise InvalidOptionError(f"give at most one of debounce, throttle and unique, not {names}")
    name, value, kind = given[0]
    if not isinstance(value, kind):
        raise InvalidOptionError(
            f"{name} must be a duetime.{kind.__name__}(...), got {shown(value)}"
        )
    if task_id is not None:
        raise InvalidOptionError(
            f"a task scheduled with {name} gets its id from duetime (the key's record "
            "names it): leave out id"
        )
    return value


@dataclass(frozen=True, slots=True)
class Scheduled:
    """What a keyed schedule call did. ``id`` is the task that carries the call (for a
    dropped call, the window's leading run; for a unique hit, the live task). Times are
    epoch seconds by the server clock."""

    id: str
    outcome: KeyedOutcome  # created | collapsed | dropped | existing
    #: When the task that carries the call runs (None: a dropped call, or a unique hit).
    run_at: float | None
    #: Debounce: the calls the task carries; throttle: the calls in the window; unique:
    #: the calls that found the task live.
    calls: int
    #: Debounce: the max_wait deadline (None without one); throttle: the window's end.
    until: float | None = None
    state: TaskState | None = None  # unique: the task's state


@dataclass(frozen=True, slots=True)
class KeyedState:
    """What a task's key holds, as ``status()`` shows it on the key's current task."""

    mode: str  # debounce | throttle | unique
    key: str
    #: Debounce: the calls the task carries; throttle: calls in the window; unique: the
    #: calls that found the task live.
    calls: int
    #: Debounce: the max_wait deadline (epoch seconds; None without one); throttle: the
    #: window's end.
    until: float | None = None
    collect: str | None = None  # debounce
    unique_until: str | None = None  # unique: started | finished


def keyed_state(field_name: str, record: str) -> KeyedState | None:
    """A key's state from its field and record as the scripts keep them; None for a
    record that does not parse (garbage: the checker reports it)."""
    letter, _, key = field_name.partition(":")
    parts = record.split("|")
    mode = MODE_NAMES.get(letter)
    try:
        if mode == "debounce" and len(parts) == 8:
            until = int(parts[2]) / 1000 if parts[2] else None
            return KeyedState(mode, key, int(parts[3]), until, collect=parts[7])
        if mode == "throttle" and len(parts) == 7:
            return KeyedState(mode, key, int(parts[2]), int(parts[1]) / 1000)
        if mode == "unique" and len(parts) == 3:
            return KeyedState(mode, key, int(parts[2]), unique_until=parts[1])
    except ValueError:
        return None
    return None


def record_task_ids(field_name: str, record: str) -> list[str]:
    """The tasks a key's record names: its task (debounce, unique), or its window's
    leading run and trailing run (throttle)."""
    parts = record.split("|")
    if field_name.startswith("t:") and len(parts) > 3:
        return [task_id for task_id in (parts[0], parts[3]) if task_id]
    return parts[:1]
