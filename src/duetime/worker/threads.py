"""The thread runner of a worker: plain-function handlers run off the event loop, on
threads of the worker's own, handed work and results in batches."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections import deque
from typing import Any


class ThreadCall:
    """One call of a plain handler on the worker's threads. Only the thread that takes
    it writes its outcome; the loop reads it once ``done`` is resolved."""

    __slots__ = ("abandoned", "context", "data", "done", "error", "function", "thread", "value")

    def __init__(
        self, done: asyncio.Future[None], context: contextvars.Context, function: Any, data: Any
    ) -> None:
        self.done = done
        self.context = context
        self.function = function
        self.data = data
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread: _Thread | None = None  # the thread running it, while it runs
        self.abandoned = False  # timed out or cancelled before a thread took it


class _Thread:
    __slots__ = ("abandoned", "wake")

    def __init__(self) -> None:
        self.wake = threading.Lock()  # held while the thread is parked; released to wake it
        self.wake.acquire()
        self.abandoned = False  # left to a hung handler; exits when (if ever) it returns


class ThreadRunner:
    """Runs plain-function handlers off the event loop, on at most ``size`` threads of
    its own, with hand-offs in batches both ways.

    A pool hand-off per call (a future, a queue put, a thread woken, a call_soon_threadsafe
    back) costs more than a no-op handler by far. Here, calls wait in one deque, and threads
    stay awake while there is work: a thread that finishes a call takes the next one
    without being woken. Finished calls are handed back in bulk: the loop is woken once
    for all the calls that finished since it last looked.

    Blocking handlers must not hold up the calls behind them, so a thread never keeps work
    waiting alone: whenever a call is taken while others still wait and no other thread is
    free (awake, not inside a handler), one more is woken, or started, up to ``size``.
    A handler that blocks thus hands the queue on to another thread within a wake-up;
    handlers that return at once leave one thread doing all the work, the others parked.

    A call that timed out is abandoned with its thread: the thread no longer counts, so a
    hung handler does not eat the worker's capacity, and it exits if it ever returns.
    Threads are daemon threads: a handler still hung when the process exits does not
    keep it alive (its task was handed back, and runs again elsewhere)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: deque[ThreadCall] = deque()
        self._finished: deque[ThreadCall] = deque()
        self._lock = threading.Lock()  # guards the counts, _parked and _reporting
        self._parked: list[_Thread] = []
        self._threads = 0  # live, not abandoned
        self._free = 0  # awake and not inside a handler (or about to wake)
        self._reporting = False  # a hand-back to the loop is scheduled
        self._closed = False

    def submit(self, function: Any, data: Any) -> ThreadCall:
        """Queue ``function(data)``, run in a copy of the caller's context; await
        ``call.done``, then read ``call.value`` or ``call.error``."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        call = ThreadCall(loop.create_future(), contextvars.copy_context(), function, data)
        with self._lock:  # a thread decides to park under it: see _work
            self._waiting.append(call)
            if not self._free:
                self._wake_one()
        return call

    def abandon(self, call: ThreadCall) -> None:
        """Give up on a call (timed out, or its attempt was cancelled): one not taken yet
        is skipped; the thread of one running is left to it and replaced."""
        with self._lock:
            call.abandoned = True
            thread = call.thread  # None unless a thread runs it right now
            if thread is not None and not thread.abandoned:
                thread.abandoned = True
                self._threads -= 1

    def close(self) -> None:
        """Drop the calls not started and let the parked threads exit."""
        with self._lock:
            self._closed = True
            self._waiting.clear()
            parked, self._parked = self._parked, []
        for thread in parked:
            thread.wake.release()

    def _wake_one(self) -> None:
        # Called with the lock held.
        if self._closed:
            return
        if self._parked:
            self._free += 1
            self._parked.pop().wake.release()
        elif self._threads < self._size:
            self._free += 1
            self._threads += 1
            thread = _Thread()
            threading.Thread(
                target=self._work, args=(thread,), name="duetime-task", daemon=True
            ).start()

    def _work(self, me: _Thread) -> None:
        waiting, lock = self._waiting, self._lock
        while True:
            try:
                call = waiting.popleft()
            except IndexError:
                with lock:
                    if self._closed:
                        self._free -= 1
                        return
                    if waiting:  # one came in between: take it
                        continue
                    self._free -= 1
                    self._parked.append(me)
                me.wake.acquire()  # parked until woken
                if self._closed:
                    return
                continue
            with lock:
                if call.abandoned:
                    continue
                call.thread = me
                self._free -= 1
                if waiting and not self._free:
                    self._wake_one()  # this handler may block: keep the rest moving
            try:
                call.value = call.context.run(call.function, call.data)
            except BaseException as error:  # the attempt's failure, whatever it is
                call.error = error
            with lock:
                call.thread = None
                if me.abandoned:
                    return  # replaced meanwhile; its result is not wanted
                self._free += 1
                self._finished.append(call)
                if self._reporting:
                    continue
                self._reporting = True
            assert self._loop is not None
            try:
                self._loop.call_soon_threadsafe(self._hand_back)
            except RuntimeError:  # the loop is closed: nobody waits for the results
                return

    def _hand_back(self) -> None:
        """On the loop: resolve every call finished since the last hand-back."""
        with self._lock:
            self._reporting = False
            finished, self._finished = self._finished, deque()
        for call in finished:
            if not call.done.done():  # cancelled when its attempt was
                call.done.set_result(None)
