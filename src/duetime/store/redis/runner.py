"""Run plans on redis-py: a synchronous runner and an asyncio one, the only code that
sends a command to a server.

A plan yields requests (``duetime.store.plans.requests``) and is sent each one's reply.
This module follows a request on its way, top to bottom:

- what a runner is: two clients from one address (see ``connections``), one for
  ordinary commands with a short socket timeout and one for blocking commands (BLMOVE,
  BLPOP) whose socket timeout is longer than the longest block, so a hung socket fails
  in bounded time either way; off a cluster, a connection kept for script calls (see
  ``kept``);
- its arguments on the wire, and scripts called by SHA and loaded again after NOSCRIPT
  (a restarted or failed-over server has an empty script cache);
- where it goes on a cluster: a command that names no key to the node of its plan's
  route key, a script call to its slot's node, WAIT to each master the calls wrote to,
  SCRIPT LOAD to every primary; and the pipelines that carry several commands;
- running a plan, written out once for each runner;
- redis-py's errors turned into ``duetime.errors`` (the URL's password masked; nothing
  from redis-py escapes), and a plan that chokes on data duetime never wrote;
- the damaged key named behind a WRONGTYPE refusal.
"""

# Long: one job, a request's way to the server and back, read in the order it travels;
# cut into five files by size, it took a reader following one plan 23 hops between them.

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol, TypeVar

import redis
import redis.asyncio

from duetime.errors import (
    CorruptStateError,
    DamagedKeyError,
    DuetimeError,
    RedisCommandError,
    RedisOutOfMemoryError,
    RedisUnavailableError,
)
from duetime.settings import Settings
from duetime.store.plans.keys import key_type
from duetime.store.plans.requests import (
    Batch,
    Command,
    Durability,
    Durably,
    Eval,
    EvalMany,
    Plan,
    Request,
    ScriptCall,
)
from duetime.store.plans.scripts import Script
from duetime.store.redis.connections import (
    BLOCK_MARGIN,
    RedisSpec,
    connect,
    embedded_url,
    embedded_wanted,
    mask_url,
    mask_urls_in,
    resolve_url,
    start_embedded,
)
from duetime.store.redis.kept import NOT_SENT, AsyncKeptConnection, KeptConnection

T = TypeVar("T")

__all__ = [
    "BLOCK_MARGIN",
    "AsyncRunner",
    "RedisSpec",
    "SyncRunner",
    "mask_url",
    "mask_urls_in",
    "resolve_url",
]


# --- what a runner is ------------------------------------------------------------------


class Runner(Protocol):
    """A runner, sync (``SyncRunner``) or asyncio (``AsyncRunner``), as the helpers below
    see it. Each also has a ``blocking_client`` for BLMOVE and BLPOP, and off a cluster a
    connection kept for script calls."""

    client: Any  # ordinary commands, script calls and pipelines
    address: str  # printable, password masked: what errors name
    clustered: bool  # a RedisCluster client: keyless commands need a route
    loaded_scripts: set[str]  # see _load_first


# --- arguments on the wire; EVALSHA and NOSCRIPT ---------------------------------------


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


def _load_first(runner: Runner, request: EvalMany, durable: bool = False) -> bool:
    """Whether to load a script before a request of several calls of it, or of one call
    and a wait for replicas: before the first such request of each script in this
    runner. A server without the script would refuse every call, each made and sent for
    nothing (a large schedule_many on a server that has so far run only single calls),
    and a durable request refused so would have waited for replicas for nothing too,
    then again when sent again (twice ``durable_timeout`` when none confirms); a later
    refusal is handled as it comes."""
    if (len(request.calls) < 2 and not durable) or request.script.sha in runner.loaded_scripts:
        return False
    runner.loaded_scripts.add(request.script.sha)
    return True


def missing_script(replies: list[Any]) -> list[int]:
    """Positions of pipelined script calls the server answered with NOSCRIPT."""
    return [
        i for i, reply in enumerate(replies) if isinstance(reply, redis.exceptions.NoScriptError)
    ]


