"""How a request goes on the wire and its replies come back: text the way hiredis can
send it, script calls as EVALSHA commands made as they are sent, the calls the server
refused NOSCRIPT picked out to be sent again, the first refusal among replies raised."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import redis

from duetime.store.plans.requests import Durability, EvalMany
from duetime.store.plans.scripts import Script


def wire_arguments(args: Sequence[Any]) -> list[Any]:
    """Arguments as sent: non-ASCII text is encoded here, with surrogateescape, because
    hiredis packs str strictly; an id read back from Redis that is not UTF-8 (written
    by hand) so goes out as the same bytes it came in as."""
    return [
        arg.encode("utf-8", "surrogateescape")
        if isinstance(arg, str) and not arg.isascii()
        else arg
        for arg in args
    ]


def evalsha_arguments(script: Script, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
    return [script.sha, len(keys), *wire_arguments(keys), *wire_arguments(args)]


def evalsha_commands(
    request: EvalMany, wait: Durability | None = None
) -> Iterator[tuple[Any, ...]]:
    """The EVALSHA commands of a request, each made when it is asked for, then the
    commands of ``wait`` (on the same connection, they confirm these writes)."""
    for keys, args in request.calls:
        yield ("EVALSHA", *evalsha_arguments(request.script, keys, args))
    if wait is not None:
        yield from wait.commands


def only_calls(request: EvalMany, positions: list[int]) -> EvalMany:
    """The calls of ``request`` at ``positions``: those refused NOSCRIPT, sent again once
    the script is loaded the way the first went (on the kept connection, sent as made: a
    pipeline is written whole, which may take longer than the socket timeout)."""
    return EvalMany(request.script, [request.calls[i] for i in positions])


def missing_script(replies: list[Any]) -> list[int]:
    """Positions of pipelined script calls the server answered with NOSCRIPT."""
    return [
        i for i, reply in enumerate(replies) if isinstance(reply, redis.exceptions.NoScriptError)
    ]


def raise_first_error(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
