"""Execute plans on redis-py: a synchronous runner and an asyncio one.

Both use two clients from one address (see ``connections``): one for ordinary commands
with a short socket timeout, and one for blocking commands (BLMOVE, BLPOP) whose socket
timeout is longer than the longest block, so a hung socket fails in bounded time
either way. Scripts are called by SHA and loaded again after NOSCRIPT (a restarted
or failed-over server has an empty script cache; on a cluster they are loaded on every
primary). On a cluster, a command that names no key goes to the node of the key its
plan names as its route. redis-py errors become ``duetime.errors`` here, with the URL's
password masked.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio

from duetime.errors import (
    CorruptStateError,
    DuetimeError,
    RedisCommandError,
    RedisOutOfMemoryError,
    RedisUnavailableError,
)
from duetime.settings import Settings
from duetime.store.connections import (
    BLOCK_MARGIN,
    RedisSpec,
    connect,
    mask_url,
    mask_urls_in,
    resolve_url,
)
from duetime.store.damage import damaged_key_error, suspects, types_of
from duetime.store.kept import NOT_SENT, AsyncKeptConnection, KeptConnection
from duetime.store.operations import (
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
from duetime.store.scripts import Script

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


def _routed(runner: SyncRunner | AsyncRunner, client: Any, command: Command) -> dict[str, Any]:
    """On a cluster, a command that names no key (TIME, SCAN, CONFIG GET) is sent to the
    node that holds its route key's slot: the queue's node, whose clock and keys count."""
    if not runner.clustered or command.route is None:
        return {}
    return {"target_nodes": client.get_node_from_key(command.route)}


def _wait_targets(runner: SyncRunner | AsyncRunner, calls: Sequence[ScriptCall]) -> list[Any]:
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


def _with_confirmations(
    runner: SyncRunner | AsyncRunner,
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
    written = _raise_first_error(replies[:-waits])
    now_at = [node.name for node in _wait_targets(runner, calls)] if runner.clustered else []
    if now_at != [node.name for node in targets if node is not None]:
        return written, None
    confirmations = []
    for start in range(len(replies) - waits, len(replies), steps):
        group = replies[start : start + steps]
        refused = [reply for reply in group if isinstance(reply, redis.RedisError)]
        confirmations.append(_translated_refusal(runner, refused[0]) if refused else group[-1])
    return written, confirmations


def _translated_refusal(runner: SyncRunner | AsyncRunner, reply: Any) -> Any:
    """A refusal the server sent as a reply, as the RedisCommandError a plan sees."""
    if isinstance(reply, redis.RedisError):
        return RedisCommandError(f"Redis at {runner.address} refused a command: {reply}")
    return reply


def _node(target: Any) -> dict[str, Any]:
    """The routing of a command to one cluster node (none off a cluster)."""
    return {} if target is None else {"target_nodes": target}


def _batch_pipeline(client: Any, request: Batch, transaction: bool) -> Any:
    """A pipeline (sync or asyncio, as ``client`` is) holding a batch's commands."""
    pipe = client.pipeline(transaction=transaction)
    for command in request.commands:
        pipe.execute_command(*_wire(command.args))
    return pipe


def _slot_node(runner: SyncRunner | AsyncRunner, keys: Sequence[str]) -> dict[str, Any]:
    """On a cluster, the node of a script call's slot (its keys share one hash tag), given
    to redis-py so that a cluster pipeline does not look the keys up itself: it would
    ask its default node (COMMAND GETKEYS), a round trip per call, and fail while that
    one node is down even for calls to healthy masters."""
    if not runner.clustered or not keys:
        return {}
    return {"target_nodes": runner.client.get_node_from_key(keys[0])}


