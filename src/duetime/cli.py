"""The ``duetime`` command: run the daemons, schedule, inspect and repair queues.

Exit codes: 0 success; 1 the invariant check found violations; 2 usage error (bad
option, setting or app); 3 Redis unavailable; 4 no such task; 5 any other duetime
error; 6 a daemon gave up after a part of it kept failing (restart it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text as RichText

from duetime import validation
from duetime.app import App
from duetime.dispatcher import Dispatcher
from duetime.errors import (
    ConfigurationError,
    DaemonFailedError,
    DuetimeError,
    InvalidInputError,
    RedisUnavailableError,
    TaskNotFoundError,
)
from duetime.scheduler import Queue
from duetime.settings import Settings
from duetime.states import TaskState
from duetime.store.runner import mask_url
from duetime.worker import Worker

EXIT_OK = 0
EXIT_VIOLATIONS = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_NOT_FOUND = 4
EXIT_ERROR = 5
EXIT_DAEMON_FAILED = 6


class Table(RichTable):
    """A rich table whose cells are shown safely: an id or name read from Redis that is
    not UTF-8 (written by hand) is escaped, not a crash, and never taken as markup."""

    def add_row(self, *cells: Any, **options: Any) -> None:
        super().add_row(*(RichText(_shown(str(cell))) for cell in cells), **options)


def _shown(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


console = Console()
errors = Console(stderr=True)
log = logging.getLogger("duetime")


def _fail(message: str, code: int) -> NoReturn:
    errors.print("[red]error:[/red] ", end="", highlight=False)
    errors.print(_shown(message), markup=False, highlight=False)  # user text is not markup
    sys.exit(code)


def _settings() -> Settings:
    """Settings for this command: defaults, overridden by $DUETIME_<FIELD> variables."""
    return Settings.from_env()


def _queue(name: str, redis_url: str | None) -> Queue:
    return Queue(name, _redis_url(redis_url), settings=_settings(), shards=_shards())


def _redis_url(redis_url: str | None) -> str:
    """The URL to use; with none given, start or attach to the embedded server and say so."""
    if redis_url:
        return redis_url
    from duetime.embedded import ensure_server

    server = ensure_server()
    errors.print(server.describe(), highlight=False)
    return server.url


def _guarded(function: Callable[..., Any]) -> Callable[..., Any]:
    """Turn duetime errors into a message and a named exit code."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except RedisUnavailableError as error:
            _fail(str(error), EXIT_UNAVAILABLE)
        except TaskNotFoundError as error:
            _fail(str(error), EXIT_NOT_FOUND)
        except (InvalidInputError, ConfigurationError) as error:
            _fail(str(error), EXIT_USAGE)
        except DuetimeError as error:
            _fail(mask_url(str(error)), EXIT_ERROR)

    wrapper.__name__ = function.__name__
    wrapper.__doc__ = function.__doc__
    return wrapper


redis_option = click.option(
    "--redis",
    "redis_url",
    envvar="DUETIME_REDIS_URL",
    metavar="URL",
    help="Redis/Valkey URL (or $DUETIME_REDIS_URL); default: the embedded server.",
)
_shards_option = click.option(
    "--shards",
    envvar="DUETIME_SHARDS",
    default=1,
    show_default=True,
    type=click.IntRange(1, validation.MOST_SHARDS),
    expose_value=False,
    callback=lambda context, _, value: context.meta.__setitem__("duetime.shards", value),
    help="Shards the queue is spread over (or $DUETIME_SHARDS); the same count everywhere.",
)


def _shards() -> int:
    """The --shards of the running command (every queue it names has that many)."""
    return int(click.get_current_context().meta.get("duetime.shards", 1))


def queue_option(function: Callable[..., Any]) -> Callable[..., Any]:
    option = click.option("--queue", "-q", "queue", required=True, help="Queue name.")
    return option(_shards_option(function))


