"""What a plan yields: the requests a runner executes for it.

A plan is a generator that yields requests (a command, a script call, script calls in
one round trip, with or without a wait for replicas, or a batch of commands) and
receives their replies. Also how many arguments travel packed as one.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from duetime import codec
from duetime.errors import ConfigurationError, NotDurableError
from duetime.settings import Settings
from duetime.store.plans.scripts import Script

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Command:
    """One Redis command. ``block`` is set for blocking commands: the seconds the
    server may hold it, so the runner sends it on a connection whose socket timeout
    is longer than that. ``route`` is a key of the queue for a command that names none
    (TIME, SCAN, CONFIG GET): on a cluster it goes to the node holding that key.
    ``refusal_as_reply``: the server's refusal comes back to the plan as a
    RedisCommandError reply, for a plan that can say what it means. ``failure_as_reply``:
    any failure comes back as its DuetimeError reply (a refusal, the server unavailable),
    for a courtesy step that must not fail a plan whose work is done."""

    args: tuple[Any, ...]
    block: float | None = None
    route: str | None = None
    refusal_as_reply: bool = False
    failure_as_reply: bool = False


@dataclass(frozen=True, slots=True)
class Eval:
    script: Script
    keys: Sequence[str]
    args: Sequence[Any]


#: One script call's keys and arguments.
ScriptCall = tuple[Sequence[str], Sequence[Any]]


class MadeOnDemand(Sequence[T]):
    """Items made when first asked for, then kept: the script calls of a large schedule,
    which a runner sends each as it is made, so the server runs one while the next is
    made."""

    def __init__(self, count: int, make: Callable[[int], T]) -> None:
        self._made: list[T] = []
        self._count, self._make = count, make

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...
    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if not -self._count <= index < self._count:
            raise IndexError(index)
        index %= self._count
        while len(self._made) <= index:  # in order: each may depend on the one before
            self._made.append(self._make(len(self._made)))
        return self._made[index]


@dataclass(frozen=True, slots=True)
class EvalMany:
    """One script called several times in one round trip (a pipeline, not a transaction)."""

    script: Script
    calls: Sequence[ScriptCall]


#: Seconds a durable wait must end before socket_timeout: its reply is read within
#: socket_timeout, from about when the wait starts on the server.
DURABLE_READ_MARGIN = 0.5


@dataclass(frozen=True, slots=True)
class Durability:
    """Wait for this many replicas to confirm a write, up to ``timeout_ms`` (WAIT); with
    ``fsync``, for the write to be in the append-only file on the master and on that
    many replicas (WAITAOF)."""

    replicas: int
    timeout_ms: int
    fsync: bool = False

    @classmethod
    def wanted(cls, settings: Settings, durable: bool | None) -> Durability | None:
        """What to wait for: ``durable`` True asks for at least one replica where the
        settings ask for nothing, False for nothing, None follows the settings."""
        if durable is False:
            return None
        replicas, fsync = settings.durable_replicas, settings.durable_fsync
        if durable and not (replicas or fsync):
            replicas = 1
        if not (replicas or fsync):
            return None
        if settings.durable_timeout + DURABLE_READ_MARGIN > settings.socket_timeout:
            raise ConfigurationError(
                f"durable_timeout ({settings.durable_timeout:g}s) must be at least "
                f"{DURABLE_READ_MARGIN:g}s below socket_timeout ({settings.socket_timeout:g}s): "
                "the replicas' confirmation is read within socket_timeout, and a read that "
                "times out after the write went through would report Redis unavailable for "
                "a task that was stored (a retry would store it twice). Lower "
                "durable_timeout or raise socket_timeout"
            )
        return cls(replicas, round(settings.durable_timeout * 1000), fsync)

    @property
    def commands(self) -> list[tuple[str | int, ...]]:
        """The waits sent after the writes, on their connection; the last one's reply
        is the confirmation. WAIT comes before WAITAOF when replicas must fsync: a
        replica reports its fsync only in answer to a request that reaches it after the
        write (or once a second), and WAITAOF's request would otherwise travel with the
        write: each call would take a second. So a call may wait twice the timeout."""
        waitaof = ("WAITAOF", 1, self.replicas, self.timeout_ms)
        wait = ("WAIT", self.replicas, self.timeout_ms)
        if not self.fsync:
            return [wait]
        return [wait, waitaof] if self.replicas else [waitaof]

    def shortfall(self, confirmations: Sequence[Any] | None) -> tuple[int, str | None]:
        """The fewest replicas any reply confirmed, and what fell short (None: nothing).
        ``confirmations`` are WAIT or WAITAOF replies, one per master written (an
        exception where the server refused); None when a write went elsewhere."""
        seconds = f"{self.timeout_ms / 1000:g}s"
        if confirmations is None:
            return 0, "the slot map changed during the call, so no wait covered every write"
        fsynced_locally = True
        replicas = self.replicas
        for reply in confirmations:
            if isinstance(reply, Exception):
                return 0, f"the server refused to confirm ({reply})"
            if self.fsync:
                fsynced_locally = fsynced_locally and bool(int(reply[0]))
                replicas = min(replicas, int(reply[1]))
            else:
                replicas = min(replicas, int(reply))
        if not fsynced_locally:
            return replicas, f"the master did not write it to its append-only file within {seconds}"
        if replicas < self.replicas:
            done = "wrote it to their append-only file" if self.fsync else "confirmed it"
            return replicas, f"only {replicas} of {self.replicas} replica(s) {done} in {seconds}"
        return replicas, None


@dataclass(frozen=True, slots=True)
class Durably:
    """Script calls followed by WAIT on the same connection, in one round trip; the
    reply is (the calls' replies, how many replicas confirmed them)."""

    calls: EvalMany
    durability: Durability


@dataclass(frozen=True, slots=True)
class Batch:
    """Commands sent in one round trip; ``transaction`` wraps them in MULTI/EXEC.
    ``read_only`` (only reads in it) lets the runner send a refused transaction again
    as a plain pipeline when the server is over maxmemory, which refuses MULTI."""

    commands: Sequence[Command]
    transaction: bool = False
    read_only: bool = False


Request = Command | Eval | EvalMany | Durably | Batch
Plan = Generator[Request, Any, T]


def written_durably(calls: EvalMany, durability: Durability) -> Plan[list[Any]]:
    """Run ``calls`` and wait for the confirmation; NotDurableError (carrying the calls'
    replies) when it falls short in time: the write is on the master, but a failover
    (or, with fsync, a crash) may or may not keep it."""
    replies, confirmations = yield Durably(calls, durability)
    confirmed, shortfall = durability.shortfall(confirmations)
    if shortfall is not None:
        raise NotDurableError(confirmed, durability.replicas, shortfall, replies)
    return list(replies)


def wire_id(task_id: str) -> str | bytes:
    """An id as it goes inside a packed argument: one that is not ASCII as its bytes
    (surrogateescape, as the runner sends text), so an id read back from Redis is
    written as it came."""
    return task_id if task_id.isascii() else task_id.encode("utf-8", "surrogateescape")


def packed_arguments(flat: list[Any]) -> bytes:
    """Many script arguments as one msgpack array, which Lua reads with cmsgpack.unpack.
    Without bin types: the cmsgpack of Redis's Lua predates them (it refuses bin 8), and
    text and bytes alike arrive in Lua as strings."""
    return codec.packed(flat, use_bin_type=False)
