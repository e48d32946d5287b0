"""The ``duetime`` command: run the daemons, schedule, inspect and repair queues.

Exit codes: 0 success; 1 the invariant check found violations; 2 usage error (bad
option, setting or app); 3 Redis unavailable (or, for ``server status``, the embedded
server is not running); 4 no such task; 5 any other duetime error; 6 a daemon gave up
after a part of it kept failing (restart it); 7 a destructive action was not confirmed
(nothing changed).

Times are shown in this host's local zone (cron times in their job's zone), or in UTC
with ``duetime --utc``; JSON output keeps epoch seconds, except ``status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import itertools
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column
from rich.table import Table as RichTable
from rich.text import Text as RichText

from duetime import CronInfo, DeadTask, TaskStatus, TaskSummary, startup, times, validation
from duetime.app import App
from duetime.client import Queue, known_queues, selection
from duetime.dispatcher import Dispatcher
from duetime.errors import (
    ConfigurationError,
    DaemonFailedError,
    DuetimeError,
    InvalidInputError,
    RedisUnavailableError,
    TaskNotFoundError,
)
from duetime.settings import Settings
from duetime.states import TaskState
from duetime.store.runner import mask_urls_in
from duetime.worker import DEFAULT_CONCURRENCY, Worker

EXIT_OK = 0
EXIT_VIOLATIONS = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_NOT_FOUND = 4
EXIT_ERROR = 5
EXIT_DAEMON_FAILED = 6
EXIT_DECLINED = 7


class Table(RichTable):
    """A rich table that reads well in 80 columns, whose cells are shown safely: an id or
    name read from Redis that is not UTF-8 (written by hand) is escaped, not a crash, and
    never taken as markup.

    The cells of the columns named in ``one_line`` stay on one line, cut with an
    ellipsis when space is short (ids, error text); a ``no_wrap`` column is never
    narrowed (times): rich takes the room from the other columns.
    """

    def __init__(
        self, *headers: str | Column, one_line: Sequence[str] = (), **options: Any
    ) -> None:
        options.setdefault("box", box.SIMPLE_HEAD)  # no side borders: room for the text
        options.setdefault("show_edge", False)
        options.setdefault("pad_edge", False)
        options.setdefault("collapse_padding", True)
        super().__init__(*headers, **options)
        self.one_line = {i for i, c in enumerate(self.columns) if c.header in one_line}

    def add_row(self, *cells: Any, **options: Any) -> None:
        shown = []
        for index, cell in enumerate(cells):
            text = RichText(_shown(str(cell)))
            if index in self.one_line:
                text.no_wrap, text.overflow = True, "ellipsis"
            shown.append(text)
        super().add_row(*shown, **options)


def _shown(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _stdout() -> Console:
    # Made per use, not at import: it reads $COLUMNS and the stream of the moment.
    return Console()


def _stderr() -> Console:
    return Console(stderr=True)


log = logging.getLogger("duetime")


def _fail(message: str, code: int) -> NoReturn:
    errors = _stderr()
    errors.print("[red]error:[/red] ", end="", highlight=False)
    errors.print(_shown(message), markup=False, highlight=False)  # user text is not markup
    sys.exit(code)


def _say(message: str) -> None:
    """A remark for the person at the terminal, on stderr (stdout stays for results)."""
    _stderr().print(_shown(message), markup=False, highlight=False)


def _settings() -> Settings:
    """Settings for this command: defaults, overridden by $DUETIME_<FIELD> variables,
    then by the command's own options (--metrics-port)."""
    settings = Settings.from_env()
    context = click.get_current_context(silent=True)
    port = None if context is None else context.meta.get("duetime.metrics_port")
    return settings if port is None else settings.replace(metrics_port=port)


def _queue(name: str, redis_url: str | None) -> Queue:
    return Queue(name, _redis_url(redis_url), settings=_settings(), shards=_shards())