def queues_option(function: Callable[..., Any]) -> Callable[..., Any]:
    option = click.option(
        "--queue", "-q", "queues", required=True, multiple=True, help="Queue name (repeatable)."
    )
    return option(_shards_option(function))


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
@click.version_option(package_name="duetime")
def main(log_level: str) -> None:
    """duetime: punctual, at-least-once scheduled tasks on Redis or Valkey.

    \b
    Examples:
      duetime run myapp:app --queue emails          # dispatcher + worker in one process
      duetime schedule --queue emails --in 30 '{"to": "a@example.com"}'
      duetime inspect --queue emails --check
    """
    _setup_logging(log_level)


# --- daemons ---------------------------------------------------------------------------


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


def _run_daemons(daemons: list[Any]) -> None:
    """Run daemons until SIGTERM/SIGINT: the first signal stops them gracefully, the
    second at once. When one of them fails (DaemonFailedError, or any exception), the
    others are stopped gracefully and the process exits non-zero, so that whatever
    supervises it starts a fresh one: never a process that is up but not working."""

    async def supervise() -> int:
        loop = asyncio.get_running_loop()
        signals = {"count": 0}

        def stop(now: bool) -> None:
            for daemon in daemons:
                if isinstance(daemon, Worker):
                    daemon.stop(now=now)
                else:
                    daemon.stop()

        def on_signal() -> None:
            signals["count"] += 1
            now = signals["count"] > 1
            log.info("stopping %s", "now" if now else "gracefully (signal again to stop at once)")
            stop(now)

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal)
        runs = [asyncio.create_task(daemon.run()) for daemon in daemons]
        done, _ = await asyncio.wait(runs, return_when=asyncio.FIRST_EXCEPTION)
        if any(task.exception() is not None for task in done):
            stop(now=False)
        await asyncio.wait(runs)
        return max(_exit_code(task.exception()) for task in runs)

    code = asyncio.run(supervise())
    # A handler thread that overran its timeout cannot be stopped, and the interpreter
    # joins such threads at exit; its task is already handed back, so leave now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_code(error: BaseException | None) -> int:
    """The exit code for how a daemon ended, with the reason logged."""
    if error is None:
        return EXIT_OK
    if isinstance(error, DaemonFailedError):
        log.critical("%s; exiting so that a supervisor can start a fresh process", error)
        return EXIT_DAEMON_FAILED
    if isinstance(error, RedisUnavailableError):
        log.critical("%s", error)
        return EXIT_UNAVAILABLE
    if isinstance(error, InvalidInputError | ConfigurationError):
        log.critical("%s", error)
        return EXIT_USAGE
    if isinstance(error, DuetimeError):
        log.critical("%s", mask_url(str(error)))
        return EXIT_ERROR
    log.critical("a daemon failed", exc_info=error)
    return EXIT_DAEMON_FAILED


@main.command()
@queues_option
@redis_option
@_guarded
def dispatcher(queues: tuple[str, ...], redis_url: str | None) -> None:
    """Promote due tasks, reap expired leases and dead workers. Run as many as you like.

    \b
    Example:
      duetime dispatcher --queue emails --queue reports --redis redis://localhost:6379/0
    """
    settings = _settings()
    url = _redis_url(redis_url)
    _run_daemons([Dispatcher(list(queues), url, settings=settings, shards=_shards())])


def _workers(
    app: App,
    queues: tuple[str, ...],
    url: str,
    concurrency: int,
    settings: Settings,
    shards: int,
) -> list[Any]:
    return [
        Worker(app, q, url, concurrency=concurrency, settings=settings, shards=shards)
        for q in queues
    ]


@main.command()
@click.argument("app_path", metavar="APP")
@queues_option
@click.option("--concurrency", "-c", default=10, show_default=True, type=click.IntRange(1, 10_000))
@click.option(
    "--processes",
    "-p",
    default=1,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Fork this many worker processes (for CPU-bound handlers).",
)
@redis_option
@_guarded
def worker(
    app_path: str, queues: tuple[str, ...], concurrency: int, processes: int, redis_url: str | None
) -> None:
    """Run the handlers of APP (MODULE:OBJECT: an App, a dict of functions or one function).

    \b
    Example:
      duetime worker myapp:app --queue emails --concurrency 50 --processes 2
    """
    settings = _settings()
    app = load_app(app_path)
    url = _redis_url(redis_url)
    workers = functools.partial(_workers, app, queues, url, concurrency, settings, _shards())
    if processes == 1:
        _run_daemons(workers())
    else:
        _fork_workers(processes, lambda: _run_daemons(workers()))


