"""Handlers for tests that run workers as separate processes. They record each run
in the server named by $DUETIME_TEST_RECORD_URL, so the test can watch them."""

from __future__ import annotations

import os
import time

import redis

import duetime

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
    context = duetime.current_task()
    _record.rpush(
        LEDGER,
        f"{kind} {context.id} {context.attempt} {os.getpid()} {time.time() * 1000:.3f} "
        f"{context.run_at * 1000:.3f}",  # run-at keeps microseconds
    )


@app.task
def ledger(data: dict[str, float]) -> None:
    """Records start and end; works for ``data["work"]`` seconds in between."""
    _ledger("start")
    if data.get("work"):
        time.sleep(float(data["work"]))
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