def _redis_url(redis_url: str | None) -> str:
    """The URL to use; with none given, attach to the embedded server (logged at debug), or start
    it (said on stderr: it takes a moment, and it was perhaps stopped on purpose)."""
    if redis_url:
        return redis_url
    from duetime.embedded import ensure_server

    server = ensure_server(on_start=_say_starting)
    # Debug only: a client command should print its answer, not which server it used
    # (`duetime server status` says; daemons name the server in their banner).
    log.debug("%s", server.describe())
    return server.url


def _say_starting(directory: Path) -> None:
    _say(f"duetime: starting the embedded server (data in {directory}) ...")


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
            _fail(mask_urls_in(str(error)), EXIT_ERROR)

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


_metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    expose_value=False,
    callback=lambda context, _, value: context.meta.__setitem__("duetime.metrics_port", value),
    help="Serve Prometheus metrics on this port (or $DUETIME_METRICS_PORT); 0: none.",
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


_concurrency_option = click.option(
    "--concurrency",
    "-c",
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Tasks run at once by each worker.",
)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
        stream=sys.stderr,
    )


if TYPE_CHECKING:
    _FloatParam = click.ParamType[float]
else:  # click before 8.4 has no generic ParamType
    _FloatParam = click.ParamType


class _Parsed(_FloatParam):
    """An option value read by one of the ``duetime.times`` parsers; what they refuse
    is a usage error (exit 2) whose message says what to write."""

    def __init__(self, name: str, parse: Callable[[str], float]) -> None:
        self.name = name
        self.parse = parse

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):  # a default, already read
            return value
        try:
            return self.parse(str(value))
        except InvalidInputError as error:
            self.fail(str(error), param, ctx)


DURATION = _Parsed("duration", times.parse_duration)
TIME = _Parsed("time", times.parse_time)
# "2h" is two hours before the moment the option is read.
MOMENT = _Parsed("time", lambda text: times.parse_moment(text, time.time()))


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


def _zone(preferred: tzinfo | None = None) -> tzinfo | None:
    """The zone to show times in: UTC under --utc, else ``preferred`` (a cron job's
    zone), else None: this host's local zone."""
    context = click.get_current_context(silent=True)
    if context is not None and context.meta.get("duetime.utc"):
        return UTC
    return preferred


def _when(seconds: float | None, zone: tzinfo | None = None) -> str:
    return times.format_time(seconds, _zone(zone))


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
        log.critical("%s", mask_urls_in(str(error)))
        return EXIT_ERROR
    log.critical("a daemon failed", exc_info=error)
    return EXIT_DAEMON_FAILED


@main.command()
@queues_option
@_metrics_port_option
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
    startup.banner("dispatcher", queues, url, settings, shards=_shards())
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
@_concurrency_option
@click.option(
    "--processes",
    "-p",
    default=1,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Fork this many worker processes (for CPU-bound handlers).",
)
@_metrics_port_option
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
    details = [f"concurrency {concurrency} per queue", f"{processes} process(es)"]
    startup.banner("worker", queues, url, settings, shards=_shards(), details=details)

    shards = _shards()

    def child(slot: int) -> None:
        # Each forked process serves its metrics on a port of its own: the given one + slot.
        port = settings.metrics_port and settings.metrics_port + slot
        own = settings.replace(metrics_port=port) if port <= 65535 else settings
        _run_daemons(_workers(app, queues, url, concurrency, own, shards))

    if processes == 1:
        child(0)
    else:
        _fork_workers(processes, child)


def _fork_workers(processes: int, child_main: Callable[[int], None]) -> None:
    """Fork worker processes, forward signals to them and restart any that crash;
    ``child_main`` gets the child's slot, 0 to ``processes`` - 1 (kept across restarts)."""
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
                child_main(slot)
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
@_concurrency_option
@_metrics_port_option
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
    details = [f"concurrency {concurrency} per queue"]
    startup.banner("dispatcher + worker", queues, url, settings, shards=_shards(), details=details)
    _run_daemons(
        [
            Dispatcher(list(queues), url, settings=settings, shards=_shards()),
            *_workers(app, queues, url, concurrency, settings, _shards()),
        ]
    )


# --- client commands -----------------------------------------------------------------