def _fork_workers(processes: int, child_main: Callable[[], None]) -> None:
    """Fork worker processes, forward signals to them and restart any that crash."""
    children: dict[int, int] = {}
    stopping = {"count": 0}

    def spawn(slot: int) -> None:
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            # Ctrl-C reaches the whole process group; the parent forwards it as
            # SIGTERM, so a child acting on both would count two signals and stop hard.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            status = 1
            try:
                child_main()
                status = 0
            except BaseException:
                log.exception("worker process failed")
            finally:
                os._exit(status)
        children[pid] = slot

    def forward(signum: int, frame: Any) -> None:
        stopping["count"] += 1
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for slot in range(processes):
        spawn(slot)
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        slot = children.pop(pid, -1)
        if slot >= 0 and not stopping["count"]:
            log.warning("worker process %d exited (status %d); starting another", pid, status)
            time.sleep(0.5)
            spawn(slot)


@main.command()
@click.argument("app_path", metavar="APP")
@queues_option
@click.option("--concurrency", "-c", default=10, show_default=True, type=click.IntRange(1, 10_000))
@redis_option
@_guarded
def run(app_path: str, queues: tuple[str, ...], concurrency: int, redis_url: str | None) -> None:
    """Dispatcher and worker in one process, for small deployments.

    \b
    Example:
      duetime run myapp:app --queue emails
    """
    settings = _settings()
    app = load_app(app_path)
    url = _redis_url(redis_url)
    _run_daemons(
        [
            Dispatcher(list(queues), url, settings=settings, shards=_shards()),
            *_workers(app, queues, url, concurrency, settings, _shards()),
        ]
    )


# --- client commands -----------------------------------------------------------------


@main.command()
@queue_option
@click.option("--at", "at", type=float, help="Run at this epoch time (seconds).")
@click.option("--in", "delay", type=float, help="Run this many seconds from now.")
@click.option("--id", "task_id", help="Task id (idempotent: the same id twice is one task).")
@click.option("--task", "task_name", help="Registered handler name (default: the default handler).")
@click.option("--max-attempts", type=int)
@click.option("--timeout", type=float, help="Seconds one attempt may run.")
@click.option("--result-ttl", type=float, help="Keep the result this many seconds.")
@click.argument("data")
@redis_option
@_guarded
def schedule(
    queue: str,
    at: float | None,
    delay: float | None,
    task_id: str | None,
    task_name: str | None,
    max_attempts: int | None,
    timeout: float | None,
    result_ttl: float | None,
    data: str,
    redis_url: str | None,
) -> None:
    """Schedule a task whose data is the JSON document DATA; prints its id.

    \b
    Examples:
      duetime schedule --queue emails --in 60 '{"to": "a@example.com"}'
      duetime schedule --queue emails --at 1795320000 --id welcome-42 --task send '{}'
    """
    if (at is None) == (delay is None):
        raise click.UsageError("give exactly one of --at or --in")
    payload = _json_argument(data)
    with _queue(queue, redis_url) as client:
        options: dict[str, Any] = {"task": task_name, "id": task_id, "max_attempts": max_attempts,
                                   "timeout": timeout, "result_ttl": result_ttl}  # fmt: skip
        if at is not None:
            click.echo(client.schedule_task(at, payload, **options))
        else:
            assert delay is not None
            click.echo(client.schedule_in(delay, payload, **options))


def _json_argument(data: str) -> Any:
    try:
        return json.loads(data, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, RecursionError) as error:
        raise click.BadParameter(f"not valid JSON: {error}", param_hint="DATA") from None
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="DATA") from None


def _refuse_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity, which are not JSON and not portable data.
    raise ValueError(f"not valid JSON: {name} is not a JSON value")


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


@main.command()
@queue_option
@click.argument("task_id")
@redis_option
@_guarded
def status(queue: str, task_id: str, redis_url: str | None) -> None:
    """Show where a task is and its last error."""
    with _queue(queue, redis_url) as client:
        found = client.status(task_id)
        if found is None:
            raise client.core.not_found(task_id)
    click.echo(json.dumps(_asdict(found), default=str, indent=2))


