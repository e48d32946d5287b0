"""The commands on whole queues: ``duetime inspect`` (counts, workers, the invariant
check), ``queues`` (those served on this server), ``pause``/``resume`` and
``history-size`` (how many finished attempts the history keeps)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import click
from rich.table import Column

from duetime import validation
from duetime.cli.exits import EXIT_VIOLATIONS, guarded
from duetime.cli.options import (
    command_settings,
    create_option,
    open_queue,
    queue_command,
    redis_option,
    resolve_redis_url,
    shards_option,
)
from duetime.cli.output import Table, shown, shown_time, stdout_console
from duetime.client import Queue, QueueStats, known_queues
from duetime.client.reports import recently_gone
from duetime.states import worker_state


@queue_command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--check", is_flag=True, help="Verify the invariants; exit 1 on any violation.")
def inspect(queue: str, as_json: bool, check: bool, redis_url: str | None) -> None:
    """Counts per state, next due time, live workers, counters; --check verifies invariants.

    \b
    Example:
      duetime inspect --queue emails --check
    """
    with open_queue(queue, redis_url) as client:
        stats = client.stats()
        violations = client.check() if check else []
    report = dataclasses.asdict(stats)
    if check:
        report["violations"] = [str(v) for v in violations]
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        table = _stats_table(queue, stats)
        console = stdout_console()
        console.print(table)
        if check:
            if violations:
                for violation in violations:
                    console.print("[red]violation[/red] ", end="", highlight=False)
                    console.print(shown(str(violation)), markup=False, highlight=False)
            else:
                console.print("[green]invariants hold[/green]")
    if violations:
        sys.exit(EXIT_VIOLATIONS)


def _stats_table(queue: str, stats: QueueStats) -> Table:
    """The table `inspect` prints: counts, lag, flow control, shards, workers, totals."""
    table = Table(title=f"queue {queue}", show_header=False)
    for state in ("scheduled", "ready", "running", "dead"):
        table.add_row(state, str(getattr(stats, state)))
    table.add_row("next due", shown_time(stats.next_due))
    table.add_row("paused", "yes: workers claim nothing" if stats.paused else "no")
    table.add_row(
        "lag",
        f"promotion {stats.oldest_due_age:.3f}s, claim {stats.oldest_ready_age:.3f}s "
        "(oldest due task not yet ready; oldest ready task not yet claimed)",
    )
    if stats.flow_control:
        table.add_row(
            "flow control",
            f"{stats.waiting} of the ready wait for a turn or a limit; "
            f"{stats.throttled} rate-limited (duetime limits show)",
        )
    for index, shard in enumerate(stats.shards):
        table.add_row(
            f"shard {index}",
            f"{shard.scheduled} scheduled, {shard.ready} ready, {shard.running} running, "
            f"{shard.dead} dead ({shard.queue})",
        )
    settings = command_settings()
    for worker_id, age in sorted(stats.workers.items()):
        state = worker_state(age, settings.heartbeat_interval, settings.worker_ttl)
        table.add_row("worker", f"{worker_id} ({state}: heartbeat {age:.1f}s ago)")
    for gone in recently_gone(stats, time.time()):
        table.add_row(
            "worker",
            f"{gone.id} (gone: taken for dead {shown_time(gone.reaped_at)}, "
            f"{gone.taken_back} task(s) taken back)",
        )
    for name, value in sorted(stats.counters.items()):
        table.add_row(f"total {name}", str(value))
    return table


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@redis_option
@guarded
def queues(as_json: bool, redis_url: str | None) -> None:
    """The queues on this server, with their depths.

    A queue is listed from its first write (a task, a cron job, limits, a pause: the
    client that wrote it notes it) or once a dispatcher has started for it (each notes
    its queues); "no dispatcher" says none has.
    """
    url = resolve_redis_url(redis_url)
    settings = command_settings()
    rows = []
    for known in known_queues(url, settings):
        with Queue(known.name, url, settings=settings, shards=known.shards) as client:
            stats = client.stats()
        rows.append((known, stats))
    if as_json:
        report = [
            {
                "queue": known.name,
                "shards": known.shards,
                "seen": known.seen_ms / 1000 if known.seen_ms else None,
                "scheduled": stats.scheduled,
                "ready": stats.ready,
                "running": stats.running,
                "dead": stats.dead,
                "paused": stats.paused,
                "workers": len(stats.workers),
            }
            for known, stats in rows
        ]
        click.echo(json.dumps(report, indent=2))
        return
    table = Table(
        "queue",
        Column("sched.", justify="right"),
        Column("ready", justify="right"),
        Column("running", justify="right"),
        Column("dead", justify="right"),
        Column("workers", justify="right"),
        "state",
        one_line=("queue",),
    )
    for known, stats in rows:
        name = known.name if known.shards == 1 else f"{known.name} ({known.shards} shards)"
        table.add_row(
            name,
            str(stats.scheduled),
            str(stats.ready),
            str(stats.running),
            str(stats.dead),
            str(len(stats.workers)),
            "paused" if stats.paused else "active" if known.seen_ms else "no dispatcher",
        )
    stdout_console().print(table)


def _queue_switch(verb: str, paused: bool, summary: str) -> click.Command:
    """``duetime pause`` or ``resume`` (one body, two verbs); pause takes --create (a
    queue paused before its first task), resume refuses a queue never seen."""

    def switch(queue_name: str, redis_url: str | None) -> None:
        with open_queue(queue_name, redis_url) as client:
            changed = client.pause() if paused else client.resume()
        state = "paused" if paused else "resumed"
        click.echo(f"{queue_name} {state}" if changed else f"{queue_name} was already {state}")

    command = guarded(switch)
    if paused:
        command = create_option(command)
    command = redis_option(shards_option(command))
    return click.command(verb, help=summary)(click.argument("queue_name", metavar="QUEUE")(command))


pause = _queue_switch(
    "pause",
    True,
    "Workers stop claiming from QUEUE (running tasks finish); scheduling and promotion go on.",
)
resume = _queue_switch("resume", False, "Workers claim from QUEUE again, at once.")


@queue_command("history-size", creates=True)
@click.argument("size", required=False, metavar="[SIZE|default]")
def history_size(queue: str, size: str | None, redis_url: str | None) -> None:
    """How many finished attempts the queue's history keeps (per shard); with SIZE, keep
    that many from now on (0: none, and delete what is kept; default: 1,000).

    \b
    Examples:
      duetime history-size -q emails
      duetime history-size -q emails 20000
    """
    wanted: int | None = None
    if size is not None and size != "default":
        if not validation.is_whole(size):
            raise click.BadParameter(f"expected a whole number or default, got {size!r}")
        wanted = int(size)
    with open_queue(queue, redis_url) as client:
        if size is not None:
            client.set_history(wanted)
        kept = client.history_size()
    shown_size = f"the last {kept:,} finished attempts" if kept else "no finished attempts"
    click.echo(
        f"{queue} keeps {shown_size}" + (" per shard" if client.core.queue.layout.count > 1 else "")
    )


COMMANDS = (inspect, queues, pause, resume, history_size)