def only_calls(request: EvalMany, positions: list[int]) -> EvalMany:
    """The calls of ``request`` at ``positions``: those refused NOSCRIPT, sent again once
    the script is loaded the way the first went (on the kept connection, sent as made: a
    pipeline is written whole, which may take longer than the socket timeout)."""
    return EvalMany(request.script, [request.calls[i] for i in positions])


def raise_first_error(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


# --- cluster routing and pipelines -----------------------------------------------------


def routed(runner: Runner, client: Any, command: Command) -> dict[str, Any]:
    """On a cluster, a command that names no key (TIME, SCAN, CONFIG GET) is sent to the
    node that holds its route key's slot: the queue's node, whose clock and keys count."""
    if not runner.clustered or command.route is None:
        return {}
    return {"target_nodes": client.get_node_from_key(command.route)}


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


def to_slot_node(runner: Runner, keys: Sequence[str]) -> dict[str, Any]:
    """On a cluster, the node of a script call's slot (its keys share one hash tag), given
    to redis-py so that a cluster pipeline does not look the keys up itself: it would
    ask its default node (COMMAND GETKEYS), a round trip per call, and fail while that
    one node is down even for calls to healthy masters."""
    if not runner.clustered or not keys:
        return {}
    return {"target_nodes": runner.client.get_node_from_key(keys[0])}


def to_node(target: Any) -> dict[str, Any]:
    """The routing of a command to one cluster node (none off a cluster)."""
    return {} if target is None else {"target_nodes": target}


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


def batch_pipeline(client: Any, request: Batch, transaction: bool) -> Any:
    """A pipeline (sync or asyncio, as ``client`` is) holding a batch's commands."""
    pipe = client.pipeline(transaction=transaction)
    for command in request.commands:
        pipe.execute_command(*wire_arguments(command.args))
    return pipe


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


# --- running a plan --------------------------------------------------------------------


class SyncRunner:
    """Runs plans on a synchronous redis-py client."""

    def __init__(self, spec: RedisSpec, settings: Settings) -> None:
        connection = connect(spec, settings, asynchronous=False)
        self.client, self.blocking_client = connection.main, connection.blocking
        self.address, self.clustered = connection.address, connection.clustered
        self._helpers = connection.helpers
        self._closing = connection.closing
        #: When commands were last held by a Sentinel failover (time.monotonic; 0.0 never).
        self.interrupted_at = connection.interrupted_at
        self._kept = None if self.clustered else KeptConnection(self.client)
        self.loaded_scripts: set[str] = set()  # see _load_first

    def run(self, plan: Plan[T]) -> T:
        reply: Any = None
        with as_duetime_errors(self):
            while True:
                try:
                    request = advance(plan, reply)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                try:
                    reply = self._execute(request)
                except redis.ResponseError as error:
                    raise self._explained(request, error) from None

    def _execute(self, request: Request) -> Any:
        if isinstance(request, Command):
            client = self.client if request.block is None else self.blocking_client
            try:
                reply = client.execute_command(
                    *wire_arguments(request.args), **routed(self, client, request)
                )
            except REDIS_ERRORS as error:
                return failure_reply(self, request, error)
            return scan_reply(reply)
        if isinstance(request, Eval):
            arguments = ("EVALSHA", *evalsha_arguments(request.script, request.keys, request.args))
            try:
                return self._script_call(arguments)
            except redis.exceptions.NoScriptError:
                self._load(request.script)
                return self.client.execute_command(*arguments)  # as the load went
        if isinstance(request, EvalMany):
            if _load_first(self, request):
                self._load(request.script)
            replies = self._script_calls(request)
            if missing := missing_script(replies):
                self._load(request.script)
                again = self._script_calls(only_calls(request, missing))
                for index, reply in zip(missing, again, strict=True):
                    replies[index] = reply
            return raise_first_error(replies)
        if isinstance(request, Durably):
            calls = request.calls
            if _load_first(self, calls, durable=True):
                self._load(calls.script)
            targets = wait_targets(self, calls.calls)
            replies = self._script_calls(calls, request.durability, targets)
            if missing_script(replies):  # all again: WAIT must follow the writes
                self._load(calls.script)
                replies = self._script_calls(calls, request.durability, targets)
            return with_confirmations(self, calls.calls, request.durability, targets, replies)
        try:
            return self._batch(request, request.transaction)
        except redis.RedisError as error:
            if not read_only_transaction_refused(error, request):
                raise
            return self._batch(request, transaction=False)

    def _load(self, script: Script) -> None:
        self.client.execute_command("SCRIPT LOAD", script.source, **to_primaries(self))

    def _explained(self, request: Request, error: redis.ResponseError) -> Exception:
        """A script call or command refused WRONGTYPE, as the DamagedKeyError naming the
        key (see ``suspects``)."""
        if not (keys := suspects(request, error)):
            return error
        try:
            types = self._batch(types_of(keys), transaction=False)
        except redis.RedisError:
            return error
        return damaged_key_error(self.address, request, error, keys, types) or error

    def _script_call(self, arguments: Sequence[Any]) -> Any:
        """On the kept connection when it is free (see ``kept``), else through the client."""
        if self._kept is not None and (reply := self._kept.call(arguments)) is not NOT_SENT:
            return reply
        return self.client.execute_command(*arguments)

    def _script_calls(
        self, request: EvalMany, wait: Durability | None = None, targets: Sequence[Any] = ()
    ) -> list[Any]:
        """Each sent as it is made on the kept connection when it is free (see ``kept``),
        then with ``wait`` its waits on the same connection; else in a pipeline through
        the client; refusals as their exceptions."""
        if self._kept is not None:
            replies = self._kept.call_many(evalsha_commands(request, wait))
            if replies is not NOT_SENT:
                return replies  # type: ignore[no-any-return]
        return self._pipelined(request, wait, targets)

    def _batch(self, request: Batch, transaction: bool) -> list[Any]:
        return list(batch_pipeline(self.client, request, transaction).execute())

    def _pipelined(
        self, request: EvalMany, wait: Durability | None = None, targets: Sequence[Any] = ()
    ) -> list[Any]:
        pipe = script_pipeline(self, request, wait, targets)
        return list(pipe.execute(raise_on_error=False))

    def close(self) -> None:
        if self._kept is not None:
            self._kept.close()
        for client in (self.client, self.blocking_client, *self._helpers):
            client.close()
            if not self.clustered:  # it was given its pool, which close() leaves open
                client.connection_pool.disconnect()
        for release in self._closing:
            release()


class AsyncRunner:
    """Runs the same plans on an asyncio redis-py client.

    With no URL at all (``embedded_wanted``), the clients are made for the embedded
    server's socket at once, but the server is started (or attached to) only by the
    first call, in a thread: a start blocks for a process to come up, and the event loop
    must go on meanwhile."""

    def __init__(self, spec: RedisSpec, settings: Settings) -> None:
        self._unstarted = embedded_wanted(spec)
        self._server_start: asyncio.Future[None] | None = None  # shared by the first calls
        where = embedded_url() if self._unstarted else spec
        connection = connect(where, settings, asynchronous=True)
        self.client, self.blocking_client = connection.main, connection.blocking
        self.address, self.clustered = connection.address, connection.clustered
        self._helpers = connection.helpers
        self._closing = connection.closing
        #: When commands were last held by a Sentinel failover (time.monotonic; 0.0 never).
        self.interrupted_at = connection.interrupted_at
        self._kept = None if self.clustered else AsyncKeptConnection(self.client)
        self.loaded_scripts: set[str] = set()  # see _load_first

    async def run(self, plan: Plan[T]) -> T:
        if self._unstarted:
            await self._start_server()
        reply: Any = None
        with as_duetime_errors(self):
            while True:
                try:
                    request = advance(plan, reply)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                try:
                    reply = await self._execute(request)
                except redis.ResponseError as error:
                    raise await self._explained(request, error) from None

    async def _start_server(self) -> None:
        """Start the embedded server in a thread, once for every call that comes before
        it is up; a failed start is tried again by the next call. A caller cancelled
        meanwhile leaves the start going for the others (``shield``)."""
        if self._server_start is None:
            self._server_start = asyncio.ensure_future(asyncio.to_thread(start_embedded))
        start = self._server_start
        try:
            await asyncio.shield(start)
        except BaseException:
            if start.done() and (start.cancelled() or start.exception() is not None):
                self._server_start = None
            raise
        self._unstarted = False

    async def _execute(self, request: Request) -> Any:
        if isinstance(request, Command):
            client = self.client if request.block is None else self.blocking_client
            if request.route is not None:
                await self._learn_slots(client)
            try:
                reply = await client.execute_command(
                    *wire_arguments(request.args), **routed(self, client, request)
                )
            except REDIS_ERRORS as error:
                return failure_reply(self, request, error)
            return scan_reply(reply)
        if isinstance(request, Eval):
            arguments = ("EVALSHA", *evalsha_arguments(request.script, request.keys, request.args))
            try:
                return await self._script_call(arguments)
            except redis.exceptions.NoScriptError:
                await self._load(request.script)
                return await self.client.execute_command(*arguments)  # as the load went
        if isinstance(request, EvalMany):
            await self._learn_slots(self.client)
            if _load_first(self, request):
                await self._load(request.script)
            replies = await self._script_calls(request)
            if missing := missing_script(replies):
                await self._load(request.script)
                again = await self._script_calls(only_calls(request, missing))
                for index, reply in zip(missing, again, strict=True):
                    replies[index] = reply
            return raise_first_error(replies)
        if isinstance(request, Durably):
            calls = request.calls
            await self._learn_slots(self.client)
            if _load_first(self, calls, durable=True):
                await self._load(calls.script)
            targets = wait_targets(self, calls.calls)
            replies = await self._script_calls(calls, request.durability, targets)
            if missing_script(replies):  # all again: WAIT must follow the writes
                await self._load(calls.script)
                replies = await self._script_calls(calls, request.durability, targets)
            return with_confirmations(self, calls.calls, request.durability, targets, replies)
        try:
            return await self._batch(request, request.transaction)
        except redis.RedisError as error:
            if not read_only_transaction_refused(error, request):
                raise
            return await self._batch(request, transaction=False)

    async def _learn_slots(self, client: Any) -> None:
        """On a cluster, before routing by key: the asyncio client learns the slots
        lazily."""
        if self.clustered:
            await client.initialize()

    async def _load(self, script: Script) -> None:
        await self.client.execute_command("SCRIPT LOAD", script.source, **to_primaries(self))

    async def _explained(self, request: Request, error: redis.ResponseError) -> Exception:
        """As ``SyncRunner._explained``."""
        if not (keys := suspects(request, error)):
            return error
        try:
            types = await self._batch(types_of(keys), transaction=False)
        except redis.RedisError:
            return error
        return damaged_key_error(self.address, request, error, keys, types) or error

    async def _script_call(self, arguments: Sequence[Any]) -> Any:
        """On the kept connection when it is free (see ``kept``), else through the client."""
        if self._kept is not None:
            reply = await self._kept.call(arguments)
            if reply is not NOT_SENT:
                return reply
        return await self.client.execute_command(*arguments)

    async def _script_calls(
        self, request: EvalMany, wait: Durability | None = None, targets: Sequence[Any] = ()
    ) -> list[Any]:
        """As ``SyncRunner._script_calls``, but sent as made on another connection when
        the kept one is busy (see ``AsyncKeptConnection.call_many``). On a cluster, a
        pipeline routes them."""
        if self._kept is not None:
            replies = await self._kept.call_many(evalsha_commands(request, wait), borrow=True)
            if replies is not NOT_SENT:
                return replies  # type: ignore[no-any-return]
        return await self._pipelined(request, wait, targets)

    async def _batch(self, request: Batch, transaction: bool) -> list[Any]:
        return list(await batch_pipeline(self.client, request, transaction).execute())

    async def _pipelined(
        self, request: EvalMany, wait: Durability | None = None, targets: Sequence[Any] = ()
    ) -> list[Any]:
        pipe = script_pipeline(self, request, wait, targets)
        return list(await pipe.execute(raise_on_error=False))

    async def close(self) -> None:
        if self._kept is not None:
            await self._kept.close()
        for client in (self.client, self.blocking_client, *self._helpers):
            await client.aclose()
            if not self.clustered:  # it was given its pool, which aclose() leaves open
                await client.connection_pool.disconnect()
        for release in self._closing:
            release()


# --- redis-py's errors as duetime's ----------------------------------------------------

#: What redis-py raises: its errors, and its cluster client's own (a slot no node serves,
#: a cluster it cannot reach: not RedisErrors).
REDIS_ERRORS = (redis.RedisError, redis.exceptions.RedisClusterException)


class as_duetime_errors:
    """While a plan runs (awaited or not): what redis-py raises, as duetime's errors
    (``translated``); redis-py's cluster client tripping over a redirect to a node it
    does not know yet, as the cluster being mid-move. Any other error passes as it is.
    A class, not a ``contextlib.contextmanager``: every plan a runner runs enters it, and
    the generator-based one cost a single schedule call 2 µs (3% of its client CPU)."""

    __slots__ = ("runner",)

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: object) -> Literal[False]:  # fmt: skip
        if error is None:
            return False
        runner = self.runner
        if isinstance(error, REDIS_ERRORS):
            raise translated(error, runner.address, runner.clustered) from None
        clustered = runner.clustered
        if isinstance(error, AttributeError) and clustered and failed_inside_redis_py(error):
            raise mid_move(error, runner.address) from error
        return False


