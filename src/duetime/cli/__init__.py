"""The ``duetime`` command: run the daemons, schedule, inspect and repair queues.

Exit codes: 0 success; 1 the invariant check found violations; 2 usage error (bad
option, setting or app); 3 Redis unavailable (or, for ``server status``, the embedded
server is not running); 4 no such task; 5 any other duetime error; 6 a daemon gave up
after a part of it kept failing (restart it); 7 a destructive action was not confirmed
(nothing changed).

Times are shown in this host's local zone (cron times in their job's zone), or in UTC
with ``duetime --utc``; JSON output keeps epoch seconds, except ``status``.

This module is the ``main`` group; the commands live in one module per group (daemons,
tasks, search, bulk, queues, dead, cron, limits, server), what they share in ``exits``,
``options``, ``output`` and ``values``.
"""

from __future__ import annotations

import logging
import sys

import click

from duetime.cli import bulk, cron, daemons, dead, limits, queues, search, server, tasks
from duetime.cli.daemons import load_app
from duetime.cli.exits import (
    EXIT_DAEMON_FAILED,
    EXIT_DECLINED,
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_NOTHING_DONE,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    EXIT_VIOLATIONS,
)

__all__ = [
    "EXIT_DAEMON_FAILED",
    "EXIT_DECLINED",
    "EXIT_ERROR",
    "EXIT_NOTHING_DONE",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "EXIT_VIOLATIONS",
    "load_app",
    "main",
]


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
        stream=sys.stderr,
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"])
)
@click.option(
    "--utc", is_flag=True, help="Show times in UTC (default: this host's zone; cron: the job's)."
)
@click.version_option(package_name="duetime")
@click.pass_context
def main(context: click.Context, log_level: str, utc: bool) -> None:
    """duetime: punctual, at-least-once scheduled tasks on Redis or Valkey.

    \b
    Examples:
      duetime run myapp:app --queue emails          # dispatcher + worker in one process
      duetime schedule --queue emails --in 30m '{"to": "a@example.com"}'
      duetime --utc inspect --queue emails --check
    """
    context.meta["duetime.utc"] = utc
    _setup_logging(log_level)


for _group in (daemons, tasks, search, bulk, queues, dead, cron, limits, server):
    for _command in _group.COMMANDS:
        main.add_command(_command)
