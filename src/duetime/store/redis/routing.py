"""Where a request goes, and the pipelines that carry several: on a cluster, a command
that names no key goes to the node of its plan's route key, a script call to its slot's
node, WAIT to each master the calls wrote to, SCRIPT LOAD to every primary; off a
cluster, all of it to the one server."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import redis

from duetime.store.plans.requests import Batch, Command, Durability, EvalMany, ScriptCall
from duetime.store.redis.failures import translated_refusal
from duetime.store.redis.wire import evalsha_arguments, raise_first_error, wire_arguments


class Runner(Protocol):
    """A runner (sync or asyncio), as routing needs it."""

    client: Any
    clustered: bool  # a RedisCluster client: keyless commands need a route
    address: str


def routed(runner: Runner, client: Any, command: Command) -> dict[str, Any]:
    """On a cluster, a command that names no key (TIME, SCAN, CONFIG GET) is sent to the
    node that holds its route key's slot: the queue's node, whose clock and keys count."""
    if not runner.clustered or command.route is None:
        return {}
    return {"target_nodes": client.get_node_from_key(command.route)}


def wait_targets(runner: Runner, calls: Sequence[ScriptCall]) -> list[Any]:
    """Where WAIT goes, after the writes and on the same connection: the one server, or
    on a cluster each master the calls write to (a cluster pipeline sends each master's
    commands, in order, on one connection of that master)."""
    if not runner.clustered:
        return [None]
    nodes = {}
    for keys, _ in calls:
        node = runner.client.get_node_from_key(keys[0])
        nodes[node.name] = node
    return list(nodes.values())


def with_confirmations(
    runner: Runner,
    calls: Sequence[ScriptCall],
    wait: Durability,
    targets: list[Any],
    replies: list[Any],
) -> tuple[list[Any], list[Any] | None]:
    """The script replies (a refused one raises) and, for each target, its last wait's
    reply or the refusal of one of its waits (the waits come last). None for the latter
    when, on a cluster, a write was redirected to another master (a slot moved
    meanwhile): it went out on another connection, which no wait covered."""
    steps = len(wait.commands)
    waits = len(targets) * steps
    written = raise_first_error(replies[:-waits])
    now_at = [node.name for node in wait_targets(runner, calls)] if runner.clustered else []
    if now_at != [node.name for node in targets if node is not None]:
        return written, None
    confirmations = []
    for start in range(len(replies) - waits, len(replies), steps):
        group = replies[start : start + steps]
        refused = [reply for reply in group if isinstance(reply, redis.RedisError)]
        confirmations.append(
            translated_refusal(runner.address, refused[0]) if refused else group[-1]
        )
    return written, confirmations


def to_node(target: Any) -> dict[str, Any]:
    """The routing of a command to one cluster node (none off a cluster)."""
    return {} if target is None else {"target_nodes": target}


def batch_pipeline(client: Any, request: Batch, transaction: bool) -> Any:
    """A pipeline (sync or asyncio, as ``client`` is) holding a batch's commands."""
    pipe = client.pipeline(transaction=transaction)
    for command in request.commands:
        pipe.execute_command(*wire_arguments(command.args))
    return pipe


def to_slot_node(runner: Runner, keys: Sequence[str]) -> dict[str, Any]:
    """On a cluster, the node of a script call's slot (its keys share one hash tag), given
    to redis-py so that a cluster pipeline does not look the keys up itself: it would
    ask its default node (COMMAND GETKEYS), a round trip per call, and fail while that
    one node is down even for calls to healthy masters."""
    if not runner.clustered or not keys:
        return {}
    return {"target_nodes": runner.client.get_node_from_key(keys[0])}


def script_pipeline(
    runner: Runner,
    request: EvalMany,
    wait: Durability | None,
    targets: Sequence[Any],
) -> Any:
    """A pipeline of script calls, then with ``wait`` a WAIT for each target. EVALSHA goes
    as a plain command: a cluster pipeline routes it, but blocks its evalsha method."""
    pipe = runner.client.pipeline(transaction=False)
    for keys, args in request.calls:
        pipe.execute_command(
            "EVALSHA", *evalsha_arguments(request.script, keys, args), **to_slot_node(runner, keys)
        )
    for target in targets:
        assert wait is not None
        for command in wait.commands:
            pipe.execute_command(*command, **to_node(target))
    return pipe


def scan_reply(reply: Any) -> Any:
    """A cluster client answers SCAN with ({node: cursor}, keys); plans expect the
    server's own [cursor, keys] (one node is asked: the queue's)."""
    if isinstance(reply, tuple) and len(reply) == 2 and isinstance(reply[0], dict):
        [cursor] = reply[0].values()
        return [cursor, reply[1]]
    return reply


def to_primaries(runner: Runner) -> dict[str, Any]:
    """Where SCRIPT LOAD goes: on a cluster, every primary (any may own a queue after a
    failover or a resharding)."""
    return {"target_nodes": "primaries"} if runner.clustered else {}