def failure_reply(runner: Runner, command: Command, error: Exception) -> Any:
    """What a lone command's failure becomes: the reply its plan asked for it as (a
    refusal with ``refusal_as_reply``, any failure with ``failure_as_reply``), else
    ``error`` raised again."""
    if isinstance(error, redis.ResponseError) and (
        command.refusal_as_reply or command.failure_as_reply
    ):
        return translated_refusal(runner.address, error)
    if not command.failure_as_reply:
        raise error
    return translated(error, runner.address, runner.clustered)


def translated_refusal(address: str, reply: Any) -> Any:
    """A refusal the server sent as a reply, as the RedisCommandError a plan sees."""
    if isinstance(reply, redis.RedisError):
        return RedisCommandError(f"Redis at {address} refused a command: {reply}")
    return reply


_OUT_OF_MEMORY_HINT = (
    "Redis is out of memory: used memory is over maxmemory and the policy is noeviction, so "
    "it refuses writes (reads and `duetime inspect --check` still work). Raise maxmemory, "
    "free memory (e.g. `duetime dead purge`), or add capacity; do not switch to an evicting "
    "policy, which would drop tasks"
)


def _is_out_of_memory(error: redis.RedisError) -> bool:
    return isinstance(error, redis.exceptions.OutOfMemoryError) or "OOM command not allowed" in str(
        error
    )


