"""``duetime search``: tasks by id prefix, handler, error text, limit key or a field of
their data, in a bounded walk a cursor continues; its options and its table are shared
with ``duetime bulk`` (``cli.bulk``)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import click
from rich.table import Column

from duetime.cli.options import open_queue, queue_command
from duetime.cli.output import (
    DEFAULT_HANDLER_SHOWN,
    Table,
    progress_bar,
    say,
    shown_time,
)
from duetime.cli.output import stdout_console as console
from duetime.client import SearchPage, TaskSearch, TaskStatus
from duetime.client.searching import DEFAULT_BUDGET, MOST_BUDGET, SEARCH_STATES, by_run_at
from duetime.states import TaskState

#: Matches a dry run shows in its table (--json lists every id).
DRY_RUN_SHOWN = 20
#: Ids per bulk call: the progress bar moves after each.
BULK_BATCH = 500


def search_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """--id, --task, --error, --limit-key and --data, shared by ``search`` and the bulk
    actions."""
    options = (
        click.option("--id", "id_prefix", metavar="PREFIX", help="Ids that start with PREFIX."),
        click.option(
            "--task",
            "task_name",
            metavar="NAME",
            help=f"Tasks of this handler ('{DEFAULT_HANDLER_SHOWN}' for the default one).",
        ),
        click.option(
            "--error", metavar="TEXT", help="Tasks whose last error contains TEXT (any case)."
        ),
        click.option(
            "--limit-key", metavar="KEY", help="Tasks of this flow control limit key (exact)."
        ),
        click.option(
            "--data",
            "data",
            metavar="PATH[=VALUE]",
            help="Tasks whose data has the field PATH (keys joined by dots: customer.id), "
            "equal to VALUE when given (text; numbers, true, false, null as JSON).",
        ),
    )
    for option in reversed(options):
        function = option(function)
    return function


def criteria_of(
    id_prefix: str | None,
    task_name: str | None,
    error: str | None,
    data: str | None,
    state: str | None = None,
    limit_key: str | None = None,
) -> TaskSearch | None:
    """The search the options ask for; None when none was given."""
    if not (id_prefix or task_name is not None or error or data or limit_key is not None):
        return None
    field, value = None, None
    if data is not None:
        field, equals, given = data.partition("=")
        value = given if equals else None
    task = "" if task_name == DEFAULT_HANDLER_SHOWN else task_name
    return TaskSearch(id_prefix or None, task, error or None, field, value, state, limit_key)


def status_table(found: Sequence[TaskStatus]) -> Table:
    table = Table(
        "id",
        "state",
        Column("run at / died", no_wrap=True),
        "task",
        Column("att.", justify="right"),
        "error",
        one_line=("task", "error"),
        fold=("error", "task"),
    )
    for status in found:
        moment = status.died_at if status.state == TaskState.DEAD else status.run_at
        table.add_row(
            status.id,
            str(status.state),
            shown_time(moment) if moment is not None else "",
            status.task or DEFAULT_HANDLER_SHOWN,
            str(status.attempts),
            (status.last_error or status.problem or "").partition("\n")[0],
        )
    return table


def _read(page: SearchPage) -> str:
    what = {"errors": "last errors", "keys": "tasks with a limit key"}.get(page.walked, "tasks")
    return f"read {page.scanned:,} of {page.total:,} {what}"


# Long: its options and their help are most of it; the body is short.
@queue_command()
@search_options
@click.option(
    "--state",
    type=click.Choice([str(state) for state in SEARCH_STATES]),
    help="Only tasks in this state (waiting: the ready tasks that wait under flow control "
    "for their turn or a limit).",
)
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Stop once this many matched (--cursor goes on after the last one).",
)
@click.option(
    "--budget",
    default=DEFAULT_BUDGET,
    show_default=True,
    type=click.IntRange(1, MOST_BUDGET),
    help="Entries the server looks at, at most, in this call.",
)
@click.option("--cursor", metavar="CURSOR", help="Go on from where a search stopped.")
@click.option("--all", "to_the_end", is_flag=True, help="Walk to the end: every match.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (times in epoch seconds).")
def search(
    queue: str,
    id_prefix: str | None,
    task_name: str | None,
    error: str | None,
    data: str | None,
    limit_key: str | None,
    state: str | None,
    limit: int,
    budget: int,
    cursor: str | None,
    to_the_end: bool,
    as_json: bool,
    redis_url: str | None,
) -> None:
    """Tasks in any state by id prefix, handler, last error, limit key or a field of
    their data.

    A search reads the queue's tasks --budget at a time and prints the cursor to go on
    with; --all walks to the end.

    \b
    Examples:
      duetime search -q emails --data customer.id=42
      duetime search -q emails --error timeout --state scheduled
      duetime search -q emails --id cron:digest: --all --json
    """
    criteria = criteria_of(id_prefix, task_name, error, data, state, limit_key)
    if criteria is None:
        raise click.UsageError("search by --id, --task, --error, --limit-key or --data")
    started = time.monotonic()
    found: list[TaskStatus] = []
    scanned = 0
    with open_queue(queue, redis_url) as client, progress_bar() as progress:
        reading = progress.add_task("searching", total=None)
        while True:
            page = client.search(criteria, cursor=cursor, budget=budget, limit=limit)
            found += page.tasks
            scanned += page.scanned
            progress.update(reading, completed=scanned, total=page.total)
            cursor = page.cursor
            if cursor is None or not to_the_end:
                break
    seconds = time.monotonic() - started
    found = by_run_at(found)  # each page is in order; --all joins them
    page = dataclasses.replace(page, tasks=found, scanned=scanned)
    if as_json:
        report: dict[str, Any] = {"queue": queue}
        report["tasks"] = [dataclasses.asdict(status) for status in found]
        report |= {"cursor": cursor, "scanned": scanned, "total": page.total}
        report |= {"walked": page.walked, "seconds": round(seconds, 3)}
        click.echo(json.dumps(report, default=str, indent=2))
        return
    if found:
        console().print(status_table(found))
    matched = f"{len(found):,} match{'' if len(found) == 1 else 'es'}"
    more = "" if cursor is None else f"; go on with --cursor {cursor}"
    say(f"{matched}; {_read(page)} in {seconds:.2f} s{more}")


COMMANDS = (search,)
