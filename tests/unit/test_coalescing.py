"""The coalescers on their own, with senders that record what they were given: who
leads, what goes together, and that every caller gets its own outcome."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from duetime.client import MOST_PER_ROUND_TRIP, TaskCoalescer, ThreadCoalescer


class Refused(Exception):
    pass


def test_a_lone_caller_goes_at_once_alone() -> None:
    sent: list[int] = []

    def send_one(item: int) -> str:
        sent.append(item)
        return f"id-{item}"

    coalescer: ThreadCoalescer[int, str] = ThreadCoalescer(
        send_one, lambda items: pytest.fail("nothing waited, so nothing goes together")
    )
    assert [coalescer.submit(n) for n in range(3)] == ["id-0", "id-1", "id-2"]
    assert sent == [0, 1, 2]


def test_threads_that_arrive_during_a_round_trip_go_together_in_the_next() -> None:
    in_flight, release = threading.Event(), threading.Event()
    batches: list[list[int]] = []

    def send_one(item: int) -> str:
        in_flight.set()
        release.wait(5)  # the first round trip is slow: the others queue up behind it
        return f"id-{item}"

    def send_many(items: list[int]) -> list[str | BaseException]:
        batches.append(items)
        return [Refused(f"no {n}") if n == 3 else f"id-{n}" for n in items]

    coalescer: ThreadCoalescer[int, str] = ThreadCoalescer(send_one, send_many)
    outcomes: dict[int, str] = {}

    def call(n: int) -> None:
        try:
            outcomes[n] = coalescer.submit(n)
        except Refused as error:
            outcomes[n] = f"refused: {error}"

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert in_flight.wait(5)
    others = [threading.Thread(target=call, args=(n,)) for n in range(1, 6)]
    for thread in others:
        thread.start()
    while len(coalescer._waiting) < 5:  # all five wait behind the first
        threading.Event().wait(0.001)
    release.set()
    for thread in [first, *others]:
        thread.join(5)
    assert len(batches) == 1 and sorted(batches[0]) == [1, 2, 3, 4, 5]
    assert outcomes == {0: "id-0", 1: "id-1", 2: "id-2", 3: "refused: no 3", 4: "id-4",
                        5: "id-5"}  # fmt: skip
    assert not coalescer._in_flight  # the last leader stood down


def test_a_failed_round_trip_gives_each_caller_its_own_copy_of_the_error() -> None:
    in_flight, release = threading.Event(), threading.Event()

    def send_one(item: int) -> str:
        in_flight.set()
        release.wait(5)
        return "first"

    def send_many(items: list[int]) -> list[str | BaseException]:
        raise Refused("server said no")

    coalescer: ThreadCoalescer[int, str] = ThreadCoalescer(send_one, send_many)
    errors: list[BaseException] = []

    def call(n: int) -> None:
        try:
            coalescer.submit(n)
        except Refused as error:
            errors.append(error)

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert in_flight.wait(5)
    others = [threading.Thread(target=call, args=(n,)) for n in (1, 2)]
    for thread in others:
        thread.start()
    while len(coalescer._waiting) < 2:
        threading.Event().wait(0.001)
    release.set()
    for thread in [first, *others]:
        thread.join(5)
    assert len(errors) == 2 and errors[0] is not errors[1]
    assert all(str(error) == "server said no" for error in errors)
    assert coalescer.submit(7) == "first"  # not stuck in flight after a failure


class RecordedRoundTrips:
    """Async senders that record which calls went alone and which went together; each
    round trip takes ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.alone: list[int] = []
        self.batches: list[list[int]] = []

    async def send_one(self, item: int) -> str:
        self.alone.append(item)
        await asyncio.sleep(self.seconds)
        return f"id-{item}"

    async def send_many(self, items: list[int]) -> list[str | BaseException]:
        self.batches.append(items)
        await asyncio.sleep(self.seconds)
        return [f"id-{n}" for n in items]

    def coalescer(self) -> TaskCoalescer[int, str]:
        return TaskCoalescer(self.send_one, self.send_many)


def test_coroutines_that_arrive_during_a_round_trip_go_together_in_the_next() -> None:
    sent = RecordedRoundTrips(0.01)

    async def scenario() -> list[str]:
        coalescer = sent.coalescer()
        return await asyncio.gather(*(coalescer.submit(n) for n in range(50)))

    assert asyncio.run(scenario()) == [f"id-{n}" for n in range(50)]
    assert sent.alone == [0]
    assert sent.batches == [list(range(1, 50))]


