"""A queue's shards and where a task or a cron job is found among them: the state that
every group of plans of ``QueueCore`` is given (the queue's name, settings, hooks,
layout, and one ``QueueOperations`` per shard), and what those groups share of it:
noting the queue in the registry after its first write, checking a shard's fsyncs
before its first durable write, and finding where a task or a cron job lives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from duetime import validation
from duetime.clock import Clock
from duetime.cron import CronJob
from duetime.cron.definitions import decode_job
from duetime.errors import InvalidOptionError, TaskNotFoundError
from duetime.hooks import HookChain, Hooks
from duetime.settings import Settings
from duetime.states import TaskState
from duetime.store.plans.layout import QueueLayout
from duetime.store.plans.operations import QueueOperations, note_queue, shard_operations
from duetime.store.plans.producing import StatusReply
from duetime.store.plans.requests import Durability, Plan

T = TypeVar("T")


class QueueShards:
    """What the plan groups of ``QueueCore`` share: the queue, its settings and its
    shards."""

    def __init__(
        self,
        name: str,
        settings: Settings,
        clock: Clock | None,
        durable: bool | None = None,
        shards: int = 1,
        hooks: Iterable[Hooks] = (),
    ) -> None:
        self.name = validation.queue_name(name)
        _check_parts(settings, clock, durable)
        self.hooks = HookChain(_hooks(hooks))
        self.durability = Durability.wanted(settings, durable)
        self.settings = settings
        self.layout = QueueLayout(self.name, validation.shards(shards))
        self.shards = shard_operations(self.layout, clock, settings.clock_resync_interval)
        self.operations = self.shards[0]  # the queue itself, or its shard 0
        self.clock = self.operations.clock
        self._fsync_checked: set[int] = set()  # shards whose server can confirm fsyncs
        self.listed = False  # noted in the registry of queues by this client (list_queue)

    def list_queue(self) -> Plan[None]:
        """After this client's first write to the queue (its caller looks at ``listed``
        first): note it in the registry of queues, so that ``duetime queues`` lists it
        before any dispatcher has served it. After, not before: a write refused (a server
        that cannot confirm fsyncs) leaves nothing behind. Once per client; its failure
        does not fail the call."""
        self.listed = True
        yield from note_queue(self.layout)

    def check_fsync(self, index: int) -> Plan[None]:
        """Before the first durable write to shard ``index``, when fsyncs are to be
        confirmed: refuse a server that cannot (once per shard)."""
        if self.durability and self.durability.fsync and index not in self._fsync_checked:
            yield from self.shards[index].server.check_fsync()  # before writing, not after
            self._fsync_checked.add(index)

    def home(self, task_id: str) -> QueueOperations:
        """The shard a task id is written to."""
        return self.shards[self.layout.of_task(task_id)]

    def search_order(self, home: int) -> list[QueueOperations]:
        """Shards to look in for a task or cron job: its own first, then the others (it
        may have been written while the queue had another shard count)."""
        return [self.shards[home], *(s for i, s in enumerate(self.shards) if i != home)]

    def first_found(
        self, task_id: str, step: Callable[[QueueOperations], Plan[T | None]]
    ) -> Plan[T | None]:
        """The first answer other than None of ``step`` in the task's shards, in search
        order; None when no shard has one."""
        for shard in self.search_order(self.layout.of_task(task_id)):
            if (answer := (yield from step(shard))) is not None:
                return answer
        return None

    def cron_home(self, name: str) -> Plan[tuple[QueueOperations, CronJob]]:
        """The shard that holds the cron job ``name``, and its definition; raises
        TaskNotFoundError when none does."""
        validation.cron_name(name)
        for shard in self.search_order(self.layout.of_cron(name)):
            table = yield from shard.cron.cron_entry(name)
            blob = table.definitions.get(name)
            if blob is not None:
                return shard, decode_job(blob)
        raise TaskNotFoundError(f"no cron job {name!r} in queue {self.name!r}")

    def locate(self, task_id: str) -> Plan[tuple[QueueOperations, StatusReply]]:
        """The shard that knows the task and what it says (its home shard if none does)."""
        home = self.layout.of_task(task_id)
        found: tuple[QueueOperations, StatusReply] | None = None
        for shard in self.search_order(home):
            reply = yield from shard.producer.status(task_id)
            if reply.state != TaskState.UNKNOWN:
                return shard, reply
            found = found or (shard, reply)
        assert found is not None
        return found


def _check_parts(settings: object, clock: object, durable: object) -> None:
    """Refuse a constructor's ``settings``, ``clock`` or ``durable`` of the wrong type
    at once (InvalidOptionError), not as an obscure failure at the first call."""
    if not isinstance(settings, Settings):
        raise InvalidOptionError(
            f"settings must be a duetime.Settings, got {validation.shown(settings)}"
        )
    if clock is not None and not callable(getattr(clock, "now_ms", None)):
        raise InvalidOptionError(
            f"clock must be None (the server's clock) or a duetime Clock (with now_ms()), "
            f"got {validation.shown(clock)}"
        )
    if durable is not None and not isinstance(durable, bool):
        raise InvalidOptionError(
            f"durable must be None (follow the settings), True or False, got "
            f"{validation.shown(durable)}"
        )


def _hooks(hooks: object) -> list[Hooks]:
    """The hooks given to a constructor: duetime.Hooks, in a list (or any iterable)."""
    given = validation.items(hooks, "hooks")
    for position, hook in enumerate(given):
        if not isinstance(hook, Hooks):
            raise InvalidOptionError(
                f"hooks item {position}: expected a duetime.Hooks, got {validation.shown(hook)}"
            )
    return given
