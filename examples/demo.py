"""The duetime demo (`make demo`): on the embedded Valkey server, delayed tasks fire on
time (with their measured lateness), a flaky task is retried, a broken one is
dead-lettered, and the invariant check passes. The commands it suggests are written so
that they run as printed, from where the demo ran: `make demo` does not activate the
virtualenv, so they name `.venv/bin/duetime` unless `duetime` on PATH is this one."""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import duetime
from duetime.embedded import ensure_server

console = Console()
QUEUE = "demo"
SETTINGS = duetime.Settings(retry_base=0.3, retry_max=1.0)

app = duetime.App()
starts: dict[str, float] = {}
flaky_attempts: list[int] = []


@app.task
def send_reminder(data: dict[str, Any]) -> None:
    starts[duetime.current_task().id] = time.time()


@app.task
def flaky_sync(data: dict[str, Any]) -> str:
    attempt = duetime.current_task().attempt
    flaky_attempts.append(attempt)
    if attempt == 1:
        raise ConnectionError("upstream hiccup (first attempt fails on purpose)")
    return f"synced on attempt {attempt}"


@app.task
async def broken_report(data: dict[str, Any]) -> None:
    raise ValueError("report template missing (fails on every attempt)")


def duetime_command() -> str:
    """How to run this install's `duetime` from the current directory: `duetime` when the
    one on PATH is it, else its path (relative when under this directory)."""
    script = Path(sys.executable).parent / "duetime"  # not resolved: a venv's python links out
    on_path = shutil.which("duetime")
    if on_path is not None and Path(on_path).resolve() == script.resolve():
        return "duetime"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


async def run_until_done(url: str, reminder_ids: list[str]) -> None:
    dispatcher = duetime.Dispatcher([QUEUE], url, settings=SETTINGS)
    worker = duetime.Worker(app, QUEUE, url, concurrency=10, settings=SETTINGS)
    daemons = [asyncio.create_task(dispatcher.run()), asyncio.create_task(worker.run())]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        # In-process state only: a blocking Redis call here would stall the event loop.
        if (
            all(i in starts for i in reminder_ids)
            and len(flaky_attempts) >= 2
            and worker.counters.dead
        ):
            break
        await asyncio.sleep(0.05)
    worker.stop()
    dispatcher.stop()
    await asyncio.gather(*daemons)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="  worker log: %(message)s")
    duetime_cli = duetime_command()
    server = ensure_server()
    console.print(server.describe(), highlight=False, soft_wrap=True)
    console.print(
        "  it is yours, not this project's: every project of yours that gives no Redis URL "
        "shares it (set DUETIME_HOME for one of a project's own)",
        highlight=False,
        soft_wrap=True,
    )
    with duetime.Queue(QUEUE, server.url, settings=SETTINGS) as queue:
        queue.purge_dead()  # earlier demo runs left their dead-letter example
        now = time.time()
        run_ats = {}
        reminder_ids = []
        for n in range(8):
            run_at = now + 0.5 + n * 0.25
            task_id = queue.schedule_task(run_at, {"user": n}, task=send_reminder)
            run_ats[task_id] = run_at
            reminder_ids.append(task_id)
        flaky_id = queue.schedule_in(0.2, {"account": 7}, task=flaky_sync, result_ttl=60)
        dead_id = queue.schedule_in(0.2, {"day": "today"}, task=broken_report, max_attempts=2)
        console.print(
            f"scheduled 8 reminders over 2 s, a flaky task and a broken one on queue {QUEUE!r}"
        )

        asyncio.run(run_until_done(server.url, reminder_ids))

        table = Table("task", "run at", "lateness (ms)", title="delayed tasks")
        for task_id in reminder_ids:
            started = starts.get(task_id)
            lateness = (
                "did not run" if started is None else f"{(started - run_ats[task_id]) * 1000:.1f}"
            )
            table.add_row(task_id, time.strftime("%H:%M:%S", time.localtime(run_ats[task_id]))
                          + f".{int(run_ats[task_id] % 1 * 1000):03d}", lateness)  # fmt: skip
        console.print(table)
        result = queue.result(flaky_id, 5)
        console.print(f"retry: flaky_sync ran attempts {flaky_attempts}; result: {result!r}")
        [dead] = [d for d in queue.dead_tasks() if d.id == dead_id]
        console.print(f"dead letter: {dead.task} after {dead.attempts} attempts: {dead.error}")
        console.print(
            f"  inspect it: {duetime_cli} dead show --queue {QUEUE} {dead_id}",
            highlight=False,
            soft_wrap=True,
        )
        violations = queue.check()
        console.print(
            "invariant check: " + ("[green]all hold[/green]" if not violations else str(violations))
        )
        if violations or len(starts) != len(reminder_ids):
            raise SystemExit(1)
    console.print(
        f"the embedded server keeps running for other duetime commands: try `{duetime_cli} "
        f"queues`; stop it with `{duetime_cli} server stop`",
        highlight=False,
        soft_wrap=True,
    )
    if duetime_cli != "duetime":
        console.print(
            f"(to type plain `duetime`, activate the virtualenv: . {Path(duetime_cli).parent}"
            "/activate)",
            highlight=False,
            soft_wrap=True,
        )


if __name__ == "__main__":
    main()
