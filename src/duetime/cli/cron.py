"""``duetime cron``: add, list, pause, resume and remove recurring jobs; their times are
shown in each job's own zone (in UTC with ``duetime --utc``)."""

from __future__ import annotations

import dataclasses
import json
from datetime import tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click
from rich.table import Column

from duetime import times
from duetime.cli.options import open_queue, queue_command
from duetime.cli.output import Table, shown_time, stdout_console
from duetime.cli.values import DURATION, MOMENT, TIME, json_argument
from duetime.client import CronBackfillInfo, CronInfo
from duetime.errors import TaskNotFoundError


@click.group(name="cron")
def cron_group() -> None:
    """Recurring jobs: add, list, pause, resume, trigger, backfill, remove.

    \b
    Examples:
      duetime cron add -q reports daily-report '0 9 * * *' '{"kind": "daily"}' \\
          --tz Europe/Paris --task send_report --catch-up 1h
      duetime cron add -q sync poll-user-7 --every 5m '{"user": 7}' --jitter 30s
      duetime cron backfill -q reports daily-report --from 7d --to 1h --rate 2
    """


@queue_command("add", group=cron_group, creates=True)
@click.argument("name")
@click.argument("schedule_and_data", nargs=-1, required=True, metavar="[EXPRESSION] DATA")
@click.option(
    "--every", type=DURATION, metavar="DURATION", help="An interval (5m, 1h) instead of EXPRESSION."
)
@click.option("--tz", default="UTC", show_default=True, help="IANA time zone of the expression.")
@click.option("--task", "task_name", help="Registered handler name (default handler if omitted).")
@click.option(
    "--missed",
    type=click.Choice(["skip", "once", "all"]),
    default="skip",
    show_default=True,
    help="What to do with ticks missed while no dispatcher ran.",
)
@click.option(
    "--overlap",
    type=click.Choice(["allow", "skip", "delay"]),
    default="allow",
    show_default=True,
    help="A tick while the previous run is still live.",
)
@click.option("--max-attempts", type=int)
@click.option(
    "--timeout", type=DURATION, metavar="DURATION", help="How long one attempt may run (30s, 5m)."
)
@click.option("--priority", type=int, default=0, help="Its ticks' priority (-1000 to 1000).")
@click.option("--limit-key", metavar="KEY", help="Its ticks' limit key (see duetime limits).")
@click.option("--cost", type=int, default=1, help="What one tick's start spends of rate limits.")
@click.option(
    "--catch-up", type=DURATION, metavar="DURATION", help="Skip due ticks older than this (1h)."
)
@click.option(
    "--jitter", type=DURATION, metavar="DURATION", help="Put each run off by up to this (30s)."
)
@click.option("--start", type=TIME, metavar="TIME", help="No tick before (ISO 8601 with a zone).")
@click.option("--end", type=TIME, metavar="TIME", help="No tick after (ISO 8601 with a zone).")
@click.option("--max-runs", type=int, help="End the job after this many runs.")
@click.option("--pause-after-failures", type=int, metavar="N", help="Pause after N failed runs.")
def cron_add(
    queue: str,
    name: str,
    schedule_and_data: tuple[str, ...],
    tz: str,
    task_name: str | None,
    redis_url: str | None,
    **options: Any,
) -> None:
    """Create or update the cron job NAME firing EXPRESSION (or --every DURATION) with
    the JSON document DATA."""
    expression, data = _schedule_and_data(schedule_and_data, options["every"] is not None)
    payload = json_argument(data)
    given = {key: value for key, value in options.items() if value is not None}
    with open_queue(queue, redis_url) as client:
        outcome = client.add_cron(name, expression, payload, tz=tz, task=task_name, **given)
    click.echo(f"{outcome} {name}")


