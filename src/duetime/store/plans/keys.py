"""Key names and where a task lives. Every key of queue Q carries the hash tag {Q}, so
a queue lives in one Redis Cluster slot and every script touches one slot. A sharded
queue is several such tag spaces (``layout.QueueLayout``): shard 0 is the queue's own tag, so
an unsharded queue is its shard 0, and shard i > 0 is tagged ``{Q#i}`` ("#" is not
allowed in a queue name, so no shard tag is ever another queue's). No key is spelled
elsewhere."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

PREFIX = "duetime"


# Long: one property per key of a queue, each saying its type and what it holds: a table
# a reader looks a key up in, not code to follow.
@dataclass(frozen=True, slots=True)
class QueueKeys:
    queue: str

    def _key(self, part: str) -> str:
        return f"{PREFIX}:{{{self.queue}}}:{part}"

    @property
    def tasks(self) -> str:
        """HASH task id -> envelope."""
        return self._key("tasks")

    @property
    def scheduled(self) -> str:
        """ZSET task id -> run-at (ms, to the µs): delayed tasks, retries, re-entered tasks."""
        return self._key("scheduled")

    @property
    def delayed(self) -> str:
        """ZSET bucket name "<generation>:<bucket>" -> the earliest run-at in that bucket
        (ms): the index of the buckets that hold delayed tasks (see ``DelayedBuckets``)."""
        return self._key("delayed")

    def delayed_bucket(self, name: str) -> str:
        """ZSET task id -> run-at (ms): one bucket of delayed tasks. Small enough for the
        server's compact listpack encoding, which is what makes a delayed task lean."""
        return self._key(f"delayed:{name}")

    @property
    def delayed_layout(self) -> str:
        """HASH: "generation" -> the generation new delayed tasks go to (2^generation
        buckets); "tasks" -> how many tasks the buckets hold."""
        return self._key("delayed_layout")

    @property
    def ready(self) -> str:
        """LIST of task ids due now."""
        return self._key("ready")

    @property
    def early(self) -> str:
        """HASH task id -> the time (ms) a task is due from, when that is not its
        envelope's run-at: the run-at of an id promoted to ``ready`` shortly before it
        (the claiming worker waits until then), or when a retry is due, or when a task
        was requeued or re-entered. The claiming worker takes the entry; the attempt's
        lateness counts from it."""
        return self._key("early")

    @property
    def leases(self) -> str:
        """ZSET "<worker>|<task id>" -> lease deadline (ms)."""
        return self._key("leases")

    @property
    def workers(self) -> str:
        """ZSET worker id -> last heartbeat (ms)."""
        return self._key("workers")

    @property
    def attempts(self) -> str:
        """HASH task id -> attempts started (present once a task was first claimed)."""
        return self._key("attempts")

    @property
    def errors(self) -> str:
        """HASH task id -> last error record (while retried or dead)."""
        return self._key("errors")

    @property
    def dead(self) -> str:
        """ZSET task id -> time of death (ms)."""
        return self._key("dead")

    @property
    def reaped(self) -> str:
        """ZSET reaped worker id -> when a dispatcher looks at its processing list once
        more (a BLMOVE it left pending on the server may still move an id there)."""
        return self._key("reaped")

    @property
    def gone_workers(self) -> str:
        """LIST of the workers reaped last, newest first: each one's last heartbeat, when
        it was reaped and the tasks taken back (lua/include/gone_workers.lua)."""
        return self._key("gone_workers")

    @property
    def wake(self) -> str:
        """LIST holding at most one element: a sleeping dispatcher's alarm."""
        return self._key("wake")

    @property
    def stats(self) -> str:
        """HASH of counters (scheduled, completed, failed, retried, dead, fenced, ...)."""
        return self._key("stats")

    @property
    def cron(self) -> str:
        """HASH cron job name -> definition."""
        return self._key("cron")

    @property
    def cron_next(self) -> str:
        """ZSET cron job name -> its next tick (ms); a paused job is absent."""
        return self._key("cron_next")

    @property
    def cron_last(self) -> str:
        """HASH cron job name -> task id of its latest fired tick."""
        return self._key("cron_last")

    @property
    def cron_held(self) -> str:
        """HASH cron job name -> a tick held back while the previous run is live."""
        return self._key("cron_held")

    @property
    def cron_state(self) -> str:
        """HASH cron job name -> "<runs>|<failed runs in a row>|<ended>|<run to judge>",
        for jobs with max_runs or pause_after_failures, and jobs that ended."""
        return self._key("cron_state")

    @property
    def cron_backfill(self) -> str:
        """HASH cron job name -> its backfill: "<from>|<to>|<spacing ms>|<next tick>|
        <ticks fired>|<ticks in all>|<skipped>|<ran before>|<covered spans>" (next tick
        -1: done)."""
        return self._key("cron_backfill")

    @property
    def cron_backfill_due(self) -> str:
        """ZSET cron job name -> when its backfill fires its next tick (ms)."""
        return self._key("cron_backfill_due")

    @property
    def cron_fired(self) -> str:
        """HASH cron job name -> the spans of ticks its schedule enqueued: "<open low>|
        <low>:<high>,..." (ms, newest first; the open one ends at cron_last's tick)."""
        return self._key("cron_fired")

    @property
    def minutes(self) -> str:
        """HASH "<minute>:<figure>" -> count, per minute since the epoch (server clock):
        completed, retried, dead, late_sum_us, late_max_us (start lateness of completed
        attempts). Dispatchers trim minutes older than an hour."""
        return self._key("minutes")

    @property
    def paused(self) -> str:
        """STRING present while the queue is paused: workers claim nothing."""
        return self._key("paused")

    @property
    def resumed(self) -> str:
        """LIST holding one element while the queue is not paused; paused workers block
        on it (non-destructively), so a resume wakes them all at once."""
        return self._key("resumed")

    @property
    def limits(self) -> str:
        """HASH: the queue's flow control ("cap", "rate", "each_concurrency", "each_rate",
        "concurrency:<key>", "rate:<key>", "since"). While it exists the queue is under
        flow control: due tasks wait in ``due`` and start by rank, turns and limits."""
        return self._key("limits")

    @property
    def flow_records(self) -> str:
        """HASH task id -> "<priority>|<cost>|<rank>|<limit key>", for tasks of a queue
        under flow control (rank: set once the task is due)."""
        return self._key("flow")

    @property
    def due(self) -> str:
        """ZSET, scores 0: "<limit key>\0<rank>\0<task id>": due tasks of a queue under
        flow control, waiting for their turn; BYLEX, a key's best-ranked task first."""
        return self._key("due")

    @property
    def turns(self) -> str:
        """ZSET limit key -> its turn: the keys whose due tasks are taken in turn."""
        return self._key("turns")

    @property
    def throttled(self) -> str:
        """ZSET limit key (or "\0", the queue) -> when its rate limit lets it start (ms)."""
        return self._key("throttled")

    @property
    def rate_state(self) -> str:
        """ZSET limit key (or "\0", the queue) -> its rate's theoretical arrival time
        (GCRA, ms); entries in the past mean nothing and are dropped."""
        return self._key("rates")

    @property
    def flow_holds(self) -> str:
        """HASH limit key (or "\0", the queue) -> when its latest hold by a limit (a rate
        wait, a snooze) ended (ms), or "slot" while it runs all it may: how long limits
        held a task that starts, so that its lateness counts from then (flow_holds.lua)."""
        return self._key("holds")

    @property
    def running(self) -> str:
        """ZSET, scores 0: "<limit key>\0<worker>|<task id>": started tasks of a queue
        under flow control, while they hold their lease (the slots its limits count)."""
        return self._key("running")

    @property
    def keyed(self) -> str:
        """HASH "<mode>:<key>" -> the record of a debounce ("d:"), throttle ("t:") or
        unique ("u:") key: the task it names and its timing (see lua/include/keyed.lua)."""
        return self._key("keyed")

    @property
    def keyed_expiry(self) -> str:
        """ZSET "<mode>:<key>" -> when (ms) its record means nothing more, or when to look
        at a unique key's task again: dispatchers drop the records past it."""
        return self._key("keyed_expiry")

    @property
    def keyed_tasks(self) -> str:
        """HASH task id -> the "<mode>:<key>" whose record names it (for its status)."""
        return self._key("keyed_tasks")

    @property
    def keyed_keys(self) -> tuple[str, ...]:
        """The keys of a debounce, throttle or unique call, in the order its script takes
        them (debounce_task.lua)."""
        return (
            self.tasks,
            self.scheduled,
            self.ready,
            self.wake,
            self.stats,
            self.delayed,
            self.limits,
            self.flow_records,
            self.due,
            self.early,
            self.attempts,
            self.keyed,
            self.keyed_expiry,
            self.keyed_tasks,
            self.dead,
            self.turns,
            self.throttled,
            self.rate_state,
            self.running,
            self.leases,
            self.flow_holds,
        )

    @property
    def flow_keys(self) -> tuple[str, str, str, str, str, str, str]:
        """The keys of flow control, in the order the scripts take them (flow.lua, which
        every flow part includes)."""
        return (
            self.limits,
            self.flow_records,
            self.due,
            self.turns,
            self.throttled,
            self.rate_state,
            self.running,
        )

    @property
    def cancelling(self) -> str:
        """HASH task id -> when (ms) a cancel of the running task was asked: the step
        that ends its attempt ends it as cancelled, and takes the entry (cancelling.lua)."""
        return self._key("cancelling")

    @property
    def cancel_channel(self) -> str:
        """The pub/sub channel (not a key) on which a cancel of a running task publishes
        its id, for the worker that holds it (cancel_task.lua, store/cancel_signals.py)."""
        return self._key("cancels")

    @property
    def history_state(self) -> str:
        """HASH: "size" (how many finished attempts the history keeps; absent: the
        default, 0: none) and "seq" (the number of its newest entry)."""
        return self._key("history_state")

    @property
    def history(self) -> str:
        """LIST of finished attempts (msgpack entries), newest first, capped at the
        history's size: entry number n is at index seq - n."""
        return self._key("history")

    @property
    def history_tasks(self) -> str:
        """ZSET task id -> the number of its newest entry in ``history`` (each entry
        names the task's one before), for the entries still kept."""
        return self._key("history_tasks")

    @property
    def history_keys(self) -> tuple[str, str, str]:
        """The keys of the history, in the order the scripts take them (history.lua)."""
        return (self.history_state, self.history, self.history_tasks)

    def active(self, worker_id: str) -> str:
        """LIST of task ids a worker has taken (its BLMOVE destination)."""
        return self._key(f"active:{worker_id}")

    @property
    def active_pattern(self) -> str:
        return self._key("active:*")

    @property
    def all_keys_pattern(self) -> str:
        """A SCAN pattern matching every key of the queue."""
        return self._key("*")

    def worker_of_active(self, key: str) -> str:
        return key.removeprefix(self._key("active:"))

    def result(self, task_id: str) -> str:
        """LIST holding one result record, with a TTL."""
        return self._key(f"result:{task_id}")


