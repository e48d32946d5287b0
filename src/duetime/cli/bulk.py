"""``duetime bulk``: cancel, reschedule or run now many tasks that have not started,
named or chosen by a search (``client.matching``), each task its own atomic step; the
outcome accounts for every task named or matched, and the command exits with 8 when it
did nothing."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from duetime import validation
from duetime.cli.exits import EXIT_NOTHING_DONE, confirm_or_decline
from duetime.cli.options import open_queue, queue_command
from duetime.cli.output import display_zone, progress_bar, say
from duetime.cli.output import stdout_console as console
from duetime.cli.search import DRY_RUN_SHOWN, criteria_of, search_options, status_table
from duetime.cli.values import DURATION, TIME
from duetime.client import BulkOutcome, Queue, TaskSearch
from duetime.client.matching import MatchSelection, counted, select_matching, states_for
from duetime.states import TaskState

#: Ids per bulk call: the progress bar moves after each.
BULK_BATCH = 500


@click.group()
def bulk() -> None:
    """Cancel, reschedule or run now many tasks that have not started: the ids named,
    or every task a search matches that has not started (scheduled, ready, or due and
    waiting under flow control for its turn or a limit; --state narrows it, and cancel
    --state running takes running ones, whose workers are asked to stop them). Each task
    is its own atomic step; the outcome counts every match: those acted on, those that
    changed meanwhile (skipped) and those in other states (not touched). Exits with 8
    when nothing was done.

    \b
    Examples:
      duetime bulk cancel -q api --limit-key big-customer --dry-run
      duetime bulk run-now -q emails --data customer.id=42 --dry-run
      duetime bulk reschedule -q emails --in 1h --task send_digest --yes
      duetime bulk cancel -q emails ID1 ID2 ID3
      duetime bulk cancel -q api --state running --limit-key customer-42 --yes
    """


@dataclasses.dataclass(frozen=True, slots=True)
class BulkRequest:
    action: str  # cancel | reschedule | run_now
    queue: str
    ids: list[str]  # named, or chosen by ``criteria``
    criteria: TaskSearch | None  # without a state: ``states`` says which it takes
    states: tuple[str, ...]
    dry_run: bool
    yes: bool
    as_json: bool
    moment: tuple[float | None, float | None] = (None, None)  # reschedule: --at, --in

    @property
    def stops_running(self) -> bool:
        """Whether a running task's cancel is asked: named ids, or --state running; a
        task chosen as not started that started meanwhile is skipped (it runs)."""
        return self.criteria is None or TaskState.RUNNING in self.states


def bulk_action(action: str, summary: str) -> click.Command:
    """``duetime bulk cancel``, ``run-now`` or ``reschedule`` (one body, three verbs)."""
    name = action.replace("_", "-")

    def command(
        queue: str,
        task_ids: tuple[str, ...],
        id_prefix: str | None,
        task_name: str | None,
        error: str | None,
        data: str | None,
        limit_key: str | None,
        state: str | None,
        dry_run: bool,
        yes: bool,
        as_json: bool,
        redis_url: str | None,
        at: float | None = None,
        delay: float | None = None,
    ) -> None:
        criteria = criteria_of(id_prefix, task_name, error, data, None, limit_key)
        ids = validation.task_ids(list(task_ids))
        if bool(ids) == (criteria is not None):
            raise click.UsageError(
                "name task ids, or choose with --id, --task, --error, --limit-key or --data"
            )
        if ids and state is not None:
            raise click.UsageError("--state chooses among a search's matches: not with ids")
        if action == "reschedule" and (at is None) == (delay is None):
            raise click.UsageError("give exactly one of --at or --in")
        states = states_for(action, state)
        request = BulkRequest(
            action, queue, ids, criteria, states, dry_run, yes, as_json, (at, delay)
        )
        act_in_bulk(request, redis_url)

    decorated: Callable[..., Any] = command
    for option in reversed(_bulk_options(action)):
        decorated = option(decorated)
    return queue_command(name, group=bulk, help_text=summary)(decorated)


Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _bulk_options(action: str) -> list[Decorator]:
    """The arguments and options of ``duetime bulk ACTION``."""
    states = ["scheduled", "ready", "waiting"] + (["running"] if action == "cancel" else [])
    stopped = " Running ones are asked to stop, and end as cancelled." if action == "cancel" else ""
    options: list[Decorator] = [
        click.argument("task_ids", nargs=-1),
        search_options,
        click.option(
            "--state",
            type=click.Choice(states),
            help="With a search: only its matches in this state (default: every task "
            "that has not started; ready includes waiting, the due tasks that wait under "
            "flow control)." + stopped,
        ),
    ]
    if action == "reschedule":
        options += [
            click.option("--at", "at", type=TIME, metavar="TIME", help="The new run-at time."),
            click.option(
                "--in", "delay", type=DURATION, metavar="DURATION", help="The new delay from now."
            ),
        ]
    options += [
        click.option(
            "--dry-run", is_flag=True, help="Say which tasks it would take; change nothing."
        ),
        click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation."),
        click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON."),
    ]
    return options


def act_in_bulk(request: BulkRequest, redis_url: str | None) -> None:
    """Choose the tasks (by a search, walked to its end), confirm, act in batches, and
    say what happened to every task given or matched (exit 8 when nothing was done)."""
    with open_queue(request.queue, redis_url) as client:
        ids, picked = request.ids, None
        if request.criteria is not None:
            with progress_bar() as progress:
                reading = progress.add_task("searching", total=None)
                picked = select_matching(
                    client,
                    request.criteria,
                    on_page=lambda page: progress.advance(reading, page.scanned),
                    states=request.states,
                )
            ids = picked.ids
        if request.dry_run:
            _report_dry_run(request, ids, picked)
            return
        if ids and not request.yes and (request.action == "cancel" or request.criteria):
            verb = {"cancel": "Cancel", "reschedule": "Reschedule", "run_now": "Run now"}
            plural = "" if len(ids) == 1 else "s"
            question = f"{verb[request.action]} {len(ids):,} task{plural} in queue {request.queue}?"
            confirm_or_decline(question, "nothing changed")
        outcome = _acted(client, request, ids)
    if request.as_json:
        report: dict[str, Any] = {"queue": request.queue, "action": request.action}
        report |= {"dry_run": False, "selected": len(ids), "done": len(outcome.done)}
        report |= {"skipped": outcome.skipped, "ids": outcome.done, "run_at": outcome.run_at}
        if picked is not None:
            report |= _matches_report(picked)
        click.echo(json.dumps(report, indent=2))
    else:
        zone = display_zone(None)
        said = outcome.described(zone) if picked is None else outcome.of_matches(picked, zone)
        click.echo(said)
        for task_id, reason in list(outcome.skipped.items())[:DRY_RUN_SHOWN]:
            say(f"skipped {task_id}: {reason}")
    given = len(ids) if picked is None else picked.matched
    if given and not outcome.done:
        sys.exit(EXIT_NOTHING_DONE)


def _matches_report(picked: MatchSelection) -> dict[str, Any]:
    """What a search matched, for --json: every match, those chosen (by state) and those
    not touched (by state)."""
    return {
        "matched": picked.matched,
        "chosen": picked.chosen,
        "not_touched": picked.left_alone,
        "unnameable": picked.unnameable,
    }


def _acted(client: Queue, request: BulkRequest, ids: list[str]) -> BulkOutcome:
    """The action on ``ids``, a batch per call, with a progress bar. A reschedule --in
    takes its time once, by the server's clock, for every batch."""
    at, delay = request.moment
    done: list[str] = []
    skipped: dict[str, str] = {}
    with progress_bar() as progress:
        acting = progress.add_task(request.action.replace("_", " "), total=len(ids))
        for start in range(0, len(ids), BULK_BATCH):
            batch = ids[start : start + BULK_BATCH]
            if request.action == "cancel":
                outcome = client.cancel_many(batch, stop_running=request.stops_running)
            elif request.action == "run_now":
                outcome = client.run_now_many(batch)
            elif at is not None:
                outcome = client.reschedule_many(batch, at)
            else:
                assert delay is not None
                outcome = client.reschedule_many_in(batch, delay)
                at = outcome.run_at
            done += outcome.done
            skipped |= outcome.skipped
            progress.advance(acting, len(batch))
    return BulkOutcome(
        request.action, done, skipped, at if request.action == "reschedule" else None
    )


