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
from duetime.cli.values import DURATION, json_argument
from duetime.client import CronInfo
from duetime.errors import TaskNotFoundError


@click.group(name="cron")
def cron_group() -> None:
    """Recurring jobs: add, list, pause, resume, remove.

    \b
    Example:
      duetime cron add -q reports daily-report '0 9 * * *' '{"kind": "daily"}' \\
          --tz Europe/Paris --task send_report
    """


@queue_command("add", group=cron_group)
@click.argument("name")
@click.argument("expression")
@click.argument("data")
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
def cron_add(
    queue: str,
    name: str,
    expression: str,
    data: str,
    tz: str,
    task_name: str | None,
    missed: str,
    overlap: str,
    max_attempts: int | None,
    timeout: float | None,
    redis_url: str | None,
    **flow: Any,
) -> None:
    """Create or update the cron job NAME firing EXPRESSION with the JSON document DATA."""
    payload = json_argument(data)
    with open_queue(queue, redis_url) as client:
        outcome = client.add_cron(
            name,
            expression,
            payload,
            tz=tz,
            task=task_name,
            missed=missed,
            overlap=overlap,
            max_attempts=max_attempts,
            timeout=timeout,
            **flow,
        )
    click.echo(f"{outcome} {name}")


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
    table = Table(
        "name",
        "schedule",
        Column("next", no_wrap=True),
        Column("last run", no_wrap=True),
        one_line=("name",),
    )
    for job in jobs:
        table.add_row(job.name, *_cron_cells(job))
    stdout_console().print(table)


def _cron_cells(job: CronInfo) -> tuple[str, str, str]:
    """The schedule, next and last-run cells of one cron job."""
    if job.problem is not None:
        state = "paused" if job.paused else "due"
        return f"unusable here ({state}): {job.problem}", "-", "-"
    zone = _job_zone(job.timezone)
    schedule_text = f"{job.expression}\n{job.timezone}\nmissed {job.missed}, overlap {job.overlap}"
    upcoming_text = (
        "paused" if job.paused else "\n".join(shown_time(t, zone) for t in job.next_runs)
    )
    last = "-"
    if job.last_run is not None:
        run = job.last_run
        outcome = {True: "ok", False: "failed", None: run.state}[run.succeeded]
        late = ""
        if run.lateness_ms is not None:
            late = f", {times.format_duration(run.lateness_ms / 1000)} late"
        last = f"{shown_time(run.tick, zone)}\n{outcome}{late}"
    return schedule_text, upcoming_text, last


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


@queue_command("remove", group=cron_group)
@click.argument("name")
def cron_remove(queue: str, name: str, redis_url: str | None) -> None:
    """Forget NAME (ticks already enqueued still run)."""
    with open_queue(queue, redis_url) as client:
        if not client.remove_cron(name):
            raise TaskNotFoundError(f"no cron job {name!r} in queue {queue!r}")
    click.echo(f"removed {name}")


COMMANDS = (cron_group,)
