"""The commands that run long-lived processes: ``duetime dispatcher``, ``worker``, ``run``
(both in one process) and ``dashboard``; and loading the APP whose handlers workers run."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import traceback
from typing import Any

import click

from duetime import startup, validation
from duetime.app import App
from duetime.cli.exits import guarded
from duetime.cli.options import (
    command_settings,
    command_shards,
    metrics_port_option,
    queues_option,
    redis_option,
    resolve_redis_url,
    unknown_queue,
    unknown_queue_error,
)
from duetime.cli.output import DEFAULT_HANDLER_SHOWN
from duetime.cli.processes import (
    Daemon,
    fork_workers,
    run_daemons,
    stopped_cleanly_while_starting,
)
from duetime.client import Queue
from duetime.dispatcher import Dispatcher
from duetime.errors import ConfigurationError, DuetimeError
from duetime.settings import Settings
from duetime.worker import DEFAULT_CONCURRENCY, Worker

log = logging.getLogger("duetime")

concurrency_option = click.option(
    "--concurrency",
    "-c",
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Tasks run at once by each worker.",
)


def load_app(target: str) -> App:
    """Import MODULE:OBJECT (the current directory is importable) and coerce it to an App."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"expected MODULE:OBJECT, got {target!r}", param_hint="APP")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as error:
        raise click.BadParameter(f"cannot load {target!r}: {error}", param_hint="APP") from None
    except Exception as error:  # the module itself raised while being imported
        where = traceback.extract_tb(error.__traceback__)[-1]
        raise click.BadParameter(
            f"cannot load {target!r}: importing {module_name} raised "
            f"{type(error).__name__}: {error} (at {where.filename}:{where.lineno})",
            param_hint="APP",
        ) from None
    return App.coerce(found)


def handler_names(app: App) -> str:
    """The handlers a worker runs, for its banner."""
    names = [name or DEFAULT_HANDLER_SHOWN for name in app.names()]
    return f"handlers {', '.join(names)}" if names else "no handlers (every task will fail)"


def check_queues(queues: tuple[str, ...], url: str, settings: Settings, *, served: bool) -> None:
    """Before the banner: each queue name checked, and each queue this server never saw
    either refused (a dashboard: there is nothing to show; TaskNotFoundError) or, for the
    daemons that ``served`` it (starting one is how a queue comes to be), named in a
    warning with the known queues: a typo shows at once, not as a worker idle for ever.
    A server that cannot be asked (down, an ACL) is left to the daemon, which reports it
    and retries as it always does."""
    for name in queues:
        validation.queue_name(name)
    for name in queues:
        try:
            with Queue(name, url, settings=settings, shards=command_shards()) as client:
                problem = unknown_queue(client, url)
        except DuetimeError as error:
            log.debug("could not look for queue %s in the registry: %s", name, error)
            continue
        if problem is not None and not served:
            raise unknown_queue_error(problem)
        if problem is not None:
            log.warning("%s; serving it as a new queue", problem)


@click.command()
@queues_option
@metrics_port_option
@redis_option
@guarded
def dispatcher(queues: tuple[str, ...], redis_url: str | None) -> None:
    """Promote due tasks, reap expired leases and dead workers. Run as many as you like.

    \b
    Example:
      duetime dispatcher --queue emails --queue reports --redis redis://localhost:6379/0
    """
    with stopped_cleanly_while_starting():
        settings = command_settings()
        url = resolve_redis_url(redis_url)
        check_queues(queues, url, settings, served=True)
        daemon = Dispatcher(list(queues), url, settings=settings, shards=command_shards())
        startup.banner("dispatcher", queues, url, settings, shards=command_shards())
    run_daemons([daemon])


def _workers(
    app: App,
    queues: tuple[str, ...],
    url: str,
    concurrency: int,
    settings: Settings,
    shards: int,
) -> list[Worker]:
    return [
        Worker(app, q, url, concurrency=concurrency, settings=settings, shards=shards)
        for q in queues
    ]