@main.command()
@queue_option
@click.option(
    "--at",
    "at",
    type=TIME,
    metavar="TIME",
    help="Run at this time: ISO 8601 with a zone (2026-12-01T09:00+01:00, ...Z) or epoch seconds.",
)
@click.option(
    "--in",
    "delay",
    type=DURATION,
    metavar="DURATION",
    help="Run this long from now: 90s, 5m, 1h30m, 1.5h, 2d, or seconds.",
)
@click.option("--id", "task_id", help="Task id (idempotent: the same id twice is one task).")
@click.option("--task", "task_name", help="Registered handler name (default: the default handler).")
@click.option("--max-attempts", type=int)
@click.option(
    "--timeout", type=DURATION, metavar="DURATION", help="How long one attempt may run (30s, 5m)."
)
@click.option("--result-ttl", type=DURATION, metavar="DURATION", help="Keep the result this long.")
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
      duetime schedule --queue emails --in 1h30m '{"to": "a@example.com"}'
      duetime schedule --queue emails --at 2026-12-01T09:00+01:00 --id welcome-42 \
          --task send '{}'
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


@main.command()
@queue_option
@click.argument("task_id")
@redis_option
@_guarded
def status(queue: str, task_id: str, redis_url: str | None) -> None:
    """Show where a task is and its last error, as JSON (times in ISO 8601, local zone
    or UTC with --utc)."""
    _show_status(queue, task_id, redis_url)


def _show_status(queue: str, task_id: str, redis_url: str | None) -> None:
    with _queue(queue, redis_url) as client:
        found = client.status(task_id)
        if found is None:
            raise client.core.not_found(task_id)
    _print_status(found)


_STATUS_TIMES = ("run_at", "died_at", "finished_at")


def _print_status(found: TaskStatus) -> None:
    report = _asdict(found)
    for name in _STATUS_TIMES:
        if report.get(name) is not None:
            report[name] = times.format_time(report[name], _zone(), precise=True)
    click.echo(json.dumps(report, default=str, indent=2))


def _asdict(value: Any) -> dict[str, Any]:
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
        console = _stdout()
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


# --- browsing and steering --------------------------------------------------------------


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@redis_option
@_guarded
def queues(as_json: bool, redis_url: str | None) -> None:
    """The queues dispatchers have served on this server, with their depths.

    A queue is listed once a dispatcher has started for it (each notes its queues).
    """
    url = _redis_url(redis_url)
    settings = _settings()
    rows = []
    for known in known_queues(url, settings):
        with Queue(known.name, url, settings=settings, shards=known.shards) as client:
            stats = client.stats()
        rows.append((known, stats))
    if as_json:
        report = [
            {"queue": known.name, "shards": known.shards, "seen": known.seen_ms / 1000,
             "scheduled": stats.scheduled, "ready": stats.ready, "running": stats.running,
             "dead": stats.dead, "paused": stats.paused, "workers": len(stats.workers)}
            for known, stats in rows
        ]  # fmt: skip
        click.echo(json.dumps(report, indent=2))
        return
    table = Table(
        "queue", Column("sched.", justify="right"), Column("ready", justify="right"),
        Column("running", justify="right"), Column("dead", justify="right"),
        Column("workers", justify="right"), "state", one_line=("queue",),
    )  # fmt: skip
    for known, stats in rows:
        name = known.name if known.shards == 1 else f"{known.name} ({known.shards} shards)"
        table.add_row(
            name, str(stats.scheduled), str(stats.ready), str(stats.running), str(stats.dead),
            str(len(stats.workers)), "paused" if stats.paused else "active",
        )  # fmt: skip
    _stdout().print(table)