def _asdict(value: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(value)


@main.command()
@queue_option
@click.argument("task_id")
@redis_option
@_guarded
def cancel(queue: str, task_id: str, redis_url: str | None) -> None:
    """Cancel a task that has not started (or is dead)."""
    with _queue(queue, redis_url) as client:
        if not client.cancel(task_id):
            raise TaskNotFoundError(f"no live task {task_id!r} in queue {queue!r}")
    click.echo(f"cancelled {task_id}")


@main.command()
@queue_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--check", is_flag=True, help="Verify the invariants; exit 1 on any violation.")
@redis_option
@_guarded
def inspect(queue: str, as_json: bool, check: bool, redis_url: str | None) -> None:
    """Counts per state, next due time, live workers, counters; --check verifies invariants.

    \b
    Example:
      duetime inspect --queue emails --check
    """
    with _queue(queue, redis_url) as client:
        stats = client.stats()
        violations = client.check() if check else []
    report = _asdict(stats)
    if check:
        report["violations"] = [str(v) for v in violations]
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        table = Table(title=f"queue {queue}", show_header=False)
        for state in ("scheduled", "ready", "running", "dead"):
            table.add_row(state, str(report[state]))
        table.add_row("next due", _when(stats.next_due))
        for index, shard in enumerate(stats.shards):
            table.add_row(
                f"shard {index}",
                f"{shard.scheduled} scheduled, {shard.ready} ready, {shard.running} running, "
                f"{shard.dead} dead ({shard.queue})",
            )
        for worker_id, age in sorted(stats.workers.items()):
            table.add_row("worker", f"{worker_id} (heartbeat {age:.1f}s ago)")
        for name, value in sorted(stats.counters.items()):
            table.add_row(f"total {name}", str(value))
        console.print(table)
        if check:
            if violations:
                for violation in violations:
                    console.print("[red]violation[/red] ", end="", highlight=False)
                    console.print(_shown(str(violation)), markup=False, highlight=False)
            else:
                console.print("[green]invariants hold[/green]")
    if violations:
        sys.exit(EXIT_VIOLATIONS)


# --- dead letters ----------------------------------------------------------------------


@main.group()
def dead() -> None:
    """List, show, requeue or purge dead tasks."""


@dead.command("list")
@queue_option
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True)
@redis_option
@_guarded
def dead_list(queue: str, limit: int, as_json: bool, redis_url: str | None) -> None:
    """The most recent dead tasks."""
    with _queue(queue, redis_url) as client:
        entries = client.dead_tasks(limit)
    if as_json:
        click.echo(json.dumps([_asdict(e) for e in entries], default=str, indent=2))
        return
    table = Table("id", "died", "task", "attempts", "error")
    for entry in entries:
        table.add_row(
            entry.id,
            _when(entry.died_at),
            entry.task or "(default)",
            str(entry.attempts),
            entry.error,
        )
    console.print(table)


@dead.command("show")
@queue_option
@click.argument("task_id")
@redis_option
@_guarded
def dead_show(queue: str, task_id: str, redis_url: str | None) -> None:
    """A dead task's data, error and traceback."""
    with _queue(queue, redis_url) as client:
        found = client.status(task_id)
    if found is None or found.state != TaskState.DEAD:
        raise TaskNotFoundError(f"no dead task {task_id!r} in queue {queue!r}")
    click.echo(json.dumps(_asdict(found), default=str, indent=2))