@click.command()
@click.argument("app_path", metavar="APP")
@queues_option
@concurrency_option
@click.option(
    "--processes",
    "-p",
    default=1,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Fork this many worker processes (for CPU-bound handlers).",
)
@metrics_port_option
@redis_option
@guarded
def worker(
    app_path: str, queues: tuple[str, ...], concurrency: int, processes: int, redis_url: str | None
) -> None:
    """Run the handlers of APP (MODULE:OBJECT: an App, a dict of functions or one function).

    \b
    Example:
      duetime worker myapp:app --queue emails --concurrency 50 --processes 2
    """
    with stopped_cleanly_while_starting():
        settings = command_settings()
        app = load_app(app_path)
        url = resolve_redis_url(redis_url)
        check_queues(queues, url, settings, served=True)
        details = [
            f"concurrency {concurrency} per queue",
            f"{processes} process(es)",
            handler_names(app),
        ]
        startup.banner("worker", queues, url, settings, shards=command_shards(), details=details)

    shards = command_shards()

    def child(slot: int) -> None:
        # Each forked process serves its metrics on a port of its own: the given one + slot.
        port = settings.metrics_port and settings.metrics_port + slot
        own = settings.replace(metrics_port=port) if port <= 65535 else settings
        run_daemons(_workers(app, queues, url, concurrency, own, shards))

    if processes == 1:
        child(0)
    else:
        fork_workers(processes, child)


@click.command()
@click.argument("app_path", metavar="APP")
@queues_option
@concurrency_option
@metrics_port_option
@redis_option
@guarded
def run(app_path: str, queues: tuple[str, ...], concurrency: int, redis_url: str | None) -> None:
    """Dispatcher and worker in one process, for small deployments.

    \b
    Example:
      duetime run myapp:app --queue emails
    """
    with stopped_cleanly_while_starting():
        settings = command_settings()
        app = load_app(app_path)
        url = resolve_redis_url(redis_url)
        check_queues(queues, url, settings, served=True)
        daemons: list[Daemon] = [
            Dispatcher(list(queues), url, settings=settings, shards=command_shards()),
            *_workers(app, queues, url, concurrency, settings, command_shards()),
        ]
        details = [f"concurrency {concurrency} per queue", handler_names(app)]
        startup.banner(
            "dispatcher + worker", queues, url, settings, shards=command_shards(), details=details
        )
    run_daemons(daemons)


# Long: its seven options and their help are most of it; the body is short.
@click.command()
@queues_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--token",
    envvar="DUETIME_DASHBOARD_TOKEN",
    help="Access token, at least 16 characters (or $DUETIME_DASHBOARD_TOKEN).",
)
@click.option(
    "--basic-auth",
    envvar="DUETIME_DASHBOARD_BASIC_AUTH",
    metavar="USER:PASSWORD",
    help="HTTP basic authentication (or $DUETIME_DASHBOARD_BASIC_AUTH).",
)
@click.option(
    "--viewer-token",
    envvar="DUETIME_DASHBOARD_VIEWER_TOKEN",
    help="A token for viewers, who see everything and act on nothing "
    "(or $DUETIME_DASHBOARD_VIEWER_TOKEN).",
)
@click.option(
    "--viewer-basic-auth",
    envvar="DUETIME_DASHBOARD_VIEWER_BASIC_AUTH",
    metavar="USER:PASSWORD",
    help="Basic authentication for viewers (or $DUETIME_DASHBOARD_VIEWER_BASIC_AUTH).",
)
@redis_option
@guarded
def dashboard(
    queues: tuple[str, ...],
    host: str,
    port: int,
    token: str | None,
    basic_auth: str | None,
    viewer_token: str | None,
    viewer_basic_auth: str | None,
    redis_url: str | None,
) -> None:
    """Serve the web dashboard for the queues (needs the `dashboard` extra).

    Bound to anything but this host, it refuses to start without --token or
    --basic-auth.

    \b
    Example:
      duetime dashboard -q emails -q reports --port 8080
    """
    try:
        from duetime.dashboard import serve
    except ImportError as error:
        raise ConfigurationError(
            f"the dashboard needs its extra: pip install 'duetime[dashboard]' ({error})"
        ) from None
    settings = command_settings()
    url = resolve_redis_url(redis_url)
    check_queues(queues, url, settings, served=False)
    startup.banner(
        "dashboard",
        queues,
        url,
        settings,
        shards=command_shards(),
        details=[f"http://{host}:{port}/"],
    )
    serve(
        list(queues),
        url,
        host=host,
        port=port,
        shards=command_shards(),
        settings=settings,
        token=token,
        basic_auth=basic_auth,
        viewer_token=viewer_token,
        viewer_basic_auth=viewer_basic_auth,
        log_level=logging.getLevelName(logging.getLogger().level).lower(),
    )


COMMANDS = (dispatcher, worker, run, dashboard)
