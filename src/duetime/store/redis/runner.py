"""Execute plans on redis-py: a synchronous runner and an asyncio one.

Both use two clients from one address (see ``connections``): one for ordinary commands
with a short socket timeout, and one for blocking commands (BLMOVE, BLPOP) whose socket
timeout is longer than the longest block, so a hung socket fails in bounded time
either way. Scripts are called by SHA and loaded again after NOSCRIPT (a restarted
or failed-over server has an empty script cache; on a cluster they are loaded on every
primary). On a cluster, a command that names no key goes to the node of the key its
plan names as its route (see ``routing``). redis-py errors become ``duetime.errors``
(see ``failures``), with the URL's password masked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio

from duetime.settings import Settings
from duetime.store.plans.requests import (
    Batch,
    Command,
    Durability,
    Durably,
    Eval,
    EvalMany,
    Plan,
    Request,
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
from duetime.store.redis.damage import damaged_key_error, suspects, types_of
from duetime.store.redis.failures import (
    REDIS_ERRORS,
    advance,
    failed_inside_redis_py,
    mid_move,
    read_only_transaction_refused,
    translated,
    translated_refusal,
)
from duetime.store.redis.kept import NOT_SENT, AsyncKeptConnection, KeptConnection
from duetime.store.redis.routing import (
    batch_pipeline,
    routed,
    scan_reply,
    script_pipeline,
    to_primaries,
    wait_targets,
    with_confirmations,
)
from duetime.store.redis.wire import (
    evalsha_arguments,
    evalsha_commands,
    missing_script,
    only_calls,
    raise_first_error,
    wire_arguments,
)

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


def _load_first(runner: SyncRunner | AsyncRunner, request: EvalMany, durable: bool = False) -> bool:
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
                    request = advance(plan, reply)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                try:
                    reply = self._execute(request)
                except redis.ResponseError as error:
                    raise self._explained(request, error) from None
        except REDIS_ERRORS as error:
            raise translated(error, self.address, self.clustered) from None
        except AttributeError as error:
            if not (self.clustered and failed_inside_redis_py(error)):
                raise
            raise mid_move(error, self.address) from error

    def _execute(self, request: Request) -> Any:
        if isinstance(request, Command):
            client = self.client if request.block is None else self.blocking_client
            try:
                reply = client.execute_command(
                    *wire_arguments(request.args), **routed(self, client, request)
                )
            except redis.ResponseError as error:
                if not (request.refusal_as_reply or request.failure_as_reply):
                    raise
                return translated_refusal(self.address, error)
            except REDIS_ERRORS as error:
                if not request.failure_as_reply:
                    raise
                return translated(error, self.address, self.clustered)
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
        try:
            while True:
                try:
                    request = advance(plan, reply)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                try:
                    reply = await self._execute(request)
                except redis.ResponseError as error:
                    raise await self._explained(request, error) from None
        except REDIS_ERRORS as error:
            raise translated(error, self.address, self.clustered) from None
        except AttributeError as error:
            if not (self.clustered and failed_inside_redis_py(error)):
                raise
            raise mid_move(error, self.address) from error

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
            if self.clustered and request.route is not None:
                await client.initialize()  # the asyncio client learns the slots lazily
            try:
                reply = await client.execute_command(
                    *wire_arguments(request.args), **routed(self, client, request)
                )
            except redis.ResponseError as error:
                if not (request.refusal_as_reply or request.failure_as_reply):
                    raise
                return translated_refusal(self.address, error)
            except REDIS_ERRORS as error:
                if not request.failure_as_reply:
                    raise
                return translated(error, self.address, self.clustered)
            return scan_reply(reply)
        if isinstance(request, Eval):
            arguments = ("EVALSHA", *evalsha_arguments(request.script, request.keys, request.args))
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
            if missing := missing_script(replies):
                await self._load(request.script)
                again = await self._script_calls(only_calls(request, missing))
                for index, reply in zip(missing, again, strict=True):
                    replies[index] = reply
            return raise_first_error(replies)
        if isinstance(request, Durably):
            calls = request.calls
            if self.clustered:
                await self.client.initialize()  # the asyncio client learns the slots lazily
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