@dead.command("requeue")
@queue_option
@click.argument("task_ids", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Requeue every dead task.")
@redis_option
@_guarded
def dead_requeue(
    queue: str, task_ids: tuple[str, ...], everything: bool, redis_url: str | None
) -> None:
    """Give dead tasks a fresh set of attempts, due now."""
    if not task_ids and not everything:
        raise click.UsageError("name task ids or pass --all")
    with _queue(queue, redis_url) as client:
        count = client.requeue_dead(None if everything else list(task_ids))
    click.echo(f"requeued {count}")


@dead.command("purge")
@queue_option
@click.argument("task_ids", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Purge every dead task.")
@redis_option
@_guarded
def dead_purge(
    queue: str, task_ids: tuple[str, ...], everything: bool, redis_url: str | None
) -> None:
    """Delete dead tasks for good."""
    if not task_ids and not everything:
        raise click.UsageError("name task ids or pass --all")
    with _queue(queue, redis_url) as client:
        count = client.purge_dead(None if everything else list(task_ids))
    click.echo(f"purged {count}")


# --- cron ------------------------------------------------------------------------------


@main.group(name="cron")
def cron_group() -> None:
    """Recurring jobs: add, list, pause, resume, remove.

    \b
    Example:
      duetime cron add -q reports daily-report '0 9 * * *' '{"kind": "daily"}' \\
          --tz Europe/Paris --task send_report
    """


@cron_group.command("add")
@queue_option
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
@click.option("--timeout", type=float)
@redis_option
@_guarded
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
) -> None:
    """Create or update the cron job NAME firing EXPRESSION with the JSON document DATA."""
    payload = _json_argument(data)
    with _queue(queue, redis_url) as client:
        outcome = client.add_cron(
            name, expression, payload, tz=tz, task=task_name, missed=missed, overlap=overlap,
            max_attempts=max_attempts, timeout=timeout,
        )  # fmt: skip
    click.echo(f"{outcome} {name}")


@cron_group.command("list")
@queue_option
@click.option("--json", "as_json", is_flag=True)
@click.option("--upcoming", default=3, show_default=True, type=click.IntRange(1, 100))
@redis_option
@_guarded
def cron_list(queue: str, as_json: bool, upcoming: int, redis_url: str | None) -> None:
    """Every cron job with its policies, next fire times and last run."""
    with _queue(queue, redis_url) as client:
        jobs = client.list_cron(upcoming)
    if as_json:
        click.echo(json.dumps([_asdict(job) for job in jobs], default=str, indent=2))
        return
    table = Table("name", "expression", "tz", "missed", "overlap", "next", "last run")
    for job in jobs:
        upcoming_text = "paused" if job.paused else "\n".join(_when(t) for t in job.next_runs)
        if job.problem is not None:
            upcoming_text = f"unusable here ({'paused' if job.paused else 'due'}): {job.problem}"
        last = "-"
        if job.last_run is not None:
            run = job.last_run
            outcome = {True: "ok", False: "failed", None: run.state}[run.succeeded]
            late = "" if run.lateness_ms is None else f", {run.lateness_ms:.0f} ms late"
            last = f"{_when(run.tick)} {outcome}{late}"
        table.add_row(job.name, job.expression, job.timezone, job.missed, job.overlap,
                      upcoming_text, last)  # fmt: skip
    console.print(table)


def _cron_switch(verb: str, paused: bool, summary: str) -> None:
    """Register ``duetime cron pause`` or ``resume`` (one body, two verbs)."""

    @cron_group.command(verb, help=summary)
    @queue_option
    @click.argument("name")
    @redis_option
    @_guarded
    def command(queue: str, name: str, redis_url: str | None) -> None:
        with _queue(queue, redis_url) as client:
            if paused:
                client.pause_cron(name)
            else:
                client.resume_cron(name)
        click.echo(f"{verb}d {name}")


_cron_switch("pause", True, "Stop firing NAME until resumed.")
_cron_switch("resume", False, "Fire NAME again from its next tick after now.")


@cron_group.command("remove")
@queue_option
@click.argument("name")
@redis_option
@_guarded
def cron_remove(queue: str, name: str, redis_url: str | None) -> None:
    """Forget NAME (ticks already enqueued still run)."""
    with _queue(queue, redis_url) as client:
        if not client.remove_cron(name):
            raise TaskNotFoundError(f"no cron job {name!r} in queue {queue!r}")
    click.echo(f"removed {name}")


# --- embedded server -------------------------------------------------------------------


@main.group()
def server() -> None:
    """The embedded Valkey server used when no Redis URL is given."""


@server.command("start")
@_guarded
def server_start() -> None:
    """Start the embedded server (or report the running one)."""
    _redis_url(None)


@server.command("stop")
@_guarded
def server_stop() -> None:
    """Stop the embedded server; its data stays on disk."""
    from duetime.embedded import stop_server

    click.echo("stopped" if stop_server() else "not running")
