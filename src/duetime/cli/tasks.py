"""The commands on tasks: ``duetime schedule``, ``status``, ``cancel``, ``tasks`` (those in
one state, or finished: the history), ``task show`` and ``run-now``."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click
from rich.table import Column

from duetime.cli.keyed import keyed_mode, keyed_options, schedule_keyed_call
from duetime.cli.options import open_queue, queue_command
from duetime.cli.output import (
    DEFAULT_HANDLER_SHOWN,
    Table,
    print_task,
    shown_time,
    stdout_console,
)
from duetime.cli.values import DURATION, TIME, json_argument
from duetime.client import FinishedAttempt, TaskSummary
from duetime.errors import TaskNotFoundError
from duetime.states import HistoryOutcome, TaskState
from duetime.times import TIME_WIDTH, format_duration

#: ``duetime tasks --task``: tasks read per page, and how far a filtered listing reads.
TASK_PAGE = 500
MOST_TASKS_SCANNED = 100_000


# Long: a command's options are its decorators (the keyed ones in cli/keyed.py); the
# body itself is short.
@queue_command(creates=True)
@click.option(
    "--at",
    "at",
    type=TIME,
    metavar="TIME",
    help="Run at this time: ISO 8601 with a zone (2026-12-01T09:00+01:00, ...Z) or epoch seconds.",
)
@click.option(
    "--in",
    "delay",
    type=DURATION,
    metavar="DURATION",
    help="Run this long from now: 90s, 5m, 1h30m, 1.5h, 2d, or seconds.",
)
@click.option("--id", "id", help="Task id (idempotent: the same id twice is one task).")
@click.option("--task", "task", help="Registered handler name (default: the default handler).")
@click.option("--max-attempts", type=int)
@click.option(
    "--timeout", type=DURATION, metavar="DURATION", help="How long one attempt may run (30s, 5m)."
)
@click.option("--result-ttl", type=DURATION, metavar="DURATION", help="Keep the result this long.")
@click.option(
    "--expires",
    type=DURATION,
    metavar="DURATION",
    help="Drop the task, unrun, if it has not started this long after its run-at.",
)
@click.option(
    "--priority",
    type=int,
    default=0,
    help="Among due tasks, rank as if due this many seconds earlier (-1000 to 1000).",
)
@click.option(
    "--limit-key", metavar="KEY", help="Share this key's limits and take turns with other keys."
)
@click.option("--cost", type=int, default=1, help="What one start spends of rate limits.")
@keyed_options
@click.argument("data")
def schedule(
    queue: str,
    at: float | None,
    delay: float | None,
    data: str,
    redis_url: str | None,
    **options: Any,
) -> None:
    """Schedule a task whose data is the JSON document DATA; prints its id. With
    --debounce, --throttle or --unique (at most one), the id of the task that carries the
    call, and on stderr what the call did; --at and --in may then be left out (now).

    \b
    Examples:
      duetime schedule --queue emails --in 1h30m '{"to": "a@example.com"}'
      duetime schedule --queue emails --at 2026-12-01T09:00+01:00 --id welcome-42 \
          --task send '{}'
      duetime schedule --queue api --in 0 --limit-key customer-42 --priority 5 '{}'
      duetime schedule -q sync --debounce user-42 --window 30s --max-wait 5m '{"user": 42}'
      duetime schedule -q api --throttle customer-42 --window 1m --trailing '{}'
      duetime schedule -q reports --unique nightly --until finished '{}'
    """
    mode = keyed_mode(options)
    if mode is not None and at is None and delay is None:
        delay = 0.0
    if (at is None) == (delay is None):
        raise click.UsageError("give exactly one of --at or --in")
    payload = json_argument(data)
    with open_queue(queue, redis_url) as client:
        if mode is not None:
            schedule_keyed_call(client, mode, at, delay, payload, options)
        elif at is not None:
            click.echo(client.schedule_task(at, payload, **options))
        else:
            assert delay is not None
            click.echo(client.schedule_in(delay, payload, **options))


@queue_command()
@click.argument("task_id")
def status(queue: str, task_id: str, redis_url: str | None) -> None:
    """Show where a task is, its last error and its finished attempts (the history), as
    JSON (times in ISO 8601, local zone or UTC with --utc)."""
    _show_status(queue, task_id, redis_url)


def _show_status(queue: str, task_id: str, redis_url: str | None) -> None:
    with open_queue(queue, redis_url) as client:
        found = client.status(task_id)
        history = client.history(TASK_PAGE, task_id=task_id)
        if found is None and not history:
            raise client.core.inspection.not_found(task_id)
    print_task(task_id, found, history)


@queue_command()
@click.argument("task_id")
def cancel(queue: str, task_id: str, redis_url: str | None) -> None:
    """Cancel a task: one waiting (or dead) is removed; a running one's worker is asked
    to stop it, and it ends as cancelled (never completed, never retried)."""
    with open_queue(queue, redis_url) as client:
        if not client.cancel(task_id):
            raise TaskNotFoundError(f"no live task {task_id!r} in queue {queue!r}")
        after = client.status(task_id)
    if after is not None and after.cancel_asked_at is not None:
        click.echo(f"cancelling {task_id}: it is running; its worker is stopping it")
    else:
        click.echo(f"cancelled {task_id}")


@queue_command()
@click.option(
    "--state",
    type=click.Choice(["scheduled", "ready", "running", "dead", "finished"]),
    default="scheduled",
    show_default=True,
)
@click.option("--task", "task_filter", metavar="NAME", help="Only tasks of this handler.")
@click.option(
    "--outcome",
    type=click.Choice([str(outcome) for outcome in HistoryOutcome]),
    help="With --state finished: only attempts that ended so.",
)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON (times in epoch seconds).")
def tasks(
    queue: str,
    state: str,
    task_filter: str | None,
    outcome: str | None,
    limit: int,
    as_json: bool,
    redis_url: str | None,
) -> None:
    """Tasks in one state: scheduled and ready in the order they will be served, running
    by lease deadline, dead latest first; finished: the attempts the queue's history
    keeps, latest first.

    \b
    Examples:
      duetime tasks -q emails --state running
      duetime tasks -q emails --state finished --task send --outcome dead
    """
    wanted = None if task_filter is None else _handler_name(task_filter)
    if outcome is not None and state != "finished":
        raise click.UsageError("--outcome goes with --state finished")
    if state == "finished":
        _finished(queue, wanted, outcome, limit, as_json, redis_url)
        return
    with open_queue(queue, redis_url) as client:
        found: list[TaskSummary] = []
        offset = 0
        while len(found) < limit:  # a --task filter pages on until enough are found
            page = client.tasks(state, limit=TASK_PAGE, offset=offset)
            found += [t for t in page if wanted is None or t.task == wanted]
            if len(page) < TASK_PAGE or offset >= MOST_TASKS_SCANNED:
                break
            offset += TASK_PAGE
    found = found[:limit]
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(t) for t in found], default=str, indent=2))
        return
    stdout_console().print(_tasks_table(state, found))


def _tasks_table(state: str, found: list[TaskSummary]) -> Table:
    """The tasks of one state: each with the moment that matters in that state, and the
    worker running it or its last error."""
    when = {"scheduled": "run at", "ready": "due since", "running": "lease until", "dead": "died"}
    table = Table(
        "id",
        Column(when[state], no_wrap=True),
        "task",
        Column("att.", justify="right"),
        "worker" if state == "running" else "error",
        one_line=("id", "task", "error", "worker"),
        fold=("worker" if state == "running" else "error", "task"),
    )
    for task in found:
        moment = {"running": task.lease_deadline, "dead": task.died_at}.get(state, task.run_at)
        last = task.worker if state == "running" else (task.error or task.problem or "")
        table.add_row(
            task.id,
            shown_time(moment),
            task.task or DEFAULT_HANDLER_SHOWN,
            str(task.attempts),
            (last or "").splitlines()[0] if last else "",
        )
    return table


def _finished(
    queue: str,
    task: str | None,
    outcome: str | None,
    limit: int,
    as_json: bool,
    redis_url: str | None,
) -> None:
    """``duetime tasks --state finished``: the history, latest first."""
    with open_queue(queue, redis_url) as client:
        found = client.history(limit, task=task, outcome=outcome)
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(a) for a in found], default=str, indent=2))
        return
    stdout_console().print(_finished_table(found))


def _finished_table(found: list[FinishedAttempt]) -> Table:
    """Finished attempts: when, how, how long the handler ran, and the error if any."""
    table = Table(
        "id",
        Column("finished", no_wrap=True, min_width=TIME_WIDTH),
        "task",
        Column("att.", justify="right"),
        "outcome",
        Column("took", justify="right", no_wrap=True),
        "error",
        one_line=("id", "task", "error"),
        fold=("error", "task", "took", "att."),
    )
    for attempt in found:
        table.add_row(
            attempt.task_id,
            shown_time(attempt.finished_at),
            "?" if attempt.task is None else (attempt.task or DEFAULT_HANDLER_SHOWN),
            str(attempt.attempt),
            shown_outcome(attempt),
            "-" if attempt.duration is None else format_duration(attempt.duration),
            attempt.error or "",
        )
    return table


def shown_outcome(attempt: FinishedAttempt) -> str:
    """The outcome, with how many endings a coalesced entry stands for: "snoozed \u00d712"."""
    return attempt.outcome if attempt.count == 1 else f"{attempt.outcome} \u00d7{attempt.count}"


def _handler_name(shown: str) -> str:
    return "" if shown == DEFAULT_HANDLER_SHOWN else shown


@click.group()
def task() -> None:
    """One task: show it, or run it now."""


@queue_command("show", group=task)
@click.argument("task_id")
def task_show(queue: str, task_id: str, redis_url: str | None) -> None:
    """Everything known of a task, its finished attempts included, as JSON (the same as
    `duetime status`)."""
    _show_status(queue, task_id, redis_url)


def _run_now_command(group: click.Group | None) -> click.Command:
    """``duetime run-now``, and the same as ``duetime task run-now``."""

    @queue_command("run-now", group=group)
    @click.argument("task_id")
    def command(queue: str, task_id: str, redis_url: str | None) -> None:
        """Make a scheduled task (delayed, or waiting to retry) due now."""
        with open_queue(queue, redis_url) as client:
            client.run_now(task_id)
        click.echo(f"{task_id} is due now")

    return command


run_now = _run_now_command(None)
task_run_now = _run_now_command(task)


@queue_command()
@click.argument("task_id")
@click.option("--at", "at", type=TIME, metavar="TIME", help="The new run-at (as for schedule).")
@click.option("--in", "delay", type=DURATION, metavar="DURATION", help="The new delay from now.")
def reschedule(
    queue: str, task_id: str, at: float | None, delay: float | None, redis_url: str | None
) -> None:
    """Move a waiting task (scheduled or ready) to a new run-at; a time in the past makes
    it due now."""
    if (at is None) == (delay is None):
        raise click.UsageError("give exactly one of --at or --in")
    with open_queue(queue, redis_url) as client:
        if at is not None:
            client.reschedule(task_id, at)
        else:
            assert delay is not None
            client.reschedule_in(task_id, delay)
        moved = client.status(task_id)  # says to when (None: due now, or started since)
    when = moved.run_at if moved is not None and moved.state == TaskState.SCHEDULED else None
    click.echo(f"{task_id} rescheduled " + (f"to {shown_time(when)}" if when else "(due now)"))


COMMANDS = (schedule, status, cancel, tasks, task, run_now, reschedule)