def _schedule_and_data(arguments: tuple[str, ...], every: bool) -> tuple[str | None, str]:
    """EXPRESSION and DATA, or DATA alone with --every; a usage error otherwise."""
    if every and len(arguments) == 1:
        return None, arguments[0]
    if not every and len(arguments) == 2:
        return arguments[0], arguments[1]
    wanted = "DATA alone with --every" if every else "EXPRESSION and DATA (or --every and DATA)"
    raise click.UsageError(f"give {wanted}, got {len(arguments)} argument(s)")


@queue_command("list", group=cron_group)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (times in epoch seconds).")
@click.option("--upcoming", default=3, show_default=True, type=click.IntRange(1, 100))
def cron_list(queue: str, as_json: bool, upcoming: int, redis_url: str | None) -> None:
    """Every cron job with its policies, next fire times and last run, in the job's
    own zone (in UTC with duetime --utc)."""
    with open_queue(queue, redis_url) as client:
        jobs = client.list_cron(upcoming)
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(job) for job in jobs], default=str, indent=2))
        return
    # A name is whole (it is what the other commands take); the policies, then the last
    # run, fold under the job's line when the terminal is too narrow for them.
    table = Table(
        "name",
        "schedule",
        Column("next", no_wrap=True),
        Column("last run", no_wrap=True),
        "policies",
        whole=("name",),
        fold=("policies", "last run"),
    )
    for job in jobs:
        table.add_row(job.name, *_cron_cells(job))
    stdout_console().print(table)


def _cron_cells(job: CronInfo) -> tuple[str, str, str, str]:
    """The schedule, next, last-run and policies cells of one cron job."""
    if job.problem is not None:
        state = "paused" if job.paused else "due"
        return f"unusable here ({state}): {job.problem}", "-", "-", "-"
    zone = _job_zone(job.timezone)
    timetable = f"every {_duration(job.every)}" if job.every else job.expression
    policies = [f"missed {job.missed}, overlap {job.overlap}", *_option_lines(job, zone)]
    upcoming_text = "\n".join(shown_time(t, zone) for t in job.next_runs)
    if job.paused or job.ended:
        upcoming_text = "ended" if job.ended else "paused"
    last = "-"
    if job.last_run is not None:
        run = job.last_run
        outcome = {True: "ok", False: "failed", None: run.state}[run.succeeded]
        late = ", backfilled" if run.backfilled else ""
        if run.lateness_ms is not None:
            late = f", {times.format_duration(run.lateness_ms / 1000)} late"
        last = f"{shown_time(run.tick, zone)}\n{outcome}{late}"
    return f"{timetable}\n{job.timezone}", upcoming_text, last, "\n".join(policies)


def _option_lines(job: CronInfo, zone: tzinfo | None) -> list[str]:
    """The schedule's options that are set, and its backfill, one line each."""
    lines = []
    if job.catch_up is not None:
        lines.append(f"catch-up {_duration(job.catch_up)}")
    if job.jitter is not None:
        lines.append(f"jitter {_duration(job.jitter)}")
    if job.start is not None:
        lines.append(f"from {shown_time(job.start, zone)}")
    if job.end is not None:
        lines.append(f"until {shown_time(job.end, zone)}")
    if job.max_runs is not None:
        lines.append(f"runs {job.runs or 0} of {job.max_runs}")
    if job.pause_after_failures is not None:
        lines.append(f"failed in a row {job.failures or 0} of {job.pause_after_failures}")
    if job.backfill is not None:
        backfill = job.backfill
        progress = "done" if backfill.done else f"{backfill.fired} fired"
        if backfill.already_ran:
            progress += f", {backfill.already_ran} had run already"
        lines.append(f"backfill of {backfill.ticks} tick(s): {progress}")
    return lines


def _duration(seconds: float) -> str:
    """A schedule's duration as typed: 30s, 5m, 1h30m."""
    if seconds < 60:
        return f"{seconds:g}s"
    return times.format_duration(seconds)