_MID_MOVE = (
    "is moving slots or failing over ({}); try again: the client follows the cluster "
    "once the move settles"
)


def translated(error: Exception, address: str, clustered: bool = False) -> DuetimeError:
    """The duetime error a redis-py error becomes; nothing from redis-py escapes."""
    if isinstance(error, redis.ConnectionError | redis.TimeoutError):
        return RedisUnavailableError(
            f"Redis at {address} is unavailable: {mask_urls_in(str(error))}"
        )
    if isinstance(error, redis.exceptions.InvalidResponse):
        # A reply that is not the Redis protocol: a broken connection or not a Redis server.
        return RedisUnavailableError(
            f"Redis at {address} answered with something that is not the Redis protocol: "
            f"{mask_urls_in(str(error))}"
        )
    if isinstance(
        error,
        redis.exceptions.ClusterError
        | redis.exceptions.TryAgainError
        | redis.exceptions.RedisClusterException,
    ) or (clustered and isinstance(error, redis.exceptions.AskError)):
        # A cluster between two states (a slot moving, a master failing over): the
        # client gave up following redirections for now; the next try may well work.
        # (MovedError is an AskError: through a cluster client, either one surfacing
        # means a move in progress, not a wrong URL.)
        return RedisUnavailableError(
            f"Redis Cluster at {address} " + _MID_MOVE.format(mask_urls_in(str(error)))
        )
    if isinstance(error, redis.exceptions.AskError):
        return RedisCommandError(
            f"Redis at {address} is a cluster node, and the queue's slot lives on another "
            f"node (MOVED {error}): connect with redis+cluster://host:port[,host:port...] "
            "or a RedisCluster client"
        )
    if isinstance(error, redis.RedisError) and _is_out_of_memory(error):
        return RedisOutOfMemoryError(f"{_OUT_OF_MEMORY_HINT} (at {address})")
    refused = f"Redis at {address} refused a command: {mask_urls_in(str(error))}"
    if isinstance(error, redis.ResponseError) and (hint := _wrong_scheme(str(error), address)):
        return RedisCommandError(f"{refused}; {hint}")
    return RedisCommandError(refused)