@main.command()
@queue_option
@click.option(
    "--state",
    type=click.Choice(["scheduled", "ready", "running", "dead"]),
    default="scheduled",
    show_default=True,
)
@click.option("--task", "task_filter", metavar="NAME", help="Only tasks of this handler.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON (times in epoch seconds).")
@redis_option
@_guarded
def tasks(
    queue: str,
    state: str,
    task_filter: str | None,
    limit: int,
    as_json: bool,
    redis_url: str | None,
) -> None:
    """Tasks in one state, in the order they will be served (dead: latest first).

    \b
    Example:
      duetime tasks -q emails --state running
    """
    wanted = None if task_filter is None else _handler_name(task_filter)
    with _queue(queue, redis_url) as client:
        found: list[TaskSummary] = []
        offset = 0
        while len(found) < limit:  # a --task filter pages on until enough are found
            page = client.tasks(state, limit=TASK_PAGE, offset=offset)
            found += [t for t in page if wanted is None or t.task == wanted]
            if len(page) < TASK_PAGE or offset >= MOST_TASKS_SCANNED:
                break
            offset += TASK_PAGE
    found = found[:limit]
    if as_json:
        click.echo(json.dumps([_asdict(t) for t in found], default=str, indent=2))
        return
    when = {"scheduled": "run at", "ready": "due since", "running": "lease until",
            "dead": "died"}[state]  # fmt: skip
    table = Table(
        "id", Column(when, no_wrap=True), "task", Column("att.", justify="right"),
        "worker" if state == "running" else "error", one_line=("id", "task", "error", "worker"),
    )  # fmt: skip
    for task in found:
        moment = {"running": task.lease_deadline, "dead": task.died_at}.get(state, task.run_at)
        last = task.worker if state == "running" else (task.error or task.problem or "")
        table.add_row(
            task.id, _when(moment), task.task or DEFAULT_HANDLER_SHOWN, str(task.attempts),
            (last or "").splitlines()[0] if last else "",
        )  # fmt: skip
    _stdout().print(table)


#: ``duetime tasks --task``: tasks read per page, and how far a filtered listing reads.
TASK_PAGE = 500
MOST_TASKS_SCANNED = 100_000


def _handler_name(shown: str) -> str:
    return "" if shown == DEFAULT_HANDLER_SHOWN else shown


@main.group()
def task() -> None:
    """One task: show it, or run it now."""


@task.command("show")
@queue_option
@click.argument("task_id")
@redis_option
@_guarded
def task_show(queue: str, task_id: str, redis_url: str | None) -> None:
    """Everything known of a task, as JSON (the same as `duetime status`)."""
    _show_status(queue, task_id, redis_url)


@main.command("run-now")
@queue_option
@click.argument("task_id")
@redis_option
@_guarded
def run_now(queue: str, task_id: str, redis_url: str | None) -> None:
    """Make a scheduled task (delayed, or waiting to retry) due now."""
    with _queue(queue, redis_url) as client:
        client.run_now(task_id)
    click.echo(f"{task_id} is due now")


def _queue_switch(verb: str, paused: bool, summary: str) -> None:
    @main.command(verb, help=summary)
    @click.argument("queue_name", metavar="QUEUE")
    @_shards_option
    @redis_option
    @_guarded
    def switch(queue_name: str, redis_url: str | None) -> None:
        with _queue(queue_name, redis_url) as client:
            changed = client.pause() if paused else client.resume()
        state = "paused" if paused else "resumed"
        click.echo(f"{queue_name} {state}" if changed else f"{queue_name} was already {state}")


_queue_switch(
    "pause", True,
    "Workers stop claiming from QUEUE (running tasks finish); scheduling and promotion go on.",
)  # fmt: skip
_queue_switch("resume", False, "Workers claim from QUEUE again, at once.")