def _script_pipeline(
    runner: SyncRunner | AsyncRunner,
    request: EvalMany,
    wait: Durability | None,
    targets: Sequence[Any],
) -> Any:
    """A pipeline of script calls, then with ``wait`` a WAIT for each target. EVALSHA goes
    as a plain command: a cluster pipeline routes it, but blocks its evalsha method."""
    pipe = runner.client.pipeline(transaction=False)
    for keys, args in request.calls:
        pipe.execute_command(
            "EVALSHA", *_eval_args(request.script, keys, args), **_slot_node(runner, keys)
        )
    for target in targets:
        assert wait is not None
        for command in wait.commands:
            pipe.execute_command(*command, **_node(target))
    return pipe


def _scan_reply(reply: Any) -> Any:
    """A cluster client answers SCAN with ({node: cursor}, keys); plans expect the
    server's own [cursor, keys] (one node is asked: the queue's)."""
    if isinstance(reply, tuple) and len(reply) == 2 and isinstance(reply[0], dict):
        [cursor] = reply[0].values()
        return [cursor, reply[1]]
    return reply


def _script_load(runner: SyncRunner | AsyncRunner) -> dict[str, Any]:
    """Where SCRIPT LOAD goes: on a cluster, every primary (any may own a queue after a
    failover or a resharding)."""
    return {"target_nodes": "primaries"} if runner.clustered else {}


def _load_first(runner: SyncRunner | AsyncRunner, request: EvalMany) -> bool:
    """Whether to load a script before a request of several calls of it: before the
    first such request of each script in this runner. A server without the script would
    refuse every call, each made and sent for nothing (a large schedule_many on a server
    that has so far run only single calls); a later refusal is handled as it comes."""
    if len(request.calls) < 2 or request.script.sha in runner.loaded_scripts:
        return False
    runner.loaded_scripts.add(request.script.sha)
    return True


def _wire(args: Sequence[Any]) -> list[Any]:
    """Arguments as sent: non-ASCII text is encoded here, with surrogateescape, because
    hiredis packs str strictly; an id read back from Redis that is not UTF-8 (written
    by hand) so goes out as the same bytes it came in as."""
    return [
        arg.encode("utf-8", "surrogateescape")
        if isinstance(arg, str) and not arg.isascii()
        else arg
        for arg in args
    ]