#: Commands every Redis and Valkey server knows and a Sentinel does not: refused as
#: unknown, they say the URL names a Sentinel's port.
_SERVER_ONLY = ("time", "evalsha", "eval", "script", "hsetnx", "hgetall", "zadd", "multi")


def _wrong_scheme(message: str, address: str) -> str | None:
    """What to connect with instead, when a refusal shows the URL's scheme does not fit
    the server: a plain server refusing SENTINEL (a redis+sentinel:// URL naming a
    server), or a Sentinel refusing a server's command (a redis:// URL naming a
    Sentinel). None for any other refusal."""
    text = message.lower()
    if "unknown command" not in text:
        return None
    sentinel_url = address.lower().startswith(("redis+sentinel", "rediss+sentinel"))
    if sentinel_url and "'sentinel'" in text:
        return (
            "the address is a Redis or Valkey server, not a Sentinel: connect to it with "
            "redis://host:port/db (redis+sentinel://host:port/service asks Sentinels)"
        )
    if not sentinel_url and any(f"'{command}'" in text for command in _SERVER_ONLY):
        return (
            "the address looks like a Sentinel, which answers only its own commands: "
            "connect with redis+sentinel://host:port[,host:port...]/service-name"
        )
    return None


_REDIS_PY = os.path.dirname(redis.__file__)


