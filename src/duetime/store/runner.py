"""Execute plans on redis-py: a synchronous runner and an asyncio one.

Both open two connection pools from one address: one for ordinary commands with a
short socket timeout, and one for blocking commands (BLMOVE, BLPOP) whose socket
timeout is longer than the longest block, so a hung socket fails in bounded time
either way. Scripts are called by SHA and loaded again after NOSCRIPT (a restarted
or failed-over server has an empty script cache). redis-py errors become
``duetime.errors`` here, with the URL's password masked.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from duetime.errors import (
    ConfigurationError,
    CorruptStateError,
    DuetimeError,
    RedisCommandError,
    RedisOutOfMemoryError,
    RedisUnavailableError,
)
from duetime.settings import Settings
from duetime.store.operations import Batch, Command, Eval, EvalMany, Plan, Request
from duetime.store.scripts import Script

T = TypeVar("T")

#: Extra seconds a blocking command's socket waits beyond the block itself.
BLOCK_MARGIN = 5.0

_ADDRESS_KWARGS = frozenset(
    {"host", "port", "db", "username", "password", "path", "client_name", "credential_provider"}
)

RedisSpec = str | redis.Redis | redis.asyncio.Redis | None


def mask_url(url: str) -> str:
    """The URL with any password replaced by ***."""
    url = re.sub(r"(://)[^:/@]+@", r"\1***@", url)
    url = re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", url)


def resolve_url(spec: str | None) -> str:
    """An explicit URL, else $DUETIME_REDIS_URL, else the embedded server's."""
    import os

    if spec:
        return spec
    from_env = os.environ.get("DUETIME_REDIS_URL")
    if from_env:
        return from_env
    from duetime.embedded import ensure_server

    return ensure_server().url


def _overrides(settings: Settings, socket_timeout: float, tcp: bool) -> dict[str, Any]:
    return {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": settings.socket_timeout,
        # Keepalive notices a peer that vanished without a FIN (TCP only).
        **({"socket_keepalive": True} if tcp else {}),
        "health_check_interval": 30,
        "decode_responses": False,
        "encoding_errors": "surrogateescape",  # see operations._text
        "protocol": 2,
        # Short retries for a blip; daemons back off longer at their own loop level.
        "retry": Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
    }


def _describe(client: Any) -> str:
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    return f"redis://{host}:{port}/{kwargs.get('db', 0)}"