def _eval_args(script: Script, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
    return [script.sha, len(keys), *_wire(keys), *_wire(args)]


def _evalsha_commands(
    request: EvalMany, wait: Durability | None = None
) -> Iterator[tuple[Any, ...]]:
    """The EVALSHA commands of a request, each made when it is asked for, then the
    commands of ``wait`` (on the same connection, they confirm these writes)."""
    for keys, args in request.calls:
        yield ("EVALSHA", *_eval_args(request.script, keys, args))
    if wait is not None:
        yield from wait.commands


def _only(request: EvalMany, positions: list[int]) -> EvalMany:
    """The calls of ``request`` at ``positions``: those refused NOSCRIPT, sent again once
    the script is loaded the way the first went (on the kept connection, sent as made: a
    pipeline is written whole, which may take longer than the socket timeout)."""
    return EvalMany(request.script, [request.calls[i] for i in positions])


def _missing_script(replies: list[Any]) -> list[int]:
    """Positions of pipelined script calls the server answered with NOSCRIPT."""
    return [
        i for i, reply in enumerate(replies) if isinstance(reply, redis.exceptions.NoScriptError)
    ]


def _raise_first_error(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


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


#: What redis-py raises: its errors, and its cluster client's own (a slot no node serves,
#: a cluster it cannot reach: not RedisErrors).
_REDIS_ERRORS = (redis.RedisError, redis.exceptions.RedisClusterException)

_MID_MOVE = (
    "is moving slots or failing over ({}); try again: the client follows the cluster "
    "once the move settles"
)


def _translated(error: Exception, address: str, clustered: bool = False) -> DuetimeError:
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
    return RedisCommandError(f"Redis at {address} refused a command: {mask_urls_in(str(error))}")


_REDIS_PY = os.path.dirname(redis.__file__)


def _failed_inside_redis_py(error: AttributeError) -> bool:
    """Whether an AttributeError was raised by redis-py's own code (its cluster client
    follows an ASK redirect to a node it does not know yet, e.g. a new master that owns
    no slot, as None), not by duetime's."""
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    return traceback is not None and traceback.tb_frame.f_code.co_filename.startswith(_REDIS_PY)


def _mid_move(error: AttributeError, address: str) -> DuetimeError:
    return RedisUnavailableError(
        f"Redis Cluster at {address} "
        + _MID_MOVE.format(f"redirected to a node the client does not know yet: {error}")
    )


def _advance(plan: Plan[T], reply: Any) -> Request:
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


def _read_only_transaction_refused(error: redis.RedisError, request: Batch) -> bool:
    """Over maxmemory, Redis refuses every command queued in MULTI, reads too."""
    return request.transaction and request.read_only and _is_out_of_memory(error)


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
        try:
            while True:
                try:
                    request = _advance(plan, reply)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                try:
                    reply = self._execute(request)
                except redis.ResponseError as error:
                    raise self._explained(request, error) from None
        except _REDIS_ERRORS as error:
            raise _translated(error, self.address, self.clustered) from None
        except AttributeError as error:
            if not (self.clustered and _failed_inside_redis_py(error)):
                raise
            raise _mid_move(error, self.address) from error

    def _execute(self, request: Request) -> Any:
        if isinstance(request, Command):
            client = self.client if request.block is None else self.blocking_client
            try:
                reply = client.execute_command(
                    *_wire(request.args), **_routed(self, client, request)
                )
            except redis.ResponseError as error:
                if not request.refusal_as_reply:
                    raise
                return _translated_refusal(self, error)
            return _scan_reply(reply)
        if isinstance(request, Eval):
            arguments = ("EVALSHA", *_eval_args(request.script, request.keys, request.args))
            try:
                return self._script_call(arguments)
            except redis.exceptions.NoScriptError:
                self._load(request.script)
                return self.client.execute_command(*arguments)  # as the load went
        if isinstance(request, EvalMany):
            if _load_first(self, request):
                self._load(request.script)
            replies = self._script_calls(request)
            if missing := _missing_script(replies):
                self._load(request.script)
                again = self._script_calls(_only(request, missing))
                for index, reply in zip(missing, again, strict=True):
                    replies[index] = reply
            return _raise_first_error(replies)
        if isinstance(request, Durably):
            calls = request.calls
            if _load_first(self, calls):
                self._load(calls.script)
            targets = _wait_targets(self, calls.calls)
            replies = self._script_calls(calls, request.durability, targets)
            if _missing_script(replies):  # all again: WAIT must follow the writes
                self._load(calls.script)
                replies = self._script_calls(calls, request.durability, targets)
            return _with_confirmations(self, calls.calls, request.durability, targets, replies)
        try:
            return self._batch(request, request.transaction)
        except redis.RedisError as error:
            if not _read_only_transaction_refused(error, request):
                raise
            return self._batch(request, transaction=False)

    def _load(self, script: Script) -> None:
        self.client.execute_command("SCRIPT LOAD", script.source, **_script_load(self))

    def _explained(self, request: Request, error: redis.ResponseError) -> Exception:
        """A script call or command refused WRONGTYPE, as the DamagedKeyError naming the
        key (see ``damage``)."""
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
            replies = self._kept.call_many(_evalsha_commands(request, wait))
            if replies is not NOT_SENT:
                return replies  # type: ignore[no-any-return]
        return self._pipelined(request, wait, targets)

    def _batch(self, request: Batch, transaction: bool) -> list[Any]:
        return list(_batch_pipeline(self.client, request, transaction).execute())

    def _pipelined(
        self, request: EvalMany, wait: Durability | None = None, targets: Sequence[Any] = ()
    ) -> list[Any]:
        pipe = _script_pipeline(self, request, wait, targets)
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
    """Runs the same plans on an asyncio redis-py client."""

    def __init__(self, spec: RedisSpec, settings: Settings) -> None:
        connection = connect(spec, settings, asynchronous=True)
        self.client, self.blocking_client = connection.main, connection.blocking
        self.address, self.clustered = connection.address, connection.clustered
        self._helpers = connection.helpers
        self._closing = connection.closing
        #: When commands were last held by a Sentinel failover (time.monotonic; 0.0 never).
        self.interrupted_at = connection.interrupted_at
        self._kept = None if self.clustered else AsyncKeptConnection(self.client)
        self.loaded_scripts: set[str] = set()  # see _load_first

    async def run(self, plan: Plan[T]) -> T:
        reply: Any = None
        try:
            while True:
                try:
                    request = _advance(plan, reply)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                try:
                    reply = await self._execute(request)
                except redis.ResponseError as error:
                    raise await self._explained(request, error) from None
        except _REDIS_ERRORS as error:
            raise _translated(error, self.address, self.clustered) from None
        except AttributeError as error:
            if not (self.clustered and _failed_inside_redis_py(error)):
                raise
            raise _mid_move(error, self.address) from error

    async def _execute(self, request: Request) -> Any:
        if isinstance(request, Command):
            client = self.client if request.block is None else self.blocking_client
            if self.clustered and request.route is not None:
                await client.initialize()  # the asyncio client learns the slots lazily
            try:
                reply = await client.execute_command(
                    *_wire(request.args), **_routed(self, client, request)
                )
            except redis.ResponseError as error:
                if not request.refusal_as_reply:
                    raise
                return _translated_refusal(self, error)
            return _scan_reply(reply)
        if isinstance(request, Eval):
            arguments = ("EVALSHA", *_eval_args(request.script, request.keys, request.args))
            try:
                return await self._script_call(arguments)
            except redis.exceptions.NoScriptError:
                await self._load(request.script)
                return await self.client.execute_command(*arguments)  # as the load went
        if isinstance(request, EvalMany):
            if self.clustered:
                await self.client.initialize()  # the asyncio client learns the slots lazily
            if _load_first(self, request):
                await self._load(request.script)
            replies = await self._script_calls(request)
            if missing := _missing_script(replies):
                await self._load(request.script)
                again = await self._script_calls(_only(request, missing))
                for index, reply in zip(missing, again, strict=True):
                    replies[index] = reply
            return _raise_first_error(replies)
        if isinstance(request, Durably):
            calls = request.calls
            if self.clustered:
                await self.client.initialize()  # the asyncio client learns the slots lazily
            if _load_first(self, calls):
                await self._load(calls.script)
            targets = _wait_targets(self, calls.calls)
            replies = await self._script_calls(calls, request.durability, targets)
            if _missing_script(replies):  # all again: WAIT must follow the writes
                await self._load(calls.script)
                replies = await self._script_calls(calls, request.durability, targets)
            return _with_confirmations(self, calls.calls, request.durability, targets, replies)
        try:
            return await self._batch(request, request.transaction)
        except redis.RedisError as error:
            if not _read_only_transaction_refused(error, request):
                raise
            return await self._batch(request, transaction=False)

    async def _load(self, script: Script) -> None:
        await self.client.execute_command("SCRIPT LOAD", script.source, **_script_load(self))

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
            replies = await self._kept.call_many(_evalsha_commands(request, wait), borrow=True)
            if replies is not NOT_SENT:
                return replies  # type: ignore[no-any-return]
        return await self._pipelined(request, wait, targets)

    async def _batch(self, request: Batch, transaction: bool) -> list[Any]:
        return list(await _batch_pipeline(self.client, request, transaction).execute())

    async def _pipelined(
        self, request: EvalMany, wait: Durability | None = None, targets: Sequence[Any] = ()
    ) -> list[Any]:
        pipe = _script_pipeline(self, request, wait, targets)
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