def failed_inside_redis_py(error: AttributeError) -> bool:
    """Whether an AttributeError was raised by redis-py's own code (its cluster client
    follows an ASK redirect to a node it does not know yet, e.g. a new master that owns
    no slot, as None), not by duetime's."""
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    return traceback is not None and traceback.tb_frame.f_code.co_filename.startswith(_REDIS_PY)


def mid_move(error: AttributeError, address: str) -> DuetimeError:
    return RedisUnavailableError(
        f"Redis Cluster at {address} "
        + _MID_MOVE.format(f"redirected to a node the client does not know yet: {error}")
    )


def read_only_transaction_refused(error: redis.RedisError, request: Batch) -> bool:
    """Over maxmemory, Redis refuses every command queued in MULTI, reads too."""
    return request.transaction and request.read_only and _is_out_of_memory(error)


def advance(plan: Plan[T], reply: Any) -> Request:
    """The plan's next request. A plan that chokes on a reply (a number that is not a
    number, a record of the wrong shape) met data duetime never wrote: that is reported
    as CorruptStateError, with the original exception chained for the traceback."""
    try:
        return plan.send(reply)
    except (StopIteration, DuetimeError):
        raise
    except (ValueError, TypeError, IndexError, KeyError, AttributeError) as error:
        raise CorruptStateError(
            f"unexpected data in Redis ({type(error).__name__}: {error}); "
            "run `duetime inspect --check` to find it"
        ) from error


# --- naming a damaged key --------------------------------------------------------------
#
# Redis says only that "a key" holds the wrong kind of value. When a request is refused
# so, the runner asks TYPE of each key the request names (the keys of a script call, the
# first argument of a lone command or of a read-only batch's commands; nothing more is
# sent while all is well) and raises DamagedKeyError naming each key of the queue that
# holds another type than duetime keeps there.

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
