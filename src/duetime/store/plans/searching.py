"""The search's plans: walk the hash of tasks (or of last errors) a bounded page at a
time with ``HSCAN``, count what a walk has to cover, and read where many tasks are in
one round trip.

``HSCAN`` holds the server for one page only (about ``count`` entries), and its cursor
lets a caller stop anywhere and go on later: entries present for the whole walk come at
least once, and may come twice when the server resizes the hash meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from duetime.store.plans import scripts
from duetime.store.plans.base import QueuePlans, QueueState
from duetime.store.plans.producing import ProducerPlans, StatusReply, status_reply
from duetime.store.plans.replies import as_text, pairs
from duetime.store.plans.requests import Command, EvalMany, Plan

#: Which hash a walk reads: every live task's envelope, the last error of each task that
#: failed an attempt (retrying or dead), or the flow record of each task that has one.
Walked = Literal["tasks", "errors", "keys"]


class SearchPlans(QueuePlans):
    """The plans a search is made of (``duetime.client.searching`` joins them); where a
    match is, the producer's plans read (``status``, on the same state)."""

    def __init__(self, state: QueueState, producer: ProducerPlans) -> None:
        super().__init__(state)
        self.producer = producer

    def walked_key(self, walked: Walked) -> str:
        k = self.keys
        return {"tasks": k.tasks, "errors": k.errors, "keys": k.flow_records}[walked]

    def scan_page(
        self, walked: Walked, cursor: int, count: int
    ) -> Plan[tuple[int, list[tuple[str, bytes]]]]:
        """One page of the walk from ``cursor``: the next cursor (0 once the walk is
        over) and about ``count`` entries (id, value as stored)."""
        reply = yield Command(("HSCAN", self.walked_key(walked), cursor, "COUNT", count))
        next_cursor, entries = reply
        return int(next_cursor), [(as_text(name), value) for name, value in pairs(entries)]

    def walk_size(self, walked: Walked) -> Plan[int]:
        """How many entries the hash a walk reads holds (HLEN)."""
        return int((yield Command(("HLEN", self.walked_key(walked)))))

    def statuses(self, task_ids: Sequence[str]) -> Plan[list[StatusReply]]:
        """Where each task is (as ``status``), every task_status call in one round
        trip; a call told of a newer generation of delayed buckets is made again alone."""
        if not task_ids:
            return []
        producer = self.producer
        yield from producer.learn_generation()
        generation = self.state.generation
        assert generation is not None
        calls = [
            producer.status_call(task_id, generation, producer.bucket_keys(task_id, generation))
            for task_id in task_ids
        ]
        replies: list[Any] = yield EvalMany(
            scripts.TASK_STATUS, [(call.keys, call.args) for call in calls]
        )
        found = []
        for task_id, reply in zip(task_ids, replies, strict=True):
            if isinstance(reply, int):
                self.state.generation = reply
                found.append((yield from producer.status(task_id)))
            else:
                found.append(status_reply(reply))
        return found
