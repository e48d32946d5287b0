"""``duetime server``: start, stop and report on the embedded Valkey server used when no
Redis URL is given."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import click

from duetime import times
from duetime.cli.exits import EXIT_UNAVAILABLE, guarded
from duetime.cli.options import say_starting
from duetime.cli.output import Table, say, stdout_console


@click.group()
def server() -> None:
    """The embedded Valkey server used when no Redis URL is given.

    It is your user's, not a project's: every project of yours that gives no URL
    shares it, unless DUETIME_HOME gives a project one of its own.

    \b
    Examples:
      duetime server status
      duetime server stop
    """


@server.command("start")
@guarded
def server_start() -> None:
    """Start the embedded server (or report the running one)."""
    from duetime.embedded import ensure_server

    started = ensure_server(on_start=say_starting)
    click.echo(started.describe())


@server.command("stop")
@guarded
def server_stop() -> None:
    """Stop the embedded server; its data stays on disk. Says so when other processes
    were connected (daemons, dashboards, applications): they lose their server."""
    from duetime.embedded import attached, stop_server

    users = attached()
    if not stop_server():
        click.echo("not running")
        return
    click.echo("stopped")
    if users is not None and users.connections:
        daemons = f", {users.waiting} of them a daemon's wait or subscription" * bool(users.waiting)
        say(
            f"warning: {users.connections} connection(s) of other processes were attached"
            f"{daemons}; they lose their server until a command starts it again"
        )


@server.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (memory in bytes).")
@guarded
def server_status(as_json: bool) -> None:
    """Whether the embedded server runs, and its address, pid, version and memory;
    exits with 3 when it does not run. Never starts it."""
    from duetime.embedded import data_dir, server_info

    found = server_info()
    if as_json:
        report: dict[str, Any] = {"running": found is not None}
        if found is None:
            report["data_dir"] = str(data_dir())
        else:
            report |= dataclasses.asdict(found)
            report["address"] = report.pop("url")
            report["data_dir"] = str(found.data_dir)
        click.echo(json.dumps(report, indent=2))
    elif found is None:
        click.echo(f"not running (data in {data_dir()})")
    else:
        table = Table(show_header=False)
        table.add_row("running", f"yes, for {times.format_duration(found.uptime)}")
        table.add_row("address", found.url)
        table.add_row("pid", str(found.pid))
        table.add_row("version", found.version)
        memory = f"{_size(found.memory_used)} (peak {_size(found.memory_peak)})"
        table.add_row("memory used", memory)
        table.add_row("data", str(found.data_dir))
        stdout_console().print(table)
    if found is None:
        sys.exit(EXIT_UNAVAILABLE)


def _size(size: int) -> str:
    """Bytes for a person: 1.2 MiB."""
    amount, unit = float(size), "B"
    for larger in ("KiB", "MiB", "GiB", "TiB"):
        if amount < 1024:
            break
        amount, unit = amount / 1024, larger
    return f"{size} B" if unit == "B" else f"{amount:.1f} {unit}"


COMMANDS = (server,)