def _check_database(url: str) -> None:
    """redis-py takes a path that is not a number (``redis://host/x``) as database 0
    without a word; a typo must not silently point at another database."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return
    path = parts.path.strip("/")
    if path and not (path.isascii() and path.isdigit()):
        raise ConfigurationError(
            f"invalid Redis URL {mask_url(url)}: the database after the last / must be a "
            f"number, got {path!r}"
        )


def _pools(spec: RedisSpec, settings: Settings, asynchronous: bool) -> tuple[Any, Any, str]:
    """Main and blocking clients plus a printable (masked) address."""
    module: Any = redis.asyncio if asynchronous else redis
    timeouts = (settings.socket_timeout, settings.block_timeout + BLOCK_MARGIN)
    if spec is None or isinstance(spec, str):
        url = resolve_url(spec)
        _check_database(url)
        try:
            clients = [
                module.Redis(
                    connection_pool=module.ConnectionPool.from_url(
                        url, **_overrides(settings, t, tcp=not url.startswith("unix:"))
                    )
                )
                for t in timeouts
            ]
        except ValueError as error:
            raise ConfigurationError(f"invalid Redis URL {mask_url(url)}: {error}") from None
        return clients[0], clients[1], mask_url(url)
    expected = redis.asyncio.Redis if asynchronous else redis.Redis
    if not isinstance(spec, expected):
        kind = "an asyncio" if asynchronous else "a synchronous"
        raise ConfigurationError(
            f"redis= must be a URL or {kind} redis-py client, got {type(spec).__name__}"
        )
    pool = spec.connection_pool
    # Only the address, credentials and TLS come from the caller's client; protocol,
    # timeouts and retries are ours (redis-py also keeps RESP3-only handlers there).
    address = {
        name: value
        for name, value in pool.connection_kwargs.items()
        if name in _ADDRESS_KWARGS or name.startswith("ssl")
    }
    clients = []
    for t in timeouts:
        kwargs = {**address, **_overrides(settings, t, tcp="path" not in address)}
        kwargs.pop("retry", None)
        clients.append(
            module.Redis(
                connection_pool=type(pool)(connection_class=pool.connection_class, **kwargs),
                retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
            )
        )
    return clients[0], clients[1], _describe(spec)


Call = tuple[Sequence[str], Sequence[Any]]


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


@contextmanager
def _translated(address: str) -> Iterator[None]:
    """redis-py errors become duetime errors here; nothing from redis-py escapes."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as error:
        raise RedisUnavailableError(
            f"Redis at {address} is unavailable: {mask_url(str(error))}"
        ) from None
    except redis.exceptions.InvalidResponse as error:
        # A reply that is not the Redis protocol: a broken connection or not a Redis server.
        raise RedisUnavailableError(
            f"Redis at {address} answered with something that is not the Redis protocol: "
            f"{mask_url(str(error))}"
        ) from None
    except redis.RedisError as error:
        if _is_out_of_memory(error):
            raise RedisOutOfMemoryError(f"{_OUT_OF_MEMORY_HINT} (at {address})") from None
        raise RedisCommandError(
            f"Redis at {address} refused a command: {mask_url(str(error))}"
        ) from None


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
        self.client, self.blocking_client, self.address = _pools(spec, settings, asynchronous=False)

    def run(self, plan: Plan[T]) -> T:
        reply: Any = None
        with _translated(self.address):
            while True:
                try:
                    request = _advance(plan, reply)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                reply = self._execute(request)

    def _execute(self, request: Request) -> Any:
        if isinstance(request, Command):
            client = self.client if request.block is None else self.blocking_client
            return client.execute_command(*_wire(request.args))
        if isinstance(request, Eval):
            try:
                return self.client.evalsha(*_eval_args(request.script, request.keys, request.args))
            except redis.exceptions.NoScriptError:
                self.client.script_load(request.script.source)
                return self.client.evalsha(*_eval_args(request.script, request.keys, request.args))
        if isinstance(request, EvalMany):
            replies = self._pipelined(request, request.calls)
            if missing := _missing_script(replies):
                self.client.script_load(request.script.source)
                again = self._pipelined(request, [request.calls[i] for i in missing])
                for index, reply in zip(missing, again, strict=True):
                    replies[index] = reply
            return _raise_first_error(replies)
        try:
            return self._batch(request, request.transaction)
        except redis.RedisError as error:
            if not _read_only_transaction_refused(error, request):
                raise
            return self._batch(request, transaction=False)

    def _batch(self, request: Batch, transaction: bool) -> list[Any]:
        pipe = self.client.pipeline(transaction=transaction)
        for command in request.commands:
            pipe.execute_command(*_wire(command.args))
        return list(pipe.execute())

    def _pipelined(self, request: EvalMany, calls: Sequence[Call]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.evalsha(*_eval_args(request.script, keys, args))
        return list(pipe.execute(raise_on_error=False))

    def close(self) -> None:
        # The clients were given their pools, so closing them leaves the pools open.
        for client in (self.client, self.blocking_client):
            client.close()
            client.connection_pool.disconnect()


class AsyncRunner:
    """Runs the same plans on an asyncio redis-py client."""

    def __init__(self, spec: RedisSpec, settings: Settings) -> None:
        self.client, self.blocking_client, self.address = _pools(spec, settings, asynchronous=True)

    async def run(self, plan: Plan[T]) -> T:
        reply: Any = None
        with _translated(self.address):
            while True:
                try:
                    request = _advance(plan, reply)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                reply = await self._execute(request)

    async def _execute(self, request: Request) -> Any:
        if isinstance(request, Command):
            client = self.client if request.block is None else self.blocking_client
            return await client.execute_command(*_wire(request.args))
        if isinstance(request, Eval):
            arguments = _eval_args(request.script, request.keys, request.args)
            try:
                return await self.client.evalsha(*arguments)
            except redis.exceptions.NoScriptError:
                await self.client.script_load(request.script.source)
                return await self.client.evalsha(*arguments)
        if isinstance(request, EvalMany):
            replies = await self._pipelined(request, request.calls)
            if missing := _missing_script(replies):
                await self.client.script_load(request.script.source)
                again = await self._pipelined(request, [request.calls[i] for i in missing])
                for index, reply in zip(missing, again, strict=True):
                    replies[index] = reply
            return _raise_first_error(replies)
        try:
            return await self._batch(request, request.transaction)
        except redis.RedisError as error:
            if not _read_only_transaction_refused(error, request):
                raise
            return await self._batch(request, transaction=False)

    async def _batch(self, request: Batch, transaction: bool) -> list[Any]:
        pipe = self.client.pipeline(transaction=transaction)
        for command in request.commands:
            pipe.execute_command(*_wire(command.args))
        return list(await pipe.execute())

    async def _pipelined(self, request: EvalMany, calls: Sequence[Call]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.evalsha(*_eval_args(request.script, keys, args))
        return list(await pipe.execute(raise_on_error=False))

    async def close(self) -> None:
        for client in (self.client, self.blocking_client):
            await client.aclose()
            await client.connection_pool.disconnect()
