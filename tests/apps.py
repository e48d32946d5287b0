"""Handlers for tests that run workers as separate processes. They record each run
in the server named by $DUETIME_TEST_RECORD_URL, so the test can watch them."""

from __future__ import annotations

import contextvars
import os
import time

import redis

import duetime
from duetime.worker.state import current_attempt

app = duetime.App()
_record = redis.Redis.from_url(os.environ.get("DUETIME_TEST_RECORD_URL", "redis://127.0.0.1:1/0"))
RUNS = "test:runs"


@app.default
def record(data: dict[str, object]) -> None:
    context = duetime.current_task()
    _record.rpush(RUNS, f"{context.id}:{context.attempt}")


@app.task
def stall_first_attempt(data: dict[str, object]) -> None:
    """Records the run; the first attempt then hangs so the test can kill the process."""
    context = duetime.current_task()
    _record.rpush(RUNS, f"{context.id}:{context.attempt}")
    if context.attempt == 1:
        time.sleep(60)


@app.task
async def slow(data: dict[str, float]) -> None:
    import asyncio

    context = duetime.current_task()
    await asyncio.sleep(float(data.get("seconds", 0.5)))
    _record.rpush(RUNS, f"{context.id}:{context.attempt}")


# --- ledger handlers for the fault-injection tests (tests/reliability/test_faults.py) ---
#: Each attempt appends "start" when it begins and "done" when its handler finishes:
#: "<kind> <task id> <attempt> <pid> <wall ms> <run-at ms>". The wall clock is this
#: host's, which on loopback is the clock the server's TIME reads too.
LEDGER = "test:ledger"


def _ledger(kind: str) -> None:
    _record.rpush(LEDGER, _ledger_entry(kind))


def _ledger_entry(kind: str) -> str:
    context = duetime.current_task()
    return (
        f"{kind} {context.id} {context.attempt} {os.getpid()} {time.time() * 1000:.3f} "
        f"{context.run_at * 1000:.3f}"  # run-at keeps microseconds
    )


@app.task
def ledger(data: dict[str, float]) -> None:
    """Records start and end; works for ``data["work"]`` seconds in between."""
    _ledger("start")
    if data.get("work"):
        time.sleep(float(data["work"]))
    _ledger("done")


@app.task
def ledger_stoppable(data: dict[str, float]) -> None:
    """As ``ledger``, working in steps of 10 ms with a look at ``cancelled`` before each:
    an attempt whose task was cancelled records "stopped" and ends."""
    _ledger("start")
    context = duetime.current_task()
    end = time.monotonic() + float(data.get("work", 0))
    while time.monotonic() < end:
        if context.cancelled:
            _ledger("stopped")
            context.raise_if_cancelled()
        time.sleep(0.01)
    _ledger("done")


@app.task
async def ledger_stoppable_async(data: dict[str, float]) -> None:
    """As ``ledger``, async: a cancelled attempt records "stopped" as it is cancelled."""
    import asyncio

    _ledger("start")
    try:
        await asyncio.sleep(float(data.get("work", 0)))
    except asyncio.CancelledError:
        _ledger("stopped")
        raise
    _ledger("done")


@app.task
def hang_first_attempt(data: dict[str, object]) -> None:
    """The first attempt never returns (a thread cannot be interrupted); later ones do."""
    import threading

    _ledger("start")
    if duetime.current_task().attempt == 1:
        threading.Event().wait()
    _ledger("done")


@app.task
def hang_always(data: dict[str, object]) -> None:
    """Never returns, on any attempt."""
    import threading

    _ledger("start")
    threading.Event().wait()


# --- handlers raising BaseExceptions (tests/reliability/test_hostile_input.py) ----------
#: Each records its run, then raises something that is not an ``Exception``: the attempt
#: must fail like any other (retried, then dead), never end the worker's process.


def _record_run() -> None:
    context = duetime.current_task()
    _record.rpush(RUNS, f"{context.id}:{context.attempt}")


@app.task
def exit_sync(data: dict[str, object]) -> None:
    _record_run()
    raise SystemExit("handler exit")


@app.task
async def exit_async(data: dict[str, object]) -> None:
    _record_run()
    raise SystemExit("handler exit")


@app.task
def interrupt_sync(data: dict[str, object]) -> None:
    _record_run()
    raise KeyboardInterrupt


@app.task
async def interrupt_async(data: dict[str, object]) -> None:
    _record_run()
    raise KeyboardInterrupt


# --- server-clock handler for the skewed-host-clock test (test_clock_skew.py) -----------
#: Each attempt appends "<id>:<attempt>:<server µs>:<run-at ms>:<wall µs>" at its start:
#: the server's TIME (the one clock duetime goes by; read after the start, so it can only
#: be later than the start), the run-at duetime handed the attempt, and this process's
#: own wall clock read right before TIME, which shows whether its clock is skewed.
SERVER_CLOCK_RUNS = "test:server_clock_runs"


@app.task
def server_clock(data: dict[str, object]) -> None:
    context = duetime.current_task()
    wall_us = time.time_ns() // 1000
    seconds, micros = _record.time()
    _record.rpush(
        SERVER_CLOCK_RUNS,
        f"{context.id}:{context.attempt}:{seconds * 1_000_000 + micros}:"
        f"{round(context.run_at * 1000)}:{wall_us}",
    )


# --- flow-control ledger (tests/reliability/test_flow_faults.py) -------------------------
#: Beside the ledger's "start" and "done" records, each attempt of ``flow_ledger`` appends
#: "claim <task id> <attempt> <pid> <server ms>" (written with its "start", both or
#: neither) and, for an attempt that fails on purpose, "fail <task id> <attempt> <pid>
#: <wall ms>" as it ends. A rate limit counts claims, by the ``now`` each claim script was
#: given (the claiming worker's estimate of the server's clock), not handler starts,
#: which trail their claims by a varying delay: at a saturated rate two starts may be
#: closer than their claims were.
FLOW_LEDGER = "test:flow_ledger"
_claimed_ms: contextvars.ContextVar[float] = contextvars.ContextVar("claimed_ms")


class ClaimTimes(duetime.Hooks):
    """Hands the handler the server time its attempt was claimed at. Hooks see no claim,
    so this reads the worker's attempt, which holds the monotonic time its claim was sent
    (``started``) until just after ``before_attempt``, when it becomes the handler's start;
    ``started_at`` is the worker's server-clock estimate at that handler start."""

    def before_attempt(self, attempt: duetime.AttemptInfo) -> None:
        since_claim = time.monotonic() - current_attempt.get().started
        _claimed_ms.set((attempt.started_at - since_claim) * 1000)


flow_app = duetime.App(hooks=[ClaimTimes()])


@flow_app.task
def flow_ledger(data: dict[str, object]) -> None:
    """Records its start and claim, works for ``data["work"]`` seconds, fails its first
    attempt when ``data["fail_first"]``, and records its end."""
    context = duetime.current_task()
    head = f"{context.id} {context.attempt} {os.getpid()}"
    with _record.pipeline(transaction=True) as both:
        both.rpush(LEDGER, _ledger_entry("start"))
        both.rpush(FLOW_LEDGER, f"claim {head} {_claimed_ms.get():.3f}")
        both.execute()
    work = data.get("work")
    if isinstance(work, float | int) and work > 0:
        time.sleep(float(work))
    if data.get("fail_first") and context.attempt == 1:
        _record.rpush(FLOW_LEDGER, f"fail {head} {time.time() * 1000:.3f}")
        raise RuntimeError("the first attempt fails on purpose")
    _ledger("done")
