"""What goes wrong while a plan runs, as duetime's errors: redis-py's exceptions
translated (a URL's password masked, nothing from redis-py escapes), a cluster caught
moving slots, a server out of memory, and a plan that chokes on data duetime never
wrote."""

from __future__ import annotations

import os
from typing import Any, TypeVar

import redis

from duetime.errors import (
    CorruptStateError,
    DuetimeError,
    RedisCommandError,
    RedisOutOfMemoryError,
    RedisUnavailableError,
)
from duetime.store.plans.requests import Batch, Plan, Request
from duetime.store.redis.connections import mask_urls_in

T = TypeVar("T")


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
REDIS_ERRORS = (redis.RedisError, redis.exceptions.RedisClusterException)

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


def read_only_transaction_refused(error: redis.RedisError, request: Batch) -> bool:
    """Over maxmemory, Redis refuses every command queued in MULTI, reads too."""
    return request.transaction and request.read_only and _is_out_of_memory(error)


def translated_refusal(address: str, reply: Any) -> Any:
    """A refusal the server sent as a reply, as the RedisCommandError a plan sees."""
    if isinstance(reply, redis.RedisError):
        return RedisCommandError(f"Redis at {address} refused a command: {reply}")
    return reply
