"""Coalescing: single schedule calls that arrive while one is on its way to Redis go
together in the next round trip.

A producer that schedules from many threads (or coroutines) at once would otherwise
spend one round trip per call, and its throughput would be bounded by the round-trip
time times the connections it holds. Here at most one round trip per queue object is in
flight; the calls that arrive meanwhile wait, and the next round trip carries all of
them in one script call. A call alone (nothing in flight) goes at once, as it would
without coalescing, so a lone caller pays nothing but a lock. (Durable calls are not
coalesced: see ``client.queue.coalesced``.)

Each call is validated by its caller before it joins (a bad call fails alone, and
nothing of it is written), and each caller gets its own id, or its own copy of the
error when the round trip fails. The leader of a round trip is a caller: the thread
whose call found nothing in flight, then, when its round trip returns, the first of
those that waited meanwhile (so a caller's wait is bounded by two round trips, not by
the traffic behind it). In asyncio, a task of its own carries the waiting calls, so
that a caller cancelled while it waits does not leave the others waiting. When all the
callers it answered come straight back with their next calls (coroutines scheduling in a
loop), it sends them in two halves that then take turns: one half makes its calls while
the other half's are on the server.
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

#: Most calls carried by one round trip: one schedule script call's batch.
MOST_PER_ROUND_TRIP = 1000

#: What a batch sender returns: one result, or one error, per call, in order.
Outcomes = Sequence["Result | BaseException"]


def _own(error: BaseException) -> BaseException:
    """A caller's own copy of an error shared by a round trip (several threads raising
    one exception object would tangle its traceback)."""
    try:
        return copy.copy(error)
    except Exception:  # an exception class that cannot be copied: share it
        return error


class _Call(Generic[Item, Result]):
    __slots__ = ("batch", "error", "finished", "item", "result", "woken")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.result: Result | None = None
        self.error: BaseException | None = None
        self.finished = False
        self.batch: list[_Call[Item, Result]] | None = None  # set when it leads one
        self.woken: threading.Event | None = None

    def settle(self, outcome: Result | BaseException) -> None:
        if isinstance(outcome, BaseException):
            self.error = outcome
        else:
            self.result = outcome
        self.finished = True

    def outcome(self) -> Result:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


class ThreadCoalescer(Generic[Item, Result]):
    """Coalesces calls from many threads. ``send_one`` sends a call alone; ``send_many``
    sends several in one round trip and returns one result or error per call (it may
    raise too: then every call of the batch gets that error)."""

    def __init__(
        self,
        send_one: Callable[[Item], Result],
        send_many: Callable[[list[Item]], Outcomes[Result]],
    ) -> None:
        self._send_one = send_one
        self._send_many = send_many
        self._forget_the_calls()
        _thread_coalescers.add(self)

    def _forget_the_calls(self) -> None:
        """No call in flight or waiting: at the start, and in a forked child, where the
        threads that made them do not exist (they would be waited for for ever)."""
        self._lock = threading.Lock()
        self._in_flight = False
        self._waiting: list[_Call[Item, Result]] = []

    def submit(self, item: Item) -> Result:
        with self._lock:
            alone = not self._in_flight
            if alone:
                self._in_flight = True
            else:
                call: _Call[Item, Result] = _Call(item)
                call.woken = woken = threading.Event()
                self._waiting.append(call)
        if alone:  # the usual case, kept to a plain call: its errors are its own
            try:
                return self._send_one(item)
            finally:
                self._hand_over()
        woken.wait()  # until its outcome is in, or it is handed a batch to lead
        if call.batch is not None:
            try:
                self._send(call.batch)
            finally:
                self._hand_over()
        return call.outcome()

    def _send(self, batch: list[_Call[Item, Result]]) -> None:
        try:
            if len(batch) == 1:
                batch[0].settle(self._send_one(batch[0].item))
                return
            outcomes = self._send_many([call.item for call in batch])
            for call, outcome in zip(batch, outcomes, strict=True):
                call.settle(outcome)
        except BaseException as error:
            for call in batch:
                if not call.finished:
                    call.settle(_own(error))
            if isinstance(error, Exception):
                return  # each caller raises its copy
            raise  # KeyboardInterrupt and the like stop the leader too
        finally:
            for call in batch[1:]:
                assert call.woken is not None
                call.woken.set()

    def _hand_over(self) -> None:
        """Give the calls that waited meanwhile to the first of them, or stand down."""
        with self._lock:
            if not self._waiting:
                self._in_flight = False
                return
            batch = self._waiting[:MOST_PER_ROUND_TRIP]
            del self._waiting[:MOST_PER_ROUND_TRIP]
        leader = batch[0]
        leader.batch = batch
        assert leader.woken is not None
        leader.woken.set()


_thread_coalescers: weakref.WeakSet[ThreadCoalescer[Any, Any]] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for coalescer in list(_thread_coalescers):
        coalescer._forget_the_calls()


os.register_at_fork(after_in_child=_after_fork_in_child)


class TaskCoalescer(Generic[Item, Result]):
    """Coalesces calls from many coroutines of one event loop (see ThreadCoalescer)."""

    def __init__(
        self,
        send_one: Callable[[Item], Awaitable[Result]],
        send_many: Callable[[list[Item]], Awaitable[Outcomes[Result]]],
    ) -> None:
        self._send_one = send_one
        self._send_many = send_many
        self._in_flight = False
        self._waiting: list[tuple[Item, asyncio.Future[Result]]] = []
        self._carrier: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # where the calls in flight are

    async def submit(self, item: Item) -> Result:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # A queue object used from a new event loop (asyncio.run again): whatever
            # was in flight on the old one ended with it, and must not hold this one up.
            self._loop, self._in_flight = loop, False
            self._waiting.clear()
        if not self._in_flight:
            self._in_flight = True
            try:
                return await self._send_one(item)
            finally:
                self._hand_over()
        future: asyncio.Future[Result] = loop.create_future()
        self._waiting.append((item, future))
        return await future

    def _hand_over(self) -> None:
        if not self._waiting:
            self._in_flight = False
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # closed outside its loop, which is gone: see submit
            return
        self._carrier = loop.create_task(self._carry())

    async def _carry(self) -> None:
        """Send what waits, round trip after round trip, until nothing does."""
        batch: list[tuple[Item, asyncio.Future[Result]]] = []
        try:
            while True:
                if self._waiting:
                    most = MOST_PER_ROUND_TRIP
                elif await self._callers_came_back():
                    # They all came back at once: half of them go now, half in the next
                    # round trip. From then on one half makes its next calls while the
                    # other half's are on the server, rather than all waiting on both.
                    most = min((len(self._waiting) + 1) // 2, MOST_PER_ROUND_TRIP)
                else:
                    break
                batch = self._waiting[:most]
                del self._waiting[:most]
                # A caller cancelled while it waited is not sent: nothing of it is written.
                batch = [(item, future) for item, future in batch if not future.done()]
                if not batch:
                    continue
                try:
                    if len(batch) == 1:
                        outcomes: Outcomes[Result] = [await self._send_one(batch[0][0])]
                    else:
                        outcomes = await self._send_many([item for item, _ in batch])
                except Exception as error:
                    outcomes = [_own(error) for _ in batch]
                for (_, future), outcome in zip(batch, outcomes, strict=True):
                    if future.done():
                        continue
                    if isinstance(outcome, BaseException):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
        finally:
            self._in_flight = False
            # Left only when the carrier itself was cancelled (its loop is closing).
            for _, future in [*batch, *self._waiting]:
                future.cancel()
            self._waiting.clear()

    async def _callers_came_back(self) -> bool:
        """Whether calls wait once the callers just answered have had a turn of the loop.
        A caller that schedules in a loop makes its next call at once: without this turn
        the first of them would find nothing in flight and go alone, a round trip of one
        call with all the others waiting behind it."""
        await asyncio.sleep(0)
        return bool(self._waiting)
