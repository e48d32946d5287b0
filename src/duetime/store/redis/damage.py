"""Name the damaged key behind a WRONGTYPE refusal.

Redis says only that "a key" holds the wrong kind of value. When a request is refused
so, the runner asks TYPE of each key the request names (the keys of a script call, the
first argument of a lone command or of a read-only batch's commands; nothing more is
sent while all is well) and raises ``DamagedKeyError`` naming each key of the queue
that holds another type than duetime keeps there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from duetime.errors import DamagedKeyError
from duetime.store.plans.keys import key_type
from duetime.store.plans.requests import Batch, Command, Durably, Eval, Request

#: Most keys asked about for one refusal (a large schedule_many names many buckets).
MOST_KEYS = 1000


def is_wrong_type(error: Exception) -> bool:
    # A pipeline's refusal starts "Command # n (...) of pipeline caused error: WRONGTYPE".
    return "WRONGTYPE" in str(error)


def suspects(request: Request, error: Exception) -> list[str]:
    """The keys to ask TYPE of when ``request`` was refused WRONGTYPE (else none): the
    keys of its script calls, or the first argument of a lone command or of each command of
    a read-only batch, where it names a key of a queue."""
    if not is_wrong_type(error):
        return []
    named: list[Any]
    if isinstance(request, Eval):
        named = list(request.keys)
    elif isinstance(request, Command):
        named = list(request.args[1:2])
    elif isinstance(request, Batch):
        if not request.read_only:
            return []  # its other commands are applied: not "the call changed nothing"
        named = [command.args[1] for command in request.commands if len(command.args) > 1]
    else:
        calls = request.calls if isinstance(request, Durably) else request
        named = [key for keys, _ in calls.calls for key in keys]
    keys = (key for key in named if isinstance(key, str) and key_type(key) is not None)
    return list(dict.fromkeys(keys))[:MOST_KEYS]


def types_of(keys: Sequence[str]) -> Batch:
    """TYPE of each key, in one round trip (asked only after a WRONGTYPE refusal)."""
    return Batch(tuple(Command(("TYPE", key)) for key in keys), read_only=True)


def damaged_key_error(
    address: str, request: Request, refusal: Exception, keys: Sequence[str], types: Sequence[Any]
) -> DamagedKeyError | None:
    """The error naming each key whose TYPE (``types``, in the order of ``keys``) is
    neither absent nor what duetime keeps there; None if none is (then the refusal is
    reported as it came)."""
    damaged: dict[str, str] = {}
    for key, reply in zip(keys, types, strict=True):
        held = reply.decode() if isinstance(reply, bytes) else str(reply)
        expected = key_type(key)
        if expected is not None and held not in ("none", expected):
            damaged[key] = held
    if not damaged:
        return None
    named = "; ".join(
        f"{key} holds a {held} where duetime keeps a {key_type(key)}"
        for key, held in damaged.items()
    )
    return DamagedKeyError(
        f"Redis at {address} refused a call ({str(refusal).split(' script:')[0]}): "
        f"{named}. {_what_changed(request)} That key was written by hand or by another "
        "program: move it aside (RENAME) or delete it to let the queue work again",
        damaged,
    )


def _what_changed(request: Request) -> str:
    if isinstance(request, Eval | Command | Batch):
        return "The call changed nothing."
    # A large schedule_many is several script calls, each applied or refused on its own.
    return (
        "The refused script call changed nothing; other calls of the request may have been applied."
    )