def _report_dry_run(request: BulkRequest, ids: list[str], picked: MatchSelection | None) -> None:
    if request.as_json:
        report = {"queue": request.queue, "action": request.action, "dry_run": True}
        report |= {"selected": len(ids), "ids": ids}
        if picked is not None:
            report |= _matches_report(picked)
        click.echo(json.dumps(report, indent=2))
        return
    verb = request.action.replace("_", " ")
    if picked is None:
        click.echo(f"would {verb} {len(ids):,} tasks named in {request.queue}")
        return
    said = f"would {verb} {len(ids):,} of {picked.matched:,} matching tasks in {request.queue}"
    if picked.chosen:
        said += f" ({counted(picked.chosen)})"
    if picked.left_alone:
        said += f"; not touched: {counted(picked.left_alone)}"
    if picked.unnameable:
        said += f"; {picked.unnameable:,} with an id duetime does not accept, not touched"
    click.echo(said)
    if picked.sample:
        console().print(status_table(picked.sample[:DRY_RUN_SHOWN]))
    if len(ids) > DRY_RUN_SHOWN:
        click.echo(f"... and {len(ids) - DRY_RUN_SHOWN:,} more (--json lists every id)")


bulk_cancel = bulk_action(
    "cancel",
    """Cancel many tasks that have not started: the TASK_IDS named (running ones are
    asked to stop), or the tasks a search matches that have not started (--state
    running: the running ones). Asks first; --yes does not. Dead tasks are skipped.""",
)
bulk_run_now = bulk_action(
    "run_now",
    """Make many scheduled tasks due now: the TASK_IDS named, or those a search matches
    (which asks first; --yes does not). A task already due (ready, or waiting under flow
    control: a run now passes no limit) is skipped.""",
)
bulk_reschedule = bulk_action(
    "reschedule",
    """Give many tasks that have not started a new run-at (--at or --in): the TASK_IDS
    named, or those a search matches (which asks first; --yes does not).""",
)

COMMANDS = (bulk,)
