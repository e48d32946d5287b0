"""``duetime dead``: list, show, requeue or purge dead tasks, chosen by id or by filters;
the destructive actions ask first, show their progress, and can be dry runs."""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click
from rich.table import Column

from duetime import validation
from duetime.cli.exits import EXIT_NOTHING_DONE, confirm_or_decline
from duetime.cli.options import open_queue, queue_command
from duetime.cli.output import (
    DEFAULT_HANDLER_SHOWN,
    Table,
    print_status,
    progress_bar,
    say,
    shown_time,
    stdout_console,
)
from duetime.cli.values import MOMENT
from duetime.client import BulkOutcome, DeadTask, Queue, selection
from duetime.errors import TaskNotFoundError
from duetime.states import TaskState


@click.group()
def dead() -> None:
    """List, show, requeue or purge dead tasks, chosen by id or by filters.

    \b
    Examples:
      duetime dead list -q emails --error timeout --since 2h
      duetime dead requeue -q emails --task send_email --since 2026-12-01T09:00Z --dry-run
      duetime dead purge -q emails --until 2d --yes
    """


def dead_filter_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """--task, --error, --since and --until, shared by every dead command that chooses."""
    options = (
        click.option(
            "--task",
            "task_filter",
            metavar="NAME",
            help=f"Only tasks of this handler ('{DEFAULT_HANDLER_SHOWN}' for the default one).",
        ),
        click.option(
            "--error",
            "error_filter",
            metavar="TEXT",
            help="Only tasks whose last error contains TEXT (in any case).",
        ),
        click.option(
            "--since",
            type=MOMENT,
            metavar="TIME",
            help="Only tasks that died at or after TIME: ISO 8601 with a zone, or a time "
            "ago (30m, 2h, 1d).",
        ),
        click.option(
            "--until",
            type=MOMENT,
            metavar="TIME",
            help="Only tasks that died at or before TIME (the same forms).",
        ),
    )
    for option in reversed(options):
        function = option(function)
    return function


def _dead_filter(
    task: str | None, error: str | None, since: float | None, until: float | None
) -> selection.DeadFilter:
    if task == DEFAULT_HANDLER_SHOWN:
        task = ""
    return selection.DeadFilter(task=task, error=error, since=since, until=until)


def _dead_table(entries: Sequence[DeadTask]) -> Table:
    table = Table(
        "id",
        Column("died", no_wrap=True),
        "task",
        Column("attempts", justify="right"),
        "error",
        one_line=("id", "task", "error"),
        fold=("error", "task"),
    )
    for entry in entries:
        error = entry.error.splitlines()[0] if entry.error else ""
        table.add_row(
            entry.id,
            shown_time(entry.died_at),
            entry.task or DEFAULT_HANDLER_SHOWN,
            str(entry.attempts),
            error,
        )
    return table


@queue_command("list", group=dead)
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Show at most this many, the most recent first.",
)
@dead_filter_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON (times in epoch seconds).")
def dead_list(
    queue: str,
    limit: int,
    task_filter: str | None,
    error_filter: str | None,
    since: float | None,
    until: float | None,
    as_json: bool,
    redis_url: str | None,
) -> None:
    """The most recent dead tasks, those that match the filters given."""
    chosen = _dead_filter(task_filter, error_filter, since, until)
    # Unfiltered, one call reads exactly what is shown.
    page_size = limit if chosen.selects_everything else max(limit, selection.PAGE_SIZE)
    with open_queue(queue, redis_url) as client:
        found = selection.dead_matching(client, chosen, page_size=page_size)
        entries = list(itertools.islice(found, limit))
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(e) for e in entries], default=str, indent=2))
        return
    stdout_console().print(_dead_table(entries))