def test_coroutines_that_schedule_in_a_loop_go_in_two_halves_that_take_turns() -> None:
    sent = RecordedRoundTrips(0.001)

    async def caller(coalescer: TaskCoalescer[int, str], first: int) -> list[str]:
        return [await coalescer.submit(n) for n in range(first, 100, 10)]

    async def scenario() -> list[list[str]]:
        coalescer = sent.coalescer()
        return await asyncio.gather(*(caller(coalescer, first) for first in range(10)))

    ids = asyncio.run(scenario())
    assert ids == [[f"id-{n}" for n in range(first, 100, 10)] for first in range(10)]
    # Only the very first call went alone: each caller answered came straight back and
    # went with others, not in a round trip of its own (before, 0, 11, 22, ... did).
    assert sent.alone == [0]
    # The ten that came back at once were split in two halves, which then took turns:
    # one half made its next calls while the other half's were in flight.
    assert [sorted(batch) for batch in sent.batches] == [
        list(range(1, 11)),
        *(list(range(n, min(n + 5, 100))) for n in range(11, 100, 5)),
    ]


def test_a_coroutine_cancelled_while_it_waits_is_not_sent() -> None:
    sent: list[int] = []

    async def send_one(item: int) -> str:
        sent.append(item)
        await asyncio.sleep(0.01)
        return f"id-{item}"

    async def send_many(items: list[int]) -> list[str | BaseException]:
        sent.extend(items)
        return [f"id-{n}" for n in items]

    async def scenario() -> None:
        coalescer: TaskCoalescer[int, str] = TaskCoalescer(send_one, send_many)
        first = asyncio.create_task(coalescer.submit(0))
        await asyncio.sleep(0)  # the first is in flight
        waiting = [asyncio.create_task(coalescer.submit(n)) for n in (1, 2, 3)]
        await asyncio.sleep(0)
        waiting[1].cancel()
        assert await first == "id-0"
        assert await waiting[0] == "id-1" and await waiting[2] == "id-3"
        with pytest.raises(asyncio.CancelledError):
            await waiting[1]
        assert await coalescer.submit(4) == "id-4"  # stood down, then goes at once

    asyncio.run(scenario())
    assert sent == [0, 1, 3, 4]


def test_a_round_trip_carries_at_most_one_script_batch() -> None:
    batches: list[int] = []

    async def send_one(item: int) -> str:
        await asyncio.sleep(0.01)
        return "x"

    async def send_many(items: list[int]) -> list[str | BaseException]:
        batches.append(len(items))
        return ["x"] * len(items)

    async def scenario() -> None:
        coalescer: TaskCoalescer[int, str] = TaskCoalescer(send_one, send_many)
        await asyncio.gather(*(coalescer.submit(n) for n in range(MOST_PER_ROUND_TRIP + 11)))

    asyncio.run(scenario())
    assert batches == [MOST_PER_ROUND_TRIP, 10]


def test_a_coalescer_left_in_flight_by_a_closed_loop_works_in_the_next() -> None:
    never = asyncio.Event()

    async def send_one(item: int) -> str:
        if item == 0:
            await never.wait()  # in flight when its loop ends
        return f"id-{item}"

    async def send_many(items: list[int]) -> list[str | BaseException]:
        return [f"id-{n}" for n in items]

    coalescer: TaskCoalescer[int, str] = TaskCoalescer(send_one, send_many)

    async def abandoned() -> None:
        asyncio.get_running_loop().create_task(coalescer.submit(0))
        await asyncio.sleep(0)

    # A loop closed with call 0 still in flight (its task is never finished or cancelled).
    loop = asyncio.new_event_loop()
    loop.run_until_complete(abandoned())
    loop.close()

    async def later() -> str:
        return await asyncio.wait_for(coalescer.submit(1), 5)

    assert asyncio.run(later()) == "id-1"


def test_a_forked_child_does_not_wait_for_a_call_its_parent_had_in_flight() -> None:
    in_flight, release = threading.Event(), threading.Event()

    def send_one(item: int) -> str:
        if item == 0:
            in_flight.set()
            release.wait(10)
        return f"id-{item}"

    coalescer: ThreadCoalescer[int, str] = ThreadCoalescer(send_one, lambda items: [])
    first = threading.Thread(target=coalescer.submit, args=(0,))
    first.start()
    assert in_flight.wait(5)
    child = os.fork()
    if child == 0:  # the child: the thread of call 0 does not exist here
        signal.alarm(10)  # a child that waits for ever dies of SIGALRM: the test fails
        os._exit(0 if coalescer.submit(1) == "id-1" else 1)
    release.set()
    first.join(5)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
