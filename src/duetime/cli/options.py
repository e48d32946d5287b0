"""The options the commands share and what they resolve to: the settings (with
--metrics-port), the shards, the Redis URL (or the embedded server) and the queue a
command opens; and the shape of a command on one queue (``queue_command``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from duetime import validation
from duetime.cli.exits import guarded
from duetime.cli.output import say
from duetime.client import Queue
from duetime.settings import Settings

log = logging.getLogger("duetime")

redis_option = click.option(
    "--redis",
    "redis_url",
    envvar="DUETIME_REDIS_URL",
    metavar="URL",
    help="Redis/Valkey URL (or $DUETIME_REDIS_URL); default: the embedded server.",
)
shards_option = click.option(
    "--shards",
    envvar="DUETIME_SHARDS",
    default=1,
    show_default=True,
    type=click.IntRange(1, validation.MOST_SHARDS),
    expose_value=False,
    callback=lambda context, _, value: context.meta.__setitem__("duetime.shards", value),
    help="Shards the queue is spread over (or $DUETIME_SHARDS); the same count everywhere.",
)


metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    expose_value=False,
    callback=lambda context, _, value: context.meta.__setitem__("duetime.metrics_port", value),
    help="Serve Prometheus metrics on this port (or $DUETIME_METRICS_PORT); 0: none.",
)


def command_settings() -> Settings:
    """Settings for this command: defaults, overridden by $DUETIME_<FIELD> variables,
    then by the command's own options (--metrics-port)."""
    settings = Settings.from_env()
    context = click.get_current_context(silent=True)
    port = None if context is None else context.meta.get("duetime.metrics_port")
    return settings if port is None else settings.replace(metrics_port=port)


def open_queue(name: str, redis_url: str | None) -> Queue:
    return Queue(
        name, resolve_redis_url(redis_url), settings=command_settings(), shards=command_shards()
    )


def resolve_redis_url(redis_url: str | None) -> str:
    """The URL to use; with none given, attach to the embedded server (logged at debug), or start
    it (said on stderr: it takes a moment, and it was perhaps stopped on purpose)."""
    if redis_url:
        return redis_url
    from duetime.embedded import ensure_server

    server = ensure_server(on_start=say_starting)
    # Debug only: a client command should print its answer, not which server it used
    # (`duetime server status` says; daemons name the server in their banner).
    log.debug("%s", server.describe())
    return server.url


def say_starting(directory: Path) -> None:
    say(f"duetime: starting the embedded server (data in {directory}) ...")


def command_shards() -> int:
    """The --shards of the running command (every queue it names has that many)."""
    return int(click.get_current_context().meta.get("duetime.shards", 1))


def queue_option(function: Callable[..., Any]) -> Callable[..., Any]:
    option = click.option("--queue", "-q", "queue", required=True, help="Queue name.")
    return option(shards_option(function))


def queues_option(function: Callable[..., Any]) -> Callable[..., Any]:
    option = click.option(
        "--queue", "-q", "queues", required=True, multiple=True, help="Queue name (repeatable)."
    )
    return option(shards_option(function))


def queue_command(
    name: str | None = None, *, group: click.Group | None = None, help_text: str | None = None
) -> Callable[[Callable[..., Any]], click.Command]:
    """A command on one queue, the shape most commands share: ``--queue`` and ``--shards``
    first, then the command's own parameters, ``--redis`` last; its duetime errors become
    a message and an exit code (``guarded``). Added to ``group`` when one is given;
    ``help_text`` stands for the docstring."""

    def make(function: Callable[..., Any]) -> click.Command:
        with_queue = queue_option(guarded(function))
        if group is None:
            command = click.command(name, help=help_text)(with_queue)
        else:
            command = group.command(name, help=help_text)(with_queue)
        # Applied to the command rather than the function, an option comes after its own.
        return redis_option(command)

    return make