@main.command()
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
@redis_option
@_guarded
def dashboard(
    queues: tuple[str, ...],
    host: str,
    port: int,
    token: str | None,
    basic_auth: str | None,
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
    settings = _settings()
    url = _redis_url(redis_url)
    startup.banner("dashboard", queues, url, settings, shards=_shards(),
                   details=[f"http://{host}:{port}/"])  # fmt: skip
    serve(
        list(queues), url, host=host, port=port, shards=_shards(), settings=settings,
        token=token, basic_auth=basic_auth,
        log_level=logging.getLevelName(logging.getLogger().level).lower(),
    )  # fmt: skip


# --- dead letters ----------------------------------------------------------------------

#: How the default handler (task name "") is shown, and may be named to --task.
DEFAULT_HANDLER_SHOWN = "(default)"


@main.group()
def dead() -> None:
    """List, show, requeue or purge dead tasks, chosen by id or by filters.

    \b
    Examples:
      duetime dead list -q emails --error timeout --since 2h
      duetime dead requeue -q emails --task send_email --since 2026-12-01T09:00Z --dry-run
      duetime dead purge -q emails --until 2d --yes
    """


def dead_filter_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """--task, --error, --since and --until, shared by every dead command that chooses."""
    options = (
        click.option(
            "--task",
            "task_filter",
            metavar="NAME",
            help=f"Only tasks of this handler ('{DEFAULT_HANDLER_SHOWN}' for the default one).",
        ),
        click.option(
            "--error",
            "error_filter",
            metavar="TEXT",
            help="Only tasks whose last error contains TEXT (in any case).",
        ),
        click.option(
            "--since",
            type=MOMENT,
            metavar="TIME",
            help="Only tasks that died at or after TIME: ISO 8601 with a zone, or a time "
            "ago (30m, 2h, 1d).",
        ),
        click.option(
            "--until",
            type=MOMENT,
            metavar="TIME",
            help="Only tasks that died at or before TIME (the same forms).",
        ),
    )
    for option in reversed(options):
        function = option(function)
    return function


def _dead_filter(
    task: str | None, error: str | None, since: float | None, until: float | None
) -> selection.DeadFilter:
    if task == DEFAULT_HANDLER_SHOWN:
        task = ""
    return selection.DeadFilter(task=task, error=error, since=since, until=until)


def _dead_table(entries: Sequence[DeadTask]) -> Table:
    table = Table(
        "id",
        Column("died", no_wrap=True),
        "task",
        Column("attempts", justify="right"),
        "error",
        one_line=("id", "task", "error"),
    )
    for entry in entries:
        error = entry.error.splitlines()[0] if entry.error else ""
        table.add_row(
            entry.id,
            _when(entry.died_at),
            entry.task or DEFAULT_HANDLER_SHOWN,
            str(entry.attempts),
            error,
        )
    return table


@dead.command("list")
@queue_option
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Show at most this many, the most recent first.",
)
@dead_filter_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON (times in epoch seconds).")
@redis_option
@_guarded
def dead_list(
    queue: str,
    limit: int,
    task_filter: str | None,
    error_filter: str | None,
    since: float | None,
    until: float | None,
    as_json: bool,
    redis_url: str | None,
) -> None:
    """The most recent dead tasks, those that match the filters given."""
    chosen = _dead_filter(task_filter, error_filter, since, until)
    # Unfiltered, one call reads exactly what is shown.
    page_size = limit if chosen.selects_everything else max(limit, selection.PAGE_SIZE)
    with _queue(queue, redis_url) as client:
        found = selection.dead_matching(client, chosen, page_size=page_size)
        entries = list(itertools.islice(found, limit))
    if as_json:
        click.echo(json.dumps([_asdict(e) for e in entries], default=str, indent=2))
        return
    _stdout().print(_dead_table(entries))


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
    _print_status(found)


@contextlib.contextmanager
def _progress() -> Iterator[Progress]:
    """A progress bar on stderr for a person watching; hidden when stderr is not a
    terminal (a log file, a pipe), where it would be noise."""
    errors = _stderr()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(
        *columns,
        TimeElapsedColumn(),
        console=errors,
        transient=True,
        disable=not errors.is_terminal,
    ) as progress:
        yield progress