def _job_zone(name: str) -> tzinfo | None:
    """A cron job's zone, to show its times in; None (local) if this host lacks it."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def _cron_switch(verb: str, paused: bool, summary: str) -> click.Command:
    """``duetime cron pause`` or ``resume`` (one body, two verbs)."""

    @queue_command(verb, group=cron_group, help_text=summary)
    @click.argument("name")
    def command(queue: str, name: str, redis_url: str | None) -> None:
        with open_queue(queue, redis_url) as client:
            changed = client.pause_cron(name) if paused else client.resume_cron(name)
        if changed:
            click.echo(f"{verb}d {name}")
        else:
            click.echo(f"{name} was paused already" if paused else f"{name} was not paused")

    return command


cron_pause = _cron_switch("pause", True, "Stop firing NAME until resumed.")
cron_resume = _cron_switch("resume", False, "Fire NAME again from its next tick after now.")


@queue_command("trigger", group=cron_group)
@click.argument("name")
def cron_trigger(queue: str, name: str, redis_url: str | None) -> None:
    """Run NAME once now, outside its schedule (its ticks go on); prints the task id."""
    with open_queue(queue, redis_url) as client:
        click.echo(client.trigger_cron(name))


def _moment_or_now(ctx: click.Context, param: click.Parameter, value: str) -> float | None:
    """--to: a moment as MOMENT reads it, or None for ``now`` (the server's now)."""
    return None if value.strip().lower() == "now" else MOMENT.convert(value, param, ctx)


@queue_command("backfill", group=cron_group)
@click.argument("name")
@click.option("--from", "start", type=MOMENT, required=True, metavar="TIME",
              help="The range's start: a duration ago (7d) or ISO 8601 with a zone.")  # fmt: skip
@click.option("--to", "end", required=True, metavar="TIME", callback=_moment_or_now,
              help="The range's end (included): in the past, or now.")  # fmt: skip
@click.option("--rate", type=float, default=1.0, show_default=True,
              help="Most ticks started per second.")  # fmt: skip
def cron_backfill(
    queue: str, name: str, start: float, end: float | None, rate: float, redis_url: str | None
) -> None:
    """Run NAME's ticks from --from to --to, at most --rate a second, under its overlap
    policy. A tick that ran already (from an earlier backfill, or queued or running) is
    not run again: the same or an overlapping range again runs only what has not run."""
    with open_queue(queue, redis_url) as client:
        backfill = client.backfill_cron(name, start, end, rate)
        info = client.cron_info(name, upcoming=1)
    zone = None if info is None else _job_zone(info.timezone)
    for line in backfill_lines(name, backfill, zone):
        click.echo(line)


def backfill_lines(name: str, backfill: CronBackfillInfo, zone: tzinfo | None) -> list[str]:
    """What a backfill call did, in words: the backfill it replaced, its range, and how
    many of the range's ticks had run already and are still to run."""
    lines = []
    if backfill.replaced is not None:
        old = backfill.replaced
        lines.append(
            f"replaced the unfinished backfill of {name} from {shown_time(old.start, zone)} "
            f"to {shown_time(old.end, zone)} ({old.ticks - old.to_run} of its {old.ticks} "
            "tick(s) done)"
        )
    span = f"from {shown_time(backfill.start, zone)} to {shown_time(backfill.end, zone)}"
    lines.append(f"backfill of {name}: {backfill.ticks} tick(s) {span}")
    pace = f" at {backfill.rate:g}/s" if backfill.to_run else ""
    lines.append(f"{backfill.already_ran} already ran, {backfill.to_run} to run{pace}")
    return lines


@queue_command("remove", group=cron_group)
@click.argument("name")
def cron_remove(queue: str, name: str, redis_url: str | None) -> None:
    """Forget NAME (ticks already enqueued still run)."""
    with open_queue(queue, redis_url) as client:
        if not client.remove_cron(name):
            raise TaskNotFoundError(f"no cron job {name!r} in queue {queue!r}")
    click.echo(f"removed {name}")


COMMANDS = (cron_group,)