#: The Redis type duetime keeps at each key of a queue, by the part of its name after
#: the hash tag; parts ending in ":" are prefixes (one key per worker, bucket or task).
_KEY_TYPES = {
    "tasks": "hash", "scheduled": "zset", "delayed": "zset", "delayed:": "zset",
    "delayed_layout": "hash", "ready": "list", "early": "hash", "leases": "zset",
    "workers": "zset", "attempts": "hash", "errors": "hash", "dead": "zset",
    "reaped": "zset", "wake": "list", "stats": "hash", "cron": "hash", "cron_next": "zset",
    "cron_last": "hash", "cron_held": "hash", "cron_state": "hash", "cron_backfill": "hash",
    "cron_backfill_due": "zset", "cron_fired": "hash", "minutes": "hash", "paused": "string",
    "resumed": "list", "active:": "list", "result:": "list", "limits": "hash",
    "flow": "hash", "due": "zset", "turns": "zset", "throttled": "zset", "rates": "zset",
    "running": "zset", "holds": "hash", "keyed": "hash", "keyed_expiry": "zset",
    "keyed_tasks": "hash",
    "history_state": "hash", "history": "list", "history_tasks": "zset",
    "gone_workers": "list",
}  # fmt: skip


def key_type(key: str) -> str | None:
    """The type (as TYPE names it) duetime keeps at ``key``, a key of some queue; None
    for a name that is not one of a queue's keys."""
    if not key.startswith(f"{PREFIX}:{{"):
        return None
    part = key.partition("}:")[2]  # a queue name holds no brace
    kind = _KEY_TYPES.get(part)
    if kind is None and ":" in part:
        kind = _KEY_TYPES.get(part.partition(":")[0] + ":")
    return kind


#: The most generations of delayed buckets: generation g has 2^g buckets, addressed by
#: 24 bits of a hash of the id.
MAX_GENERATION = 24
#: A delayed task's bucket is read from these bits of the CRC-32 of its id: not the low
#: bits, which pick the shard of a sharded queue (CRC-32 mod the shard count), so that
#: every bucket of a shard is used.
_BUCKET_SHIFT = 8


def id_hash(task_id: str) -> int:
    """The 24-bit hash that places a task id in a delayed bucket of any generation."""
    return zlib.crc32(task_id.encode("utf-8", "surrogateescape")) >> _BUCKET_SHIFT


def bucket_name(task_id: str, generation: int) -> str:
    """The bucket of ``task_id`` in ``generation``: "<generation>:<bucket>"."""
    return f"{generation}:{id_hash(task_id) & ((1 << generation) - 1)}"


def lease_member(worker_id: str, task_id: str) -> str:
    return f"{worker_id}|{task_id}"


def split_lease_member(member: str) -> tuple[str, str]:
    worker_id, _, task_id = member.partition("|")
    return worker_id, task_id