def _dead_action(verb: str, summary: str) -> None:
    """Register ``duetime dead requeue`` or ``purge`` (one body, two verbs)."""

    @dead.command(verb, help=summary)
    @queue_option
    @click.argument("task_ids", nargs=-1)
    @click.option(
        "--all", "everything", is_flag=True, help="Every dead task (the filters narrow it)."
    )
    @dead_filter_options
    @click.option(
        "--dry-run", is_flag=True, help="Say how many and which it would take; change nothing."
    )
    @click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
    @click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
    @click.option(
        "--batch-size",
        default=selection.BATCH_SIZE,
        show_default=True,
        type=click.IntRange(1, 10_000),
        help="Dead tasks read, and ids acted on, per call to the server.",
    )
    @redis_option
    @_guarded
    def command(
        queue: str,
        task_ids: tuple[str, ...],
        everything: bool,
        task_filter: str | None,
        error_filter: str | None,
        since: float | None,
        until: float | None,
        dry_run: bool,
        yes: bool,
        as_json: bool,
        batch_size: int,
        redis_url: str | None,
    ) -> None:
        chosen = _dead_filter(task_filter, error_filter, since, until)
        ids = validation.task_ids(list(task_ids))
        if ids and everything:
            raise click.UsageError("give task ids or --all, not both")
        if not ids and not everything and chosen.selects_everything:
            raise click.UsageError(
                "name task ids, pass --all, or choose with --task, --error, --since or --until"
            )
        _act_on_dead(
            _DeadRequest(verb, queue, ids, chosen, dry_run, yes, as_json, batch_size),
            redis_url,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _DeadRequest:
    verb: str  # requeue | purge
    queue: str
    ids: list[str]  # the ids named, if any
    chosen: selection.DeadFilter  # without the ids
    dry_run: bool
    yes: bool
    as_json: bool
    batch_size: int

    @property
    def past(self) -> str:
        return f"{self.verb}d"

    @property
    def destructive(self) -> bool:
        """Asks for confirmation: a purge always, a requeue of every dead task."""
        return self.verb == "purge" or (not self.ids and self.chosen.selects_everything)


def _act_on_dead(request: _DeadRequest, redis_url: str | None) -> None:
    """Choose the dead tasks (every matching id first, since acting while paging would
    shift the pages), confirm, then act on them in batches."""
    with _queue(request.queue, redis_url) as client:
        if request.ids and request.chosen.selects_everything and not request.dry_run:
            # Named ids need no scan: the server ignores those that are not dead.
            picked = selection.DeadSelection(request.ids, [])
        else:
            chosen = request.chosen
            if request.ids:
                chosen = dataclasses.replace(chosen, ids=frozenset(request.ids))
            with _progress() as progress:
                reading = progress.add_task("reading dead tasks", total=None)
                picked = selection.select_dead(
                    client,
                    chosen,
                    page_size=request.batch_size,
                    on_page=lambda count: progress.advance(reading, count),
                )
        if picked.unnameable:
            _say(
                f"duetime: {picked.unnameable:,} matching dead task(s) have ids duetime does "
                "not accept (written by hand?) and are left alone"
            )
        if request.dry_run:
            _report_dead(request, picked, None)
            return
        if picked.ids and request.destructive and not request.yes:
            _confirm(request, picked)
        action = client.purge_dead if request.verb == "purge" else client.requeue_dead
        with _progress() as progress:
            acting = progress.add_task(f"{request.verb[:-1]}ing", total=len(picked.ids))
            done = selection.in_batches(
                picked.ids,
                action,
                batch_size=request.batch_size,
                on_batch=lambda count: progress.advance(acting, count),
            )
    _report_dead(request, picked, done)


def _confirm(request: _DeadRequest, picked: selection.DeadSelection) -> None:
    count = len(picked.ids)
    how_many = f"{'up to ' if not picked.sample and request.ids else ''}{count:,}"
    question = (
        f"{request.verb.capitalize()} {how_many} dead task{'' if count == 1 else 's'} "
        f"in queue {request.queue}{' for good' if request.verb == 'purge' else ''}?"
    )
    try:
        agreed = click.confirm(question, default=False, err=True)
    except click.Abort:  # no answer: end of input (not a terminal), or Ctrl-C
        agreed = False
    if not sys.stdin.isatty():
        click.echo(err=True)  # an answer read from a pipe is not echoed, nor its newline
    if not agreed:
        _fail(
            f"not confirmed, nothing {request.past}; pass --yes to skip the question",
            EXIT_DECLINED,
        )


#: Dead tasks a dry run shows in its table (--json lists every id).
_DRY_RUN_SHOWN = 20


def _report_dead(request: _DeadRequest, picked: selection.DeadSelection, done: int | None) -> None:
    """The outcome: ``done`` tasks acted on, or None for a dry run."""
    if request.as_json:
        report: dict[str, Any] = {"queue": request.queue, "action": request.verb}
        report |= {"dry_run": done is None, "selected": len(picked.ids)}
        if done is not None:
            report[request.past] = done
        report |= {"skipped": picked.unnameable, "ids": picked.ids}
        click.echo(json.dumps(report, indent=2))
    elif done is not None:
        click.echo(f"{request.past} {done}")
    else:
        count = len(picked.ids)
        plural = "" if count == 1 else "s"
        click.echo(f"would {request.verb} {count:,} dead task{plural} in queue {request.queue}")
        if picked.sample:
            _stdout().print(_dead_table(picked.sample[:_DRY_RUN_SHOWN]))
        if count > _DRY_RUN_SHOWN:
            click.echo(f"... and {count - _DRY_RUN_SHOWN:,} more (--json lists every id)")


_dead_action(
    "requeue",
    """Give dead tasks a fresh set of attempts, due now: the TASK_IDS named, or those
    the filters choose, or --all (which asks first; --yes does not).

    \b
    Examples:
      duetime dead requeue -q emails --error timeout --since 2h --dry-run
      duetime dead requeue -q emails --task send_email --since 2026-12-01T09:00+01:00
      duetime dead requeue -q emails --all --yes
    """,
)
_dead_action(
    "purge",
    """Delete dead tasks for good: the TASK_IDS named, or those the filters choose, or
    --all. Asks first; --yes does not.

    \b
    Examples:
      duetime dead purge -q emails --until 2d --dry-run
      duetime dead purge -q emails --task old_handler --yes --json
    """,
)


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
@click.option(
    "--timeout", type=DURATION, metavar="DURATION", help="How long one attempt may run (30s, 5m)."
)
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
@click.option("--json", "as_json", is_flag=True, help="Print JSON (times in epoch seconds).")
@click.option("--upcoming", default=3, show_default=True, type=click.IntRange(1, 100))
@redis_option
@_guarded
def cron_list(queue: str, as_json: bool, upcoming: int, redis_url: str | None) -> None:
    """Every cron job with its policies, next fire times and last run, in the job's
    own zone (in UTC with duetime --utc)."""
    with _queue(queue, redis_url) as client:
        jobs = client.list_cron(upcoming)
    if as_json:
        click.echo(json.dumps([_asdict(job) for job in jobs], default=str, indent=2))
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
    _stdout().print(table)


def _cron_cells(job: CronInfo) -> tuple[str, str, str]:
    """The schedule, next and last-run cells of one cron job."""
    if job.problem is not None:
        state = "paused" if job.paused else "due"
        return f"unusable here ({state}): {job.problem}", "-", "-"
    zone = _job_zone(job.timezone)
    schedule_text = f"{job.expression}\n{job.timezone}\nmissed {job.missed}, overlap {job.overlap}"
    upcoming_text = "paused" if job.paused else "\n".join(_when(t, zone) for t in job.next_runs)
    last = "-"
    if job.last_run is not None:
        run = job.last_run
        outcome = {True: "ok", False: "failed", None: run.state}[run.succeeded]
        late = ""
        if run.lateness_ms is not None:
            late = f", {times.format_duration(run.lateness_ms / 1000)} late"
        last = f"{_when(run.tick, zone)}\n{outcome}{late}"
    return schedule_text, upcoming_text, last


def _job_zone(name: str) -> tzinfo | None:
    """A cron job's zone, to show its times in; None (local) if this host lacks it."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


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
    """The embedded Valkey server used when no Redis URL is given.

    \b
    Examples:
      duetime server status
      duetime server stop
    """


@server.command("start")
@_guarded
def server_start() -> None:
    """Start the embedded server (or report the running one)."""
    from duetime.embedded import ensure_server

    started = ensure_server(on_start=_say_starting)
    click.echo(started.describe())


@server.command("stop")
@_guarded
def server_stop() -> None:
    """Stop the embedded server; its data stays on disk."""
    from duetime.embedded import stop_server

    click.echo("stopped" if stop_server() else "not running")


@server.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (memory in bytes).")
@_guarded
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
            report |= _asdict(found)
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
        _stdout().print(table)
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