@queue_command("show", group=dead)
@click.argument("task_id")
def dead_show(queue: str, task_id: str, redis_url: str | None) -> None:
    """A dead task's data, error and traceback."""
    with open_queue(queue, redis_url) as client:
        found = client.status(task_id)
    if found is None or found.state != TaskState.DEAD:
        raise TaskNotFoundError(f"no dead task {task_id!r} in queue {queue!r}")
    print_status(found)


def _dead_action(verb: str, summary: str) -> click.Command:
    """``duetime dead requeue`` or ``purge`` (one body, two verbs)."""

    @queue_command(verb, group=dead, help_text=summary)
    @click.argument("task_ids", nargs=-1)
    @click.option(
        "--all", "everything", is_flag=True, help="Every dead task (the filters narrow it)."
    )
    @dead_filter_options
    @click.option(
        "--dry-run", is_flag=True, help="Say how many and which it would take; change nothing."
    )
    @click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
    @click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
    @click.option(
        "--batch-size",
        default=selection.BATCH_SIZE,
        show_default=True,
        type=click.IntRange(1, 10_000),
        help="Dead tasks read, and ids acted on, per call to the server.",
    )
    def command(
        queue: str,
        task_ids: tuple[str, ...],
        everything: bool,
        task_filter: str | None,
        error_filter: str | None,
        since: float | None,
        until: float | None,
        dry_run: bool,
        yes: bool,
        as_json: bool,
        batch_size: int,
        redis_url: str | None,
    ) -> None:
        chosen = _dead_filter(task_filter, error_filter, since, until)
        ids = validation.task_ids(list(task_ids))
        if ids and everything:
            raise click.UsageError("give task ids or --all, not both")
        if not ids and not everything and chosen.selects_everything:
            raise click.UsageError(
                "name task ids, pass --all, or choose with --task, --error, --since or --until"
            )
        _act_on_dead(
            _DeadRequest(verb, queue, ids, chosen, dry_run, yes, as_json, batch_size),
            redis_url,
        )

    return command


@dataclasses.dataclass(frozen=True, slots=True)
class _DeadRequest:
    verb: str  # requeue | purge
    queue: str
    ids: list[str]  # the ids named, if any
    chosen: selection.DeadFilter  # without the ids
    dry_run: bool
    yes: bool
    as_json: bool
    batch_size: int

    @property
    def past(self) -> str:
        return f"{self.verb}d"

    @property
    def destructive(self) -> bool:
        """Asks for confirmation: a purge always, a requeue of every dead task."""
        return self.verb == "purge" or (not self.ids and self.chosen.selects_everything)


def _act_on_dead(request: _DeadRequest, redis_url: str | None) -> None:
    """Choose the dead tasks (every matching id first, since acting while paging would
    shift the pages), confirm, then act on them in batches."""
    with open_queue(request.queue, redis_url) as client:
        if request.ids and request.chosen.selects_everything and not request.dry_run:
            # Named ids need no scan: each step says which of them were not dead.
            if request.destructive and not request.yes:
                _confirm(request, selection.DeadSelection(request.ids, []))
            _act_on_named_dead(client, request)
            return
        chosen = request.chosen
        if request.ids:
            chosen = dataclasses.replace(chosen, ids=frozenset(request.ids))
        with progress_bar() as progress:
            reading = progress.add_task("reading dead tasks", total=None)
            picked = selection.select_dead(
                client,
                chosen,
                page_size=request.batch_size,
                on_page=lambda count: progress.advance(reading, count),
            )
        if picked.unnameable:
            say(
                f"duetime: {picked.unnameable:,} matching dead task(s) have ids duetime does "
                "not accept (written by hand?) and are left alone"
            )
        if request.dry_run:
            _report_dead(request, picked, None)
            return
        if picked.ids and request.destructive and not request.yes:
            _confirm(request, picked)
        action = client.purge_dead if request.verb == "purge" else client.requeue_dead
        with progress_bar() as progress:
            acting = progress.add_task(f"{request.verb[:-1]}ing", total=len(picked.ids))
            done = selection.in_batches(
                picked.ids,
                action,
                batch_size=request.batch_size,
                on_batch=lambda count: progress.advance(acting, count),
            )
    _report_dead(request, picked, done)


