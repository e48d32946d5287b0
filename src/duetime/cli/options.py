"""The options the commands share and what they resolve to: the settings (with
--metrics-port), the shards, the Redis URL (or the embedded server) and the queue a
command opens; and the shape of a command on one queue (``queue_command``)."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from duetime import validation
from duetime.cli.exits import guarded
from duetime.cli.output import say
from duetime.client import Queue, known_queues
from duetime.errors import RedisCommandError, TaskNotFoundError
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


create_option = click.option(
    "--create",
    is_flag=True,
    expose_value=False,
    callback=lambda context, _, value: context.meta.__setitem__("duetime.create", value),
    help="Create the queue if this server has never seen it (an unknown queue is refused "
    "otherwise: most likely a typo).",
)


def open_queue(name: str, redis_url: str | None) -> Queue:
    """The queue ``name`` of the command; TaskNotFoundError (exit 4) when this server has
    never seen it, unless the command was given --create (``refuse_unknown_queue``)."""
    url = resolve_redis_url(redis_url)
    client = Queue(name, url, settings=command_settings(), shards=command_shards())
    context = click.get_current_context(silent=True)
    if context is None or not context.meta.get("duetime.create"):
        try:
            refuse_unknown_queue(client, url, creatable=context is not None and _creates(context))
        except BaseException:
            client.close()
            raise
    return client


def _creates(context: click.Context) -> bool:
    """Whether the running command takes --create."""
    return any(param.name == "create" for param in context.command.params)


def refuse_unknown_queue(client: Queue, url: str, *, creatable: bool = False) -> None:
    """Raise TaskNotFoundError (``unknown_queue``) when the server never saw ``client``'s
    queue; ``creatable``: the command takes --create, and the message says so."""
    problem = unknown_queue(client, url)
    if problem is not None:
        raise unknown_queue_error(problem, creatable=creatable)


def unknown_queue_error(problem: str, *, creatable: bool = False) -> TaskNotFoundError:
    """The error of an unknown queue: ``problem`` (``unknown_queue``) and what to check."""
    create = "; pass --create to create it" if creatable else ""
    return TaskNotFoundError(f"{problem} (check the name, --shards and --redis{create})")


def unknown_queue(client: Queue, url: str) -> str | None:
    """What to say when the server has never seen ``client``'s queue, naming the known
    queues (the closest first); None when it has: noted in the registry of queues (by a
    client after its first write, by a dispatcher when it starts), or holding anything
    (tasks, counters, workers, limits, cron jobs: written before the registry was). A
    queue never seen is most likely a mistyped name, --shards or --redis. A user whose
    ACL does not reach the registry (a key pattern of one queue) is judged by what the
    queue holds; one that cannot read that either is let through (the command says what
    it meets)."""
    try:
        known: list[str] | None = [q.name for q in known_queues(url, client.core.queue.settings)]
    except RedisCommandError:
        known = None
    if known is not None and client.name in known:
        return None
    try:
        if _ever_used(client):
            return None
    except RedisCommandError:
        return None
    if known is None:
        return (
            f"no queue {client.name!r} on this server: it holds nothing (this user cannot "
            "read the registry of queues to name the others)"
        )
    close = difflib.get_close_matches(client.name, known, n=3, cutoff=0.6)
    others = [name for name in known if name not in close]
    if close:
        listed = f"did you mean {' or '.join(repr(name) for name in close)}?"
        if others:
            listed += f" (the others: {_names(others)})"
    elif known:
        listed = f"the queues it knows: {_names(others)}"
    else:
        listed = "it knows no queue yet"
    return (
        f"no queue {client.name!r} on this server: nothing was ever scheduled on it and no "
        f"dispatcher served it; {listed}"
    )


#: The most names an unknown-queue error lists.
_MOST_NAMED = 10


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_MOST_NAMED])
    more = len(names) - _MOST_NAMED
    return shown + (f" and {more} more (duetime queues)" if more > 0 else "")


def _ever_used(client: Queue) -> bool:
    """Whether a queue holds anything: a task, a counter, a worker, limits, a pause, a
    cron job."""
    stats = client.stats()
    counts = (stats.scheduled, stats.ready, stats.running, stats.dead)
    used = stats.counters or any(counts) or stats.workers or stats.flow_control or stats.paused
    return bool(used) or bool(client.list_cron())


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
    name: str | None = None,
    *,
    group: click.Group | None = None,
    help_text: str | None = None,
    creates: bool = False,
) -> Callable[[Callable[..., Any]], click.Command]:
    """A command on one queue, the shape most commands share: ``--queue`` and ``--shards``
    first, then the command's own parameters, ``--redis`` last; its duetime errors become
    a message and an exit code (``guarded``). An unknown queue is refused (``open_queue``);
    a command that ``creates`` takes --create, to write to a queue never used before.
    Added to ``group`` when one is given; ``help_text`` stands for the docstring."""

    def make(function: Callable[..., Any]) -> click.Command:
        with_queue = queue_option(guarded(function))
        if creates:
            with_queue = create_option(with_queue)
        if group is None:
            command = click.command(name, help=help_text)(with_queue)
        else:
            command = group.command(name, help=help_text)(with_queue)
        # Applied to the command rather than the function, an option comes after its own.
        return redis_option(command)

    return make