def _act_on_named_dead(client: Queue, request: _DeadRequest) -> None:
    """Requeue or purge the ids named, batch by batch, and name those that were not dead
    (exit 8 when none was)."""
    action = client.purge_many if request.verb == "purge" else client.requeue_many
    done: list[str] = []
    skipped: dict[str, str] = {}
    with progress_bar() as progress:
        acting = progress.add_task(f"{request.verb[:-1]}ing", total=len(request.ids))
        for start in range(0, len(request.ids), request.batch_size):
            outcome = action(request.ids[start : start + request.batch_size])
            done += outcome.done
            skipped |= outcome.skipped
            progress.advance(acting, len(outcome.done) + len(outcome.skipped))
    outcome = BulkOutcome(request.verb, done, skipped)
    if request.as_json:
        report: dict[str, Any] = {"queue": request.queue, "action": request.verb}
        report |= {"dry_run": False, "selected": len(request.ids), request.past: len(done)}
        report |= {"skipped": 0, "not_dead": list(skipped), "ids": done}
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(outcome.summary)
        for task_id in list(skipped)[:_DRY_RUN_SHOWN]:
            say(f"skipped {task_id}: no dead task has this id")
    if not done:
        sys.exit(EXIT_NOTHING_DONE)


def _confirm(request: _DeadRequest, picked: selection.DeadSelection) -> None:
    count = len(picked.ids)
    how_many = f"{'up to ' if not picked.sample and request.ids else ''}{count:,}"
    question = (
        f"{request.verb.capitalize()} {how_many} dead task{'' if count == 1 else 's'} "
        f"in queue {request.queue}{' for good' if request.verb == 'purge' else ''}?"
    )
    confirm_or_decline(question, f"nothing {request.past}")


#: Dead tasks a dry run shows in its table (--json lists every id).
_DRY_RUN_SHOWN = 20


def _report_dead(request: _DeadRequest, picked: selection.DeadSelection, done: int | None) -> None:
    """The outcome: ``done`` tasks acted on, or None for a dry run."""
    if request.as_json:
        report: dict[str, Any] = {"queue": request.queue, "action": request.verb}
        report |= {"dry_run": done is None, "selected": len(picked.ids)}
        if done is not None:
            report[request.past] = done
        report |= {"skipped": picked.unnameable, "ids": picked.ids}
        click.echo(json.dumps(report, indent=2))
    elif done is not None:
        click.echo(f"{request.past} {done}")
    else:
        count = len(picked.ids)
        plural = "" if count == 1 else "s"
        click.echo(f"would {request.verb} {count:,} dead task{plural} in queue {request.queue}")
        if picked.sample:
            stdout_console().print(_dead_table(picked.sample[:_DRY_RUN_SHOWN]))
        if count > _DRY_RUN_SHOWN:
            click.echo(f"... and {count - _DRY_RUN_SHOWN:,} more (--json lists every id)")


dead_requeue = _dead_action(
    "requeue",
    """Give dead tasks a fresh set of attempts, due now: the TASK_IDS named, or those
    the filters choose, or --all (which asks first; --yes does not).

    \b
    Examples:
      duetime dead requeue -q emails --error timeout --since 2h --dry-run
      duetime dead requeue -q emails --task send_email --since 2026-12-01T09:00+01:00
      duetime dead requeue -q emails --all --yes
    """,
)
dead_purge = _dead_action(
    "purge",
    """Delete dead tasks for good: the TASK_IDS named, or those the filters choose, or
    --all. Asks first; --yes does not.

    \b
    Examples:
      duetime dead purge -q emails --until 2d --dry-run
      duetime dead purge -q emails --task old_handler --yes --json
    """,
)

COMMANDS = (dead,)
